//! The FIFO limiter's configuration, as it appears in a config file.

use std::collections::BTreeMap;
use std::num::NonZeroUsize;

use serde::{Deserialize, Serialize};

use super::{DEFAULT_MAX_KEYS, FifoLimitLayer, ResourceLimiter, ResourceLimits};
use crate::call::Name;

/// Every setting of the FIFO limiter. Deserializes from the `[fifo]` table of a config file:
///
/// ```
/// use stormgate::fifo::FifoConfig;
///
/// let config: FifoConfig = serde_json::from_str(r#"{
///     "tools": {"sql_scan": "db"},
///     "keys": {"db": {"max_concurrent": 4, "max_queue_depth": 8, "queue_timeout_ms": 2000}}
/// }"#).unwrap();
/// let layer = config.layer();
/// assert_eq!(layer.limiter().limits("db").max_queue_depth, Some(8));
/// assert!(layer.limiter().limits("cache_get").is_unlimited(), "absent means off");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct FifoConfig {
    /// Bound on distinct keys tracked (default 10 000).
    pub max_keys: NonZeroUsize,
    /// Limits of keys not listed in `keys` (default: nothing limited).
    pub default: ResourceLimits,
    /// Limits per resource key.
    pub keys: BTreeMap<String, ResourceLimits>,
    /// Resource key per tool (default: the tool's own name).
    pub tools: BTreeMap<String, String>,
}

impl Default for FifoConfig {
    fn default() -> Self {
        FifoConfig {
            max_keys: NonZeroUsize::new(DEFAULT_MAX_KEYS).unwrap(),
            default: ResourceLimits::default(),
            keys: BTreeMap::new(),
            tools: BTreeMap::new(),
        }
    }
}

impl FifoConfig {
    /// A limiter with these limits.
    pub fn limiter(&self) -> ResourceLimiter {
        self.keys
            .iter()
            .fold(ResourceLimiter::builder(), |b, (key, limits)| {
                b.key(key.clone(), *limits)
            })
            .default_limits(self.default)
            .max_keys(self.max_keys.get())
            .build()
    }

    /// Applies these settings to a running layer: its limiter's limits and its tool map.
    pub fn apply(&self, layer: &FifoLimitLayer) {
        layer.limiter().reconfigure(
            self.keys.iter().map(|(k, l)| (k.clone(), *l)).collect(),
            self.default,
            self.max_keys.get(),
        );
        layer.set_tool_keys(
            self.tools
                .iter()
                .map(|(t, k)| (t, Name::new(k.as_str())))
                .collect(),
        );
    }

    /// The inbound layer, with a new limiter and the tool-to-key map.
    pub fn layer(&self) -> FifoLimitLayer {
        self.tools
            .iter()
            .fold(FifoLimitLayer::new(self.limiter()), |layer, (tool, key)| {
                layer.tool_key(tool.clone(), key.clone())
            })
    }
}
