//! The session guard's settings: [`SessionConfig`], its defaults and the rules it is
//! validated by, and the fixed tunings beside them (how fast a session's health and healthy
//! entropy are smoothed, how many failures it may have before its error rate counts). The
//! guard holds the settings as one value a reload swaps whole; nothing here reads its state.

use crate::error::ConfigError;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;

/// Smoothing of a session's error rate and latency ratio, per finished call.
pub(super) const HEALTH_ALPHA: f64 = 0.2;
/// Smoothing of a session's healthy entropy baseline.
pub(super) const BASELINE_ALPHA: f64 = 0.05;
/// Failures a session may have within one window before its error rate counts at all: a few
/// ordinary tool errors (an `isError` result, a bad query) are not a storm. Its error rate
/// counts in full from twice this many on (errors at volume).
pub const ERRORS_ALLOWED: f64 = 3.0;

/// Session guard settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct SessionConfig {
    /// Whether the guard runs. Default true.
    pub enabled: bool,
    /// Sliding window of a session's calls (`window_size_ms`). Default 10 s.
    #[serde(rename = "window_size_ms", with = "crate::duration_ms")]
    pub window_size: Duration,
    /// Buckets the window is split into. Default 10.
    pub buckets: usize,
    /// Count calls by their weight instead of one each (a weighted window). Default false.
    pub weighted: bool,
    /// Distinct keys stored per window; calls of further new keys count as keys seen once.
    /// Default 64.
    pub max_keys: usize,
    /// Per tool, JSON pointers into its arguments that make its resource key (e.g.
    /// `["/namespace", "/table"]`). Tools not listed use a short hash of their canonical
    /// arguments, so the same search with ever-new queries looks diverse.
    pub resource_keys: BTreeMap<String, Vec<String>>,
    /// A session's budget when healthy, cost units per second. Default 1 000, the default
    /// global budget: with no configuration a healthy session is bounded by the global budget
    /// and its fair share of it, and its own budget only binds once the storm score cuts it
    /// (to `min_factor` of this: 20/s).
    pub base_budget: f64,
    /// Bucket size, cost units; also the most debt the backend time of slow calls may leave
    /// in it (a call is charged, when it ends, for the time it held past its tool's healthy
    /// latency). Default 1 000 (one second of the default budget).
    pub burst: f64,
    /// How hard the storm score cuts the budget: factor `exp(-coefficient x score)`.
    /// Default 0.2, a cautious start: a coefficient too large catches complex tasks.
    pub entropy_coefficient: f64,
    /// The lowest budget factor: a penalized session keeps this share of its budget.
    /// Default 0.02.
    pub min_factor: f64,
    /// Factor regained per second once the session is healthy again. Default 0.1.
    pub recover_step: f64,
    /// Error rate a healthy session may have. Default 0.05.
    pub error_tolerance: f64,
    /// Ratio to the tools' healthy latency a healthy session may have. Default 1.5.
    pub latency_tolerance: f64,
    /// A call at most this much slower than its tool's healthy latency is never slow, whatever
    /// the ratio (`latency_floor_ms`), nor charged for its time: milliseconds of noise on a
    /// sub-millisecond tool are not distress. Default 5 ms.
    #[serde(rename = "latency_floor_ms", with = "crate::duration_ms")]
    pub latency_floor: Duration,
    /// Finished calls a session needs before its health or storm score may cut its budget
    /// (evidence before penalty). Default 5.
    pub min_calls: u32,
    /// Sessions tracked at most; past it, new sessions stay in their tenant's unverified pool,
    /// and no tracked session is evicted for them. Default 100 000.
    pub max_sessions: usize,
    /// Tenants with an unverified pool at most; past it, the others share one. Default 10 000.
    pub max_tenants: usize,
    /// A new session starts on probation: a full bucket, refilled at this share of its
    /// budget; the share doubles with each healthy call it finishes (slow start) up to 1, so a
    /// healthy client's first burst is served and a fresh identity buys one bucket, not a
    /// budget. Default 0.2.
    pub probation: f64,
    /// New sessions each tenant may start per second (refilling its newcomer allowance);
    /// a session that finishes probation healthy gives its place back. Default 0.1.
    pub new_session_rate: f64,
    /// The newcomer allowance: sessions of one tenant that may be on probation at once before
    /// `new_session_rate` applies; further new sessions stay in the tenant's unverified pool
    /// until a place is free. Default 3.
    pub new_session_burst: f64,
    /// A session unseen this long is forgotten (`idle_ttl_ms`). Default 5 min.
    #[serde(rename = "idle_ttl_ms", with = "crate::duration_ms")]
    pub idle_ttl: Duration,
    /// Sessions in the top-N view. Default 10.
    pub top_n: usize,
}

