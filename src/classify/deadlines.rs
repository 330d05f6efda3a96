//! The deadline each call gets: the classifier writes it into the request as a
//! [`Deadline`](crate::extensions::Deadline), from these settings (`[deadlines]`).

use crate::valid::NonZeroDuration;
use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Per-tool deadlines, in milliseconds in config. Absent: no deadline.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct DeadlineConfig {
    /// The deadline of tools not listed (`default_ms`). Absent: none.
    #[serde(rename = "default_ms")]
    pub default: Option<NonZeroDuration>,
    /// Deadline per tool (`tools_ms`, milliseconds).
    #[serde(rename = "tools_ms")]
    pub tools: BTreeMap<String, NonZeroDuration>,
}

impl DeadlineConfig {
    /// The deadline of one call of `tool`.
    pub fn for_tool(&self, tool: &str) -> Option<Duration> {
        self.tools
            .get(tool)
            .or(self.default.as_ref())
            .map(|d| d.get())
    }
}
