//! The session guard's settings: [`SessionConfig`], its defaults and the rules it is
//! validated by, and the fixed tunings beside them (how fast a session's health and healthy
//! entropy are smoothed, how many failures it may have before its error rate counts). The
//! guard holds the settings as one value a reload swaps whole; nothing here reads its state.

use crate::error::ConfigError;
use crate::valid::{AtLeastOne, Fraction, NonNegative, NonZeroDuration, Positive};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::num::NonZeroUsize;
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
    #[serde(rename = "window_size_ms")]
    pub window_size: NonZeroDuration,
    /// Buckets the window is split into. Default 10.
    pub buckets: NonZeroUsize,
    /// Count calls by their weight instead of one each (a weighted window). Default false.
    pub weighted: bool,
    /// Distinct keys stored per window; calls of further new keys count as keys seen once.
    /// Default 64.
    pub max_keys: NonZeroUsize,
    /// Per tool, JSON pointers into its arguments that make its resource key (e.g.
    /// `["/namespace", "/table"]`). Tools not listed use a short hash of their canonical
    /// arguments, so the same search with ever-new queries looks diverse.
    pub resource_keys: BTreeMap<String, Vec<String>>,
    /// A session's budget when healthy, cost units per second. Default 1 000, the default
    /// global budget: with no configuration a healthy session is bounded by the global budget
    /// and its fair share of it, and its own budget only binds once the storm score cuts it
    /// (to `min_factor` of this: 20/s).
    pub base_budget: Positive,
    /// Bucket size, cost units; also the most debt the backend time of slow calls may leave
    /// in it (a call is charged, when it ends, for the time it held past its tool's healthy
    /// latency). Default 1 000 (one second of the default budget).
    pub burst: Positive,
    /// How hard the storm score cuts the budget: factor `exp(-coefficient x score)`.
    /// Default 0.2, a cautious start: a coefficient too large catches complex tasks.
    pub entropy_coefficient: NonNegative,
    /// The lowest budget factor: a penalized session keeps this share of its budget.
    /// Default 0.02.
    pub min_factor: Fraction,
    /// Factor regained per second once the session is healthy again. Default 0.1.
    pub recover_step: Positive,
    /// Error rate a healthy session may have. Default 0.05.
    pub error_tolerance: Positive,
    /// Ratio to the tools' healthy latency a healthy session may have. Default 1.5.
    pub latency_tolerance: Positive,
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
    pub max_sessions: NonZeroUsize,
    /// Tenants with an unverified pool at most; past it, the others share one. Default 10 000.
    pub max_tenants: NonZeroUsize,
    /// A new session starts on probation: a full bucket, refilled at this share of its
    /// budget; the share doubles with each healthy call it finishes (slow start) up to 1, so a
    /// healthy client's first burst is served and a fresh identity buys one bucket, not a
    /// budget. Default 0.2.
    pub probation: Fraction,
    /// New sessions each tenant may start per second (refilling its newcomer allowance);
    /// a session that finishes probation healthy gives its place back. Default 0.1.
    pub new_session_rate: Positive,
    /// The newcomer allowance: sessions of one tenant that may be on probation at once before
    /// `new_session_rate` applies; further new sessions stay in the tenant's unverified pool
    /// until a place is free. A call the pool refuses on an id not yet accepted that came back
    /// as told takes a place as that id's trial
    /// ([`SessionGuard::accept`](super::SessionGuard::accept)); ids made up per call take none.
    /// Default 3.
    pub new_session_burst: AtLeastOne,
    /// A session unseen this long is forgotten (`idle_ttl_ms`). Default 5 min.
    #[serde(rename = "idle_ttl_ms")]
    pub idle_ttl: NonZeroDuration,
    /// Sessions in the top-N view. Default 10.
    pub top_n: usize,
}

impl Default for SessionConfig {
    fn default() -> Self {
        SessionConfig {
            enabled: true,
            window_size: NonZeroDuration::of(Duration::from_secs(10)),
            buckets: NonZeroUsize::new(10).unwrap(),
            weighted: false,
            max_keys: NonZeroUsize::new(64).unwrap(),
            resource_keys: BTreeMap::new(),
            base_budget: Positive::of(1000.0),
            burst: Positive::of(1000.0),
            entropy_coefficient: NonNegative::of(0.2),
            min_factor: Fraction::of(0.02),
            recover_step: Positive::of(0.1),
            error_tolerance: Positive::of(0.05),
            latency_tolerance: Positive::of(1.5),
            latency_floor: Duration::from_millis(5),
            min_calls: 5,
            max_sessions: NonZeroUsize::new(100_000).unwrap(),
            max_tenants: NonZeroUsize::new(10_000).unwrap(),
            probation: Fraction::of(0.2),
            new_session_rate: Positive::of(0.1),
            new_session_burst: AtLeastOne::of(3.0),
            idle_ttl: NonZeroDuration::of(Duration::from_secs(300)),
            top_n: 10,
        }
    }
}

impl SessionConfig {
    /// Checks the rules a field's type cannot (each number's and duration's range is its
    /// type's); the error names the field and the rule.
    pub fn validate(&self) -> Result<(), ConfigError> {
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
