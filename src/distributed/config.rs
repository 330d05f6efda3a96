//! The `[distributed]` settings: where Redis is, how long a lease window lasts, what to do
//! when Redis does not answer.

use crate::error::ConfigError;
use std::num::NonZeroU32;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// What a node does while Redis does not answer (`on_failure`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureMode {
    /// Admit with the local limits only: each node may spend the whole budget, so a cluster of
    /// N nodes may admit up to N times it while Redis is away.
    Open,
    /// Each node's buckets run at budget / `expected_nodes` (or, when that is absent, the
    /// number of nodes that proposed a rate in the last second Redis answered): the cluster
    /// stays near its budget, but a node's unused part cannot be lent to the others. The
    /// default: a Redis outage neither multiplies the budget (as `open` would, and outages
    /// come with stress) nor turns into an outage of every tool (as `closed` would).
    #[default]
    Local,
    /// Refuse every budgeted call with `shared_budget_unavailable` (scope `global`),
    /// `retry_after_ms` = the time until the next reconnection attempt.
    Closed,
}

impl FailureMode {
    /// The snake_case name used in the configuration.
    pub const fn as_str(self) -> &'static str {
        match self {
            FailureMode::Open => "open",
            FailureMode::Local => "local",
            FailureMode::Closed => "closed",
        }
    }
}

/// Settings of the Redis-backed shared budget (`[distributed]`). Read when the stack is built;
/// a reload keeps the running connection.
///
/// ```
/// use std::time::Duration;
/// use stormgate::distributed::{DistributedConfig, FailureMode};
///
/// let c: DistributedConfig = toml::from_str(r#"
///     url = "redis://127.0.0.1:6379"
///     lease_window_ms = 250
///     on_failure = "closed"
/// "#).unwrap();
/// assert_eq!(c.lease_window, Duration::from_millis(250));
/// assert_eq!(c.on_failure, FailureMode::Closed);
/// assert!(c.validate().is_ok());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct DistributedConfig {
    /// The Redis URL (`redis://host:port/db`, `rediss://...`, `unix:///path`). Default
    /// `redis://127.0.0.1:6379`.
    pub url: String,
    /// Prefix and hash tag of every key (`{<prefix>}:global:...`,
    /// `{<prefix>}:tenant:<name>:...`): one cluster of stormgate nodes per prefix. Default
    /// `stormgate`.
    pub prefix: String,
    /// This node's name among the cluster's proposals. Default: `node-<pid>-<random>`, new
    /// on each start. Two nodes must never share one.
    pub node_id: Option<String>,
    /// Length of a lease window (`lease_window_ms`). Default 500 ms. At most 1000 ms.
    #[serde(rename = "lease_window_ms", with = "crate::duration_ms")]
    pub lease_window: Duration,
    /// The longest any script call waits for Redis (`timeout_ms`): a call not answered by
    /// then counts as a failure. Default 50 ms. Admission itself never waits for Redis; the
    /// background connection attempts get `max(timeout, 100 ms)` for the handshake.
    #[serde(rename = "timeout_ms", with = "crate::duration_ms")]
    pub timeout: Duration,
    /// What to do while Redis does not answer. Default `local`.
    pub on_failure: FailureMode,
    /// Nodes the budget is divided by in `local` failure mode. Default: the number of nodes
    /// that proposed a rate in the last second Redis answered (at least 1).
    pub expected_nodes: Option<NonZeroU32>,
    /// How long a node's proposed global rate counts (`proposal_ttl_ms`; a tenant's share:
    /// at least two lease windows). Default 1000 ms: a node that stops proposing (it crashed)
    /// stops binding the others a second later.
    #[serde(rename = "proposal_ttl_ms", with = "crate::duration_ms")]
    pub proposal_ttl: Duration,
    /// The longest pause between two reconnection attempts (`max_backoff_ms`); attempts
    /// start 25 ms apart and double. Default 1000 ms.
    #[serde(rename = "max_backoff_ms", with = "crate::duration_ms")]
    pub max_backoff: Duration,
}

impl Default for DistributedConfig {
    fn default() -> Self {
        DistributedConfig {
            url: "redis://127.0.0.1:6379".into(),
            prefix: "stormgate".into(),
            node_id: None,
            lease_window: Duration::from_millis(500),
            timeout: Duration::from_millis(50),
            on_failure: FailureMode::default(),
            expected_nodes: None,
            proposal_ttl: Duration::from_secs(1),
            max_backoff: Duration::from_secs(1),
        }
    }
}

impl DistributedConfig {
    /// Checks every rule; the error names the field and the rule.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let url = self.url.as_str();
        if !["redis://", "rediss://", "unix://", "redis+unix://"]
            .iter()
            .any(|scheme| url.starts_with(scheme))
        {
            return Err(ConfigError::new(
                "distributed.url",
                format!("{url:?} is not a redis://, rediss:// or unix:// URL"),
            ));
        }
        if self.prefix.is_empty() || self.prefix.contains(['{', '}']) {
            return Err(ConfigError::new(
                "distributed.prefix",
                "must be non-empty, without '{' or '}'",
            ));
        }
        if self.node_id.as_ref().is_some_and(|n| n.is_empty()) {
            return Err(ConfigError::new("distributed.node_id", "must not be empty"));
        }
        let window = self.lease_window.as_millis();
        if !(10..=1000).contains(&window) {
            return Err(ConfigError::new(
                "distributed.lease_window_ms",
                "must be in 10..=1000",
            ));
        }
        if self.timeout.is_zero() || self.timeout >= self.lease_window {
            return Err(ConfigError::new(
                "distributed.timeout_ms",
                "must be greater than 0 and less than lease_window_ms",
            ));
        }
        if self.proposal_ttl < self.lease_window || self.proposal_ttl < 4 * self.timeout {
            return Err(ConfigError::new(
                "distributed.proposal_ttl_ms",
                "must be at least lease_window_ms and 4 x timeout_ms",
            ));
        }
        if self.max_backoff < Duration::from_millis(25) {
            return Err(ConfigError::new(
                "distributed.max_backoff_ms",
                "must be at least 25",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_the_field() {
        let bad = |f: fn(&mut DistributedConfig)| {
            let mut c = DistributedConfig::default();
            f(&mut c);
            c.validate().unwrap_err().field
        };
        assert!(DistributedConfig::default().validate().is_ok());
        assert!(bad(|c| c.url = "http://x".into()).starts_with("distributed.url"));
        assert!(bad(|c| c.prefix = "a{b".into()).starts_with("distributed.prefix"));
        assert!(
            bad(|c| c.lease_window = Duration::from_secs(2))
                .starts_with("distributed.lease_window_ms")
        );
        assert!(
            bad(|c| c.timeout = Duration::from_millis(500)).starts_with("distributed.timeout_ms")
        );
        assert!(
            bad(|c| c.proposal_ttl = Duration::from_millis(100))
                .starts_with("distributed.proposal_ttl_ms")
        );
    }
}
