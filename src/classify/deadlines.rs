//! The deadline each call gets: the classifier writes it into the request as a
//! [`Deadline`](crate::extensions::Deadline), from these settings (`[deadlines]`).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::ConfigError;

/// Per-tool deadlines, in milliseconds in config. Absent: no deadline.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct DeadlineConfig {
    /// The deadline of tools not listed (`default_ms`). Absent: none.
    #[serde(rename = "default_ms", with = "crate::duration_ms::opt")]
    pub default: Option<Duration>,
    /// Deadline per tool, milliseconds.
    pub tools_ms: BTreeMap<String, u64>,
}

impl DeadlineConfig {
    /// The deadline of one call of `tool`.
    pub fn for_tool(&self, tool: &str) -> Option<Duration> {
        self.tools_ms
            .get(tool)
            .map(|ms| Duration::from_millis(*ms))
            .or(self.default)
    }

    /// Checks every rule; the error names the field and the rule.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.default.is_some_and(|d| d.is_zero()) {
            return Err(ConfigError::new(
                "deadlines.default_ms",
                "must be greater than 0",
            ));
        }
        if let Some((tool, _)) = self.tools_ms.iter().find(|(_, ms)| **ms == 0) {
            return Err(ConfigError::new(
                format!("deadlines.tools_ms.{tool}"),
                "must be greater than 0",
            ));
        }
        Ok(())
    }
}