impl Default for SessionConfig {
    fn default() -> Self {
        SessionConfig {
            enabled: true,
            window_size: Duration::from_secs(10),
            buckets: 10,
            weighted: false,
            max_keys: 64,
            resource_keys: BTreeMap::new(),
            base_budget: 1000.0,
            burst: 1000.0,
            entropy_coefficient: 0.2,
            min_factor: 0.02,
            recover_step: 0.1,
            error_tolerance: 0.05,
            latency_tolerance: 1.5,
            latency_floor: Duration::from_millis(5),
            min_calls: 5,
            max_sessions: 100_000,
            max_tenants: 10_000,
            probation: 0.2,
            new_session_rate: 0.1,
            new_session_burst: 3.0,
            idle_ttl: Duration::from_secs(300),
            top_n: 10,
        }
    }
}

impl SessionConfig {
    /// Checks every rule; the error names the field and the rule.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let positive = |name: &str, v: f64| {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                Err(ConfigError::new(
                    format!("sessions.{name}"),
                    "must be greater than 0",
                ))
            }
        };
        if self.window_size.is_zero() {
            return Err(ConfigError::new(
                "sessions.window_size_ms",
                "must be greater than 0",
            ));
        }
        if self.buckets == 0 {
            return Err(ConfigError::new("sessions.buckets", "must be at least 1"));
        }
        if self.max_keys == 0 {
            return Err(ConfigError::new("sessions.max_keys", "must be at least 1"));
        }
        positive("base_budget", self.base_budget)?;
        positive("burst", self.burst)?;
        positive("error_tolerance", self.error_tolerance)?;
        positive("latency_tolerance", self.latency_tolerance)?;
        if !(self.entropy_coefficient.is_finite() && self.entropy_coefficient >= 0.0) {
            return Err(ConfigError::new(
                "sessions.entropy_coefficient",
                "must be 0 or more",
            ));
        }
        if !(self.min_factor > 0.0 && self.min_factor <= 1.0) {
            return Err(ConfigError::new("sessions.min_factor", "must be in (0, 1]"));
        }
        if !(self.recover_step.is_finite() && self.recover_step > 0.0) {
            return Err(ConfigError::new(
                "sessions.recover_step",
                "must be greater than 0",
            ));
        }
        if self.max_sessions == 0 {
            return Err(ConfigError::new(
                "sessions.max_sessions",
                "must be at least 1",
            ));
        }
        if self.max_tenants == 0 {
            return Err(ConfigError::new(
                "sessions.max_tenants",
                "must be at least 1",
            ));
        }
        if !(self.probation > 0.0 && self.probation <= 1.0) {
            return Err(ConfigError::new("sessions.probation", "must be in (0, 1]"));
        }
        positive("new_session_rate", self.new_session_rate)?;
        if !(self.new_session_burst.is_finite() && self.new_session_burst >= 1.0) {
            return Err(ConfigError::new(
                "sessions.new_session_burst",
                "must be at least 1",
            ));
        }
        if self.idle_ttl.is_zero() {
            return Err(ConfigError::new(
                "sessions.idle_ttl_ms",
                "must be greater than 0",
            ));
        }
        for (tool, pointers) in &self.resource_keys {
            if let Some(p) = pointers
                .iter()
                .find(|p| !p.is_empty() && !p.starts_with('/'))
            {
                return Err(ConfigError::new(
                    format!("sessions.resource_keys.{tool}"),
                    format!("{p:?} is not a JSON pointer (starts with /)"),
                ));
            }
        }
        Ok(())
    }
}
