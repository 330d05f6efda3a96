//! The session guard: per-session windows, health, storm score and budget.

use crate::error::ConfigError;
use std::collections::BTreeMap;
use std::hash::{BuildHasher, DefaultHasher, Hash, Hasher, RandomState};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use crate::snapshot::{Live, Part};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::key::hash_arguments;
use super::score::{
    HINTS_IGNORED_ALLOWED, Signals, Tolerances, budget_factor, distress, storm_score,
};
use super::window::SessionWindow;
use crate::admit::{Admission, AdmitLayer};
use crate::bounded::{Bounded, OVERFLOW};
use crate::call::{Call, SessionId, Tenant};
use crate::metrics;
use crate::outcome::{Observation, Observer, Outcome};
use crate::policy::{Mode, Switch};
use crate::rejection::{Reason, Rejection, Scope};
use crate::stats::{Ewma, OwnBaselines, Recent, ToolBaselines};

/// How a tenant's unverified pool is named in the top-N view: this, then the tenant.
pub const UNVERIFIED_PREFIX: &str = "~unverified:";
pub use crate::stats::MAX_TOOLS;
/// Smoothing of a session's error rate and latency ratio, per finished call.
const HEALTH_ALPHA: f64 = 0.2;
/// Smoothing of a session's healthy entropy baseline.
const BASELINE_ALPHA: f64 = 0.05;
/// Failures a session may have within one window before its error rate counts at all: a few
/// ordinary tool errors (an `isError` result, a bad query) are not a storm. Its error rate
/// counts in full from twice this many on (errors at volume).
pub const ERRORS_ALLOWED: f64 = 3.0;

/// Session guard settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
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

/// One session's state (or a tenant's unverified pool); its own mutex, touched only by its
/// own calls.
#[derive(Debug)]
struct Session {
    id: SessionId,
    window: SessionWindow,
    errors: Ewma,
    latency: Ewma,
    entropy_baseline: Ewma,
    /// Its own healthy latency per tool it calls.
    own: OwnBaselines,
    tokens: f64,
    factor: f64,
    score: f64,
    last: u64,
    consumed: f64,
    calls: u64,
    /// Calls that finished (their outcome observed).
    finished: u64,
    /// Failures within about one window (decaying with the window as time constant).
    failures: Recent,
    /// When the last refusal told a client to come back, ns: the next refusal's wait starts
    /// after it, so the hints of a burst are spread over the refill instead of colliding.
    hinted: u64,
    /// When its last [`HINTS_KEPT`] refusals told it to come back, ns (a ring, `next` the
    /// oldest). A call arriving while its last [`callers`](Self::callers) are all still ahead
    /// comes from a client that is not waiting for them.
    waits: [u64; HINTS_KEPT],
    next: usize,
    /// Its calls admitted and not yet over (answered, dropped or refunded).
    in_flight: u32,
    /// When its last call arrived, ns, and how many arrived in a row each within
    /// [`HINTS_REACTION`] of the one before (sent at once, by as many callers).
    arrived_at: u64,
    burst: u32,
    /// The most calls it has had in flight at once, or sent at once: how many callers it has
    /// shown it runs, each of which may be waiting a hint of its own.
    callers: u32,
    /// When its last refusal was given, ns, and how many refusals in a row came within
    /// [`HINTS_REACTION`] of the one before (one burst or batch, refused at once).
    refused_at: u64,
    quick: usize,
    /// Its calls that arrived so, within about a window.
    ignored: Recent,
    /// Its calls (refused before the guard or not), and those refused by any stage, within
    /// about a window.
    asked: Recent,
    refusals: Recent,
    rejected: u64,
    /// In the storm state (logged on entry and exit): entered when the factor falls below
    /// [`STORM_ENTER`], left when it is back at [`STORM_LEAVE`] or above.
    storm: bool,
    /// The share of its budget's rate that refills its bucket: below 1 on probation, doubled
    /// by each healthy finished call.
    trust: f64,
    /// On probation: the pool whose newcomer place it holds, given back when it graduates.
    probation: Option<Arc<Pool>>,
    /// A tenant's unverified pool: on probation for good.
    pool: bool,
}

/// A tenant's unverified pool: the one session state charged for every call of the tenant on
/// an id the MCP server has not accepted (so ids made up per call are one session here), and
/// the tenant's newcomer allowance.
#[derive(Debug)]
struct Pool {
    state: Arc<Mutex<Session>>,
    /// New sessions the tenant may start now, and when it was last refilled.
    newcomers: Mutex<(f64, u64)>,
}

impl Pool {
    fn new(tenant: &Tenant, config: &SessionConfig, now: u64) -> Self {
        let id = SessionId::new(format!("{UNVERIFIED_PREFIX}{tenant}"));
        let mut state = SessionGuard::session(id, config, now);
        state.pool = true;
        state.trust = config.probation;
        Pool {
            state: Arc::new(Mutex::new(state)),
            newcomers: Mutex::new((config.new_session_burst, now)),
        }
    }

    /// Takes a newcomer place, if the tenant has one.
    fn admit_newcomer(&self, now: u64, config: &SessionConfig) -> bool {
        let mut a = self
            .newcomers
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let dt = Duration::from_nanos(now.saturating_sub(a.1)).as_secs_f64();
        a.1 = now;
        a.0 = (a.0 + config.new_session_rate * dt).min(config.new_session_burst);
        if a.0 >= 1.0 {
            a.0 -= 1.0;
            true
        } else {
            false
        }
    }

    /// Gives a newcomer place back.
    fn release_newcomer(&self, config: &SessionConfig) {
        let mut a = self
            .newcomers
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        a.0 = (a.0 + 1.0).min(config.new_session_burst);
    }
}

/// The one vote on a tool's healthy latency of all calls on ids the server has not accepted.
const UNVERIFIED_VOTER: u64 = u64::MAX;

/// The refusals' waits a session's state keeps: a client whose callers each wait their own
/// refusal's hint has at most one wait ahead per caller, so a call arriving while as many
/// waits as it has callers are all ahead ignored at least one. Its callers are counted as the
/// most calls it has had in flight at once or sent at once, at least [`HINTS_CALLERS`] and at
/// most this (an MCP host runs fewer tool calls at once).
pub const HINTS_KEPT: usize = 16;

/// The callers a client is assumed to run before it has shown more calls in flight or sent at
/// once.
pub const HINTS_CALLERS: usize = 4;

/// Refusals given within this of each other went to one burst or one batch, sent at once
/// before the client could read any of them (a client takes longer to read a refusal and call
/// again): while the last refusals a call is judged by (one per caller) all came so, a call
/// arriving before their waits does not count as ignoring them.
pub const HINTS_REACTION: Duration = Duration::from_millis(1);
/// [`HINTS_REACTION`] in ns.
const REACTION_NS: u64 = HINTS_REACTION.as_nanos() as u64;

/// A session whose budget factor falls below this is logged as entering a storm.
const STORM_ENTER: f64 = 0.5;
/// A session in a storm whose factor is back at this or above is logged as leaving it.
const STORM_LEAVE: f64 = 0.9;

/// Seconds as nanoseconds, saturating.
fn secs_ns(secs: f64) -> u64 {
    (secs.max(0.0) * 1e9).min(u64::MAX as f64) as u64
}

impl Session {
    /// How much its error rate counts, in [0, 1]: nothing while it has failed at most
    /// [`ERRORS_ALLOWED`] times within about a window, in full from twice that.
    fn error_volume(&self, now: u64, window: f64) -> f64 {
        let failures = self.failures.at(now, window);
        ((failures - ERRORS_ALLOWED) / ERRORS_ALLOWED).clamp(0.0, 1.0)
    }

    /// A call of this client arrives now, with resource key `key` of `weight`: in its window,
    /// and counted as ignoring a wait when its last refusals, one per caller it has shown
    /// ([`HINTS_CALLERS`] to [`HINTS_KEPT`]; calls sent at once, each within
    /// [`HINTS_REACTION`] of the one before, show as many callers), all told it to come back
    /// later than now (and were not all given at once).
    fn arrive(&mut self, now: u64, window: f64, key: u64, weight: u32) {
        self.window.record(Duration::from_nanos(now), key, weight);
        self.asked.add(now, window, 1.0);
        self.burst = if now.saturating_sub(self.arrived_at) < REACTION_NS {
            self.burst.saturating_add(1)
        } else {
            1
        };
        self.arrived_at = now;
        self.callers = self.callers.max(self.burst);
        let callers = (self.callers as usize).clamp(HINTS_CALLERS, HINTS_KEPT);
        let ahead = |i: usize| self.waits[(self.next + HINTS_KEPT - i) % HINTS_KEPT] > now;
        if self.quick < callers - 1 && (1..=callers).all(ahead) {
            self.ignored.add(now, window, 1.0);
        }
    }

    /// One of its calls was admitted: in flight until its permit is dropped.
    fn start(&mut self) {
        self.in_flight = self.in_flight.saturating_add(1);
        self.callers = self.callers.max(self.in_flight);
    }

    /// One of its calls was refused now; with `wait`, the refusal told the whole client (its
    /// session's budget or share is spent) to come back after it.
    fn refused(&mut self, now: u64, window: f64, wait: Option<Duration>) {
        self.refusals.add(now, window, 1.0);
        let Some(wait) = wait else { return };
        self.quick = if now.saturating_sub(self.refused_at) < REACTION_NS {
            self.quick.saturating_add(1)
        } else {
            0
        };
        self.refused_at = now;
        self.waits[self.next] =
            now.saturating_add(u64::try_from(wait.as_nanos()).unwrap_or(u64::MAX));
        self.next = (self.next + 1) % HINTS_KEPT;
    }

    /// What its score is computed from now, and the tolerances it is judged by.
    fn signals(&self, now: u64, config: &SessionConfig) -> (Signals, Tolerances) {
        let window = config.window_size.as_secs_f64();
        let signals = Signals {
            entropy: self.window.entropy(),
            entropy_baseline: self.entropy_baseline.value(),
            error_rate: self.errors.value().unwrap_or(0.0) * self.error_volume(now, window),
            latency_ratio: self.latency.value().unwrap_or(1.0),
            ignored_hints: self.ignored.at(now, window),
            // Counted at volume: a few refusals of a few calls are no share.
            refused_share: self.refusals.at(now, window)
                / self.asked.at(now, window).max(HINTS_IGNORED_ALLOWED),
        };
        let tolerances = Tolerances {
            error_rate: config.error_tolerance,
            latency_ratio: config.latency_tolerance,
            ignored_hints: HINTS_IGNORED_ALLOWED,
        };
        (signals, tolerances)
    }

    /// Logs a change of storm state (the session as a hash: its id is the client's choice).
    fn note_storm(&mut self) {
        let storm = if self.storm {
            self.factor < STORM_LEAVE
        } else {
            self.factor < STORM_ENTER
        };
        if storm == self.storm {
            return;
        }
        self.storm = storm;
        let mut h = DefaultHasher::new();
        self.id.hash(&mut h);
        let session = format!("{:016x}", h.finish());
        if storm {
            tracing::warn!(
                session,
                score = self.score,
                factor = self.factor,
                "session entered the storm state"
            );
        } else {
            tracing::info!(
                session,
                score = self.score,
                factor = self.factor,
                "session left the storm state"
            );
        }
    }
}

/// One row of the top-N view.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SessionSummary {
    /// The session.
    pub session: String,
    /// Its storm score.
    pub score: f64,
    /// Entropy of its window, bits.
    pub entropy: f64,
    /// Its budget factor (1 = unpenalized).
    pub factor: f64,
    /// Admitted weighted cost per second, smoothed over the window.
    pub consumption: f64,
    /// Calls (admitted or not) per second over the window.
    pub call_rate: f64,
    /// Calls refused so far.
    pub rejected: u64,
    /// Calls seen so far.
    pub calls: u64,
}

/// Judges each session by what its calls are doing. See the [module docs](crate::entropy).
#[derive(Clone)]
pub struct SessionGuard {
    inner: Arc<Inner>,
}

struct Inner {
    switch: Switch,
    /// The settings, swapped whole by a reload.
    config: Live<SessionConfig>,
    epoch: Instant,
    /// The sessions the MCP server accepted, by a keyed hash of their id (two ids colliding
    /// would share a state; at a million sessions the odds are about 3 in 100 million, and the
    /// key is random, so ids cannot be chosen to collide).
    sessions: Bounded<Arc<Mutex<Session>>>,
    /// Each tenant's unverified pool, by a keyed hash of the tenant.
    pools: Bounded<Arc<Pool>>,
    /// The pool of tenants past `max_tenants`.
    overflow: Arc<Pool>,
    /// Each tool's healthy service time, by a keyed hash of its name.
    tool_latency: ToolBaselines,
    top: Mutex<Vec<SessionSummary>>,
    /// The key of every resource key's hash, random per guard.
    keys: RandomState,
}

impl std::fmt::Debug for SessionGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionGuard")
            .field("sessions", &self.inner.sessions.len())
            .field("pools", &self.inner.pools.len())
            .field("config", &self.inner.config.load())
            .finish()
    }
}

/// What an admitted call took from its session, to give back if a later stage refuses it.
/// The call counts as in flight for its session until the permit is dropped.
#[derive(Debug)]
pub struct SessionPermit(Option<(Arc<Mutex<Session>>, f64)>);

impl Drop for SessionPermit {
    fn drop(&mut self) {
        if let Some((entry, _)) = &self.0 {
            let mut s = lock(entry);
            s.in_flight = s.in_flight.saturating_sub(1);
        }
    }
}

fn lock(s: &Mutex<Session>) -> std::sync::MutexGuard<'_, Session> {
    s.lock().unwrap_or_else(PoisonError::into_inner)
}

impl SessionGuard {
    /// A guard with these settings, always adaptive.
    pub fn new(config: SessionConfig) -> Result<Self, ConfigError> {
        Self::with_switch(config, Switch::default())
    }

    /// A guard with these settings that follows the kill switch `switch`.
    pub fn with_switch(config: SessionConfig, switch: Switch) -> Result<Self, ConfigError> {
        config.validate()?;
        let guard = SessionGuard {
            inner: Arc::new(Inner {
                overflow: Arc::new(Pool::new(&Tenant::new(OVERFLOW), &config, 0)),
                switch,
                epoch: Instant::now(),
                sessions: Bounded::new(),
                pools: Bounded::new(),
                tool_latency: ToolBaselines::new(),
                top: Mutex::new(Vec::new()),
                keys: RandomState::new(),
                config: Live::new(config),
            }),
        };
        Ok(guard)
    }

    /// Takes new settings, keeping every session's window, health and budget. A new window
    /// size or bucket count applies to sessions first seen after the reload.
    pub fn reconfigure(&self, config: SessionConfig) -> Result<(), ConfigError> {
        config.validate()?;
        self.set_config(config);
        Ok(())
    }

    /// [`reconfigure`](Self::reconfigure) with settings already validated.
    pub(crate) fn set_config(&self, config: SessionConfig) {
        self.inner.config.store(Arc::new(config));
    }

    /// The guard's entry in a snapshot taken now.
    pub(crate) fn part(&self) -> Part {
        self.inner.config.part()
    }

    /// The settings `call` runs under (its request's snapshot's).
    pub(crate) fn config_of(&self, call: &Call) -> Arc<SessionConfig> {
        self.inner.config.read(call.snapshot())
    }

    fn session(id: SessionId, config: &SessionConfig, now: u64) -> Session {
        Session {
            id,
            window: SessionWindow::new(config.window_size, config.buckets, config.max_keys),
            // Priors: healthy until shown otherwise.
            errors: Ewma::with_prior(HEALTH_ALPHA, 0.0),
            latency: Ewma::with_prior(HEALTH_ALPHA, 1.0),
            entropy_baseline: Ewma::new(BASELINE_ALPHA),
            own: OwnBaselines::default(),
            tokens: config.burst,
            factor: 1.0,
            score: 0.0,
            last: now,
            consumed: 0.0,
            calls: 0,
            finished: 0,
            failures: Recent::default(),
            hinted: 0,
            waits: [0; HINTS_KEPT],
            in_flight: 0,
            arrived_at: 0,
            burst: 0,
            callers: 0,
            refused_at: 0,
            quick: 0,
            next: 0,
            ignored: Recent::default(),
            asked: Recent::default(),
            refusals: Recent::default(),
            rejected: 0,
            storm: false,
            trust: 1.0,
            probation: None,
            pool: false,
        }
    }

    fn now(&self) -> u64 {
        u64::try_from(self.inner.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// The admission stage: `AdmitLayer` over this guard.
    pub fn layer(&self) -> AdmitLayer<SessionGuard> {
        AdmitLayer::new(self.clone())
    }

    /// The observer to give to [`OutcomeLayer`](crate::outcome::OutcomeLayer).
    pub fn observer(&self) -> Arc<dyn Observer> {
        Arc::new(self.clone())
    }

    /// The settings in force.
    pub fn config(&self) -> Arc<SessionConfig> {
        self.inner.config.load()
    }

    /// Sessions tracked now (the overflow session not included).
    pub fn len(&self) -> usize {
        self.inner.sessions.len()
    }

    /// Whether no session is tracked.
    pub fn is_empty(&self) -> bool {
        self.inner.sessions.is_empty()
    }

    /// The resource key of a call: its tool and, per config, the values at its JSON pointers
    /// or a hash of its canonical arguments (bounded: see [`MAX_HASHED_ARGS`]); the uri of a
    /// `resources/read`; the name of a `prompts/get`. With the kill switch off, the target
    /// alone: nothing of the arguments is read.
    ///
    /// [`MAX_HASHED_ARGS`]: super::MAX_HASHED_ARGS
    pub fn resource_key(&self, call: &Call) -> u64 {
        let mut h = self.inner.keys.build_hasher();
        call.method.hash(&mut h);
        call.target().hash(&mut h);
        if let (Some(tool), Some(args)) = (call.tool.as_deref(), call.arguments.as_deref())
            && self.inner.switch.of(call).mode != Mode::Off
        {
            let config = self.config_of(call);
            let pointers = config.resource_keys.get(tool).map(Vec::as_slice);
            hash_arguments(args, pointers, &self.inner.keys, &mut h);
        }
        h.finish()
    }

    /// The tenant's unverified pool (made on first use; the shared one past `max_tenants`).
    fn pool(&self, tenant: &Tenant) -> Arc<Pool> {
        let config = self.inner.config.load();
        let now = self.now();
        let pools = &self.inner.pools;
        pools
            .get_or_insert(pools.key(tenant.as_str()), config.max_tenants, || {
                Arc::new(Pool::new(tenant, &config, now))
            })
            .unwrap_or_else(|| self.inner.overflow.clone())
    }

    /// The state a call is charged to and judged by: its session's, once the MCP server has
    /// accepted the session, else its tenant's unverified pool.
    fn state(&self, call: &Call) -> Arc<Mutex<Session>> {
        match self.tracked(call) {
            Ok((_, s)) => s,
            Err(_) => self.pool(&call.tenant).state.clone(),
        }
    }

    /// Tells the guard that the MCP server accepted `session` of `tenant` (it minted the id on
    /// `initialize`, or answered a call on it with success); the guard's observer calls it.
    /// The session gets its own state, on probation, if its tenant has a newcomer place and
    /// fewer than `max_sessions` are tracked; otherwise its calls stay in the tenant's
    /// unverified pool (and it may be accepted on a later success). Returns whether it is
    /// tracked now.
    pub fn accept(&self, session: &SessionId, tenant: &Tenant) -> bool {
        let sessions = &self.inner.sessions;
        let key = sessions.key(session.as_str());
        if sessions.get(key).is_some() {
            return true;
        }
        let config = self.inner.config.load();
        let now = self.now();
        let pool = self.pool(tenant);
        if !pool.admit_newcomer(now, &config) {
            return false;
        }
        let made = sessions.get_or_insert(key, config.max_sessions, || {
            let mut s = Self::session(session.clone(), &config, now);
            s.trust = config.probation;
            s.probation = Some(pool.clone());
            Arc::new(Mutex::new(s))
        });
        if made.is_none() {
            pool.release_newcomer(&config);
        }
        made.is_some()
    }

    /// The client a call is judged as, as a number: its session, once the MCP server has
    /// accepted it, else its tenant's unverified pool (so ids made up per call are one client).
    /// The budget's health census and the breakers count clients by it.
    pub fn judged_as(&self, call: &Call) -> u64 {
        self.identify(call).0
    }

    /// [`judged_as`](Self::judged_as) and the vote the call has on its tool's healthy latency
    /// ([`CommonBaseline`]), from one lookup: its session's, once the MCP server has accepted
    /// it; every other call shares one, whatever tenant or id it claims.
    ///
    /// [`CommonBaseline`]: crate::stats::CommonBaseline
    pub(crate) fn identify(&self, call: &Call) -> (u64, u64) {
        match self.tracked(call) {
            Ok((key, _)) => (key, key),
            Err(pool) => (pool, UNVERIFIED_VOTER),
        }
    }

    /// A call's session key and state once the MCP server has accepted it; else the client
    /// key of its tenant's unverified pool: another keyed hash of the tenant, inverted, so it
    /// meets a session's only by a 64-bit accident.
    fn tracked(&self, call: &Call) -> Result<(u64, Arc<Mutex<Session>>), u64> {
        let sessions = &self.inner.sessions;
        let key = sessions.key(call.session.as_str());
        sessions
            .get(key)
            .map(|s| (key, s))
            .ok_or_else(|| !self.inner.pools.key(call.tenant.as_str()))
    }

    /// [`identify`](Self::identify)'s client, and the most cost units per second its own
    /// state lets it be admitted now: the session budget times its storm factor and its trust
    /// (its tenant's pool's for a call on an id the server has not accepted). What a client
    /// can use of a shared bucket, however much more it asks; unbounded while sessions are
    /// off.
    pub(crate) fn allowance(&self, call: &Call) -> (u64, f64) {
        let config = self.config_of(call);
        let (client, state) = match self.tracked(call) {
            Ok((key, s)) => (key, Some(s)),
            Err(pool) => (pool, self.inner.pools.get(!pool).map(|p| p.state.clone())),
        };
        let allowance = match state {
            Some(s) if config.enabled => {
                let s = lock(&s);
                config.base_budget * s.factor * s.trust
            }
            _ => f64::INFINITY,
        };
        (client, allowance)
    }

    /// Whether `session` has its own state (the MCP server accepted it).
    pub fn is_tracked(&self, session: &SessionId) -> bool {
        let sessions = &self.inner.sessions;
        sessions.get(sessions.key(session.as_str())).is_some()
    }

    /// The current storm score, entropy and budget factor of a session.
    pub fn summary(&self, id: &SessionId) -> Option<SessionSummary> {
        let sessions = &self.inner.sessions;
        let s = sessions.get(sessions.key(id.as_str()))?;
        let s = lock(&s);
        Some(self.summarize(&s))
    }

    /// The same for a tenant's unverified pool, if it has one.
    pub fn unverified(&self, tenant: &Tenant) -> Option<SessionSummary> {
        let pools = &self.inner.pools;
        let p = pools.get(pools.key(tenant.as_str()))?;
        let s = lock(&p.state);
        Some(self.summarize(&s))
    }

    /// Tenants with an unverified pool now.
    pub fn pools(&self) -> usize {
        self.inner.pools.len()
    }

    fn summarize(&self, s: &Session) -> SessionSummary {
        SessionSummary {
            call_rate: s.window.total() as f64 / self.inner.config.load().window_size.as_secs_f64(),
            session: s.id.to_string(),
            score: s.score,
            entropy: s.window.entropy(),
            factor: s.factor,
            consumption: s.consumed,
            rejected: s.rejected,
            calls: s.calls,
        }
    }

    /// Forgets sessions unseen for `idle_ttl` and refreshes the top-N view; the sweeper calls
    /// it every window. Returns the sessions forgotten.
    pub(crate) fn sweep_idle(&self) -> usize {
        let now = self.now();
        let config = self.inner.config.load();
        let ttl = u64::try_from(config.idle_ttl.as_nanos()).unwrap_or(u64::MAX);
        let before = self.inner.sessions.len();
        let n = config.top_n;
        let mut top: Vec<SessionSummary> = Vec::with_capacity(n + 1);
        let mut keep = |s: &Mutex<Session>| {
            let s = lock(s);
            if now.saturating_sub(s.last) >= ttl {
                return false;
            }
            if n > 0 && (top.len() < n || top.last().is_some_and(|l| s.score > l.score)) {
                top.push(self.summarize(&s));
                top.sort_by(|a, b| b.score.total_cmp(&a.score));
                top.truncate(n);
            }
            true
        };
        self.inner.sessions.retain(|s| keep(s));
        self.inner.pools.retain(|p| keep(&p.state));
        self.inner.tool_latency.renew_if_full();
        if let Some(first) = top.first() {
            ::metrics::gauge!(metrics::SESSION_TOP_SCORE).set(first.score);
        }
        // Session ids only in these top-N series; one that leaves the top N is no longer
        // updated and the exporter drops it (metrics::GAUGE_IDLE_TIMEOUT).
        for t in &top {
            let id = t.session.clone();
            ::metrics::gauge!(metrics::SESSION_ENTROPY, "session" => id.clone()).set(t.entropy);
            ::metrics::gauge!(metrics::SESSION_SCORE, "session" => id.clone()).set(t.score);
            ::metrics::gauge!(metrics::SESSION_CONSUMPTION, "session" => id.clone())
                .set(t.consumption);
            ::metrics::gauge!(metrics::SESSION_REJECTIONS, "session" => id).set(t.rejected as f64);
        }
        ::metrics::gauge!(metrics::SESSIONS).set(self.inner.sessions.len() as f64);
        *self
            .inner
            .top
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = top;
        before.saturating_sub(self.inner.sessions.len())
    }

    /// The N sessions with the highest storm score at the last sweep.
    pub fn top(&self) -> Vec<SessionSummary> {
        self.inner
            .top
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Sweeps every window length until the last handle drops.
    pub fn spawn_sweeper(&self) -> tokio::task::JoinHandle<()> {
        let weak: Weak<Inner> = Arc::downgrade(&self.inner);
        let every = self.inner.config.load().window_size;
        tokio::spawn(async move {
            let mut interval = tokio::time::interval_at(Instant::now() + every, every);
            loop {
                interval.tick().await;
                let Some(inner) = weak.upgrade() else {
                    return;
                };
                SessionGuard { inner }.sweep_idle();
            }
        })
    }
}

impl Admission for SessionGuard {
    type Permit = SessionPermit;

    fn admit(&self, call: &Call) -> Result<SessionPermit, Rejection> {
        let config = self.config_of(call);
        if !config.enabled || call.target().is_none() {
            // Off, or protocol chatter (initialize, tools/list, ping): not the work guarded.
            return Ok(SessionPermit(None));
        }
        let now = self.now();
        let key = self.resource_key(call);
        let cost = f64::from(call.cost.max(1));
        let entry = self.state(call);
        let mut s = lock(&entry);
        let dt = Duration::from_nanos(now.saturating_sub(s.last)).as_secs_f64();
        let first = s.calls == 0;
        s.calls += 1;
        s.last = now;
        let window = config.window_size.as_secs_f64();
        s.arrive(now, window, key, weight_of(call, &config));
        let (signals, tolerances) = s.signals(now, &config);
        let t = &tolerances;
        let healthy = distress(&signals, t) == 0.0;
        if healthy {
            s.entropy_baseline.update(signals.entropy);
        }
        s.score = storm_score(&signals, t);
        let policy = self.inner.switch.of(call);
        // Evidence: calls that ran, or calls made straight through refusals (which need none
        // to run).
        let evidence =
            s.finished >= u64::from(config.min_calls) || signals.ignored_hints > t.ignored_hints;
        let target = if policy.features.entropy_penalty && evidence {
            budget_factor(s.score, config.entropy_coefficient, config.min_factor)
        } else {
            1.0
        };
        // Cut at once; regained by steps only once the session is healthy again, so a storm
        // whose errors dip for a moment keeps its penalty.
        s.factor = if target <= s.factor || first {
            target
        } else if healthy || !policy.features.entropy_penalty {
            (s.factor + config.recover_step * dt).min(target)
        } else {
            s.factor
        };
        s.note_storm();
        let (rate, reason) = match policy.mode {
            // Measured above; nothing refused.
            Mode::Off => return Ok(SessionPermit(None)),
            Mode::Fixed => match policy.fixed.session_rate {
                Some(rate) => (rate, Reason::FixedLimitExceeded),
                None => return Ok(SessionPermit(None)),
            },
            Mode::Adaptive => (config.base_budget * s.factor, Reason::SessionBudgetExceeded),
        };
        let cap = (config.burst * rate / config.base_budget).max(cost);
        // On probation (slow start): a full bucket, refilled at `trust` of the rate. A fixed
        // limit is the same for everyone.
        let trust = if policy.mode == Mode::Adaptive {
            s.trust
        } else {
            1.0
        };
        s.tokens = (s.tokens + rate * trust * dt).min(cap);
        // Consumption: admitted cost per second, decaying over one window.
        let tau = config.window_size.as_secs_f64();
        s.consumed *= (-dt / tau).exp();
        if s.tokens >= cost {
            s.tokens -= cost;
            s.consumed += cost / tau;
            s.start();
            drop(s);
            Ok(SessionPermit(Some((entry, cost))))
        } else {
            s.rejected += 1;
            // Its own slot in the refill: after the deficit, and after the last refusal's slot
            // (so a burst refused together comes back spread, each when its tokens are there).
            let refill = rate * trust;
            let own = now.saturating_add(secs_ns((cost - s.tokens) / refill));
            // At most one window past its own: a client that keeps calling through its
            // refusals does not push the slots out without end.
            let slot = own
                .max(s.hinted.saturating_add(secs_ns(cost / refill)))
                .min(own.saturating_add(secs_ns(window)));
            s.hinted = slot;
            let wait = Duration::from_nanos(slot - now).max(Duration::from_millis(1));
            s.refused(now, window, Some(wait));
            let reason = if reason != Reason::SessionBudgetExceeded {
                reason
            } else if s.factor < 1.0 {
                Reason::SessionStorm
            } else if trust < 1.0 {
                Reason::SessionProbation
            } else {
                reason
            };
            ::metrics::counter!(metrics::SESSION_REJECTED).increment(1);
            Err(Rejection::new(reason, Scope::AgentSession, wait))
        }
    }

    fn refund(&self, permit: SessionPermit) {
        if let Some((entry, cost)) = &permit.0 {
            let mut s = lock(entry);
            s.tokens += cost;
            s.consumed -= cost / self.inner.config.load().window_size.as_secs_f64();
        }
    }
}

impl SessionGuard {
    /// Learns from a finished call of `tool`: its tool's healthy latency, and the health of
    /// the state it was charged to (`tracked`, with its key, else its tenant's pool).
    fn learn(&self, tool: &str, o: &Observation<'_>, tracked: Option<(Arc<Mutex<Session>>, u64)>) {
        let config = self.config_of(o.call);
        let secs = o.service_time.as_secs_f64().max(1e-6);
        let floor = config.latency_floor.as_secs_f64();
        let cancelled = o.outcome == Outcome::Cancelled;
        // The tool's healthy latency learns from every call nothing held back; being the
        // minimum of five minutes' period means, a slowdown does not teach it for five minutes.
        let learns = !cancelled && !o.outcome.is_failure() && o.queue_wait.is_zero();
        let now = Duration::from_nanos(self.now());
        // Its state and its vote on the tool's latency: its session's, or its tenant's pool
        // and the one vote of every call on an id the server has not accepted.
        let (entry, voter) = match tracked {
            Some(tracked) => tracked,
            None => {
                let pools = &self.inner.pools;
                match pools.get(pools.key(o.call.tenant.as_str())) {
                    Some(p) => (p.state.clone(), UNVERIFIED_VOTER),
                    None => (self.inner.overflow.state.clone(), UNVERIFIED_VOTER),
                }
            }
        };
        let tools = &self.inner.tool_latency;
        let key = tools.key(tool);
        // The tool's, with this call's client's vote (a client new to a tool in its first
        // period is not judged by the others' calls alone).
        let judged = tools.judge(key, voter, now, secs, learns);
        let common = judged.after;
        let mut s = lock(&entry);
        // A call is judged against the slower of its tool's healthy latency and the session's
        // own: work slow by nature (a new, cold query every call) is not slowness. The first
        // call of a tool that nothing held back is the session's own norm.
        let own = s
            .own
            .judge(key, now, secs, learns)
            .or(learns.then_some(secs));
        let norm = match (common, own) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        // Slowness most of the tool's other clients see now is the backend's (the global
        // budget's signal), not this session's: it is judged against that too.
        let norm = match (norm, judged.others) {
            (Some(n), Some(seen)) => Some(n.max(seen)),
            (n, _) => n,
        };
        let ratio = norm.map_or(1.0, |b| {
            let ratio = secs / b.max(1e-6);
            // Within the floor of its healthy latency: noise, not slowness.
            if secs <= b + floor {
                ratio.min(1.0)
            } else {
                ratio
            }
        });
        // But it costs what it took: past its tool's healthy latency, the backend time it held
        // is charged to the session when it ends, one more weight per healthy latency (or per
        // floor, for a tool faster than that: under it, time is noise), down to one burst of
        // debt. Expensive work is spared by the score, not given the backend.
        if let Some(c) = common
            && secs > c + floor
            && self.inner.switch.of(o.call).mode == Mode::Adaptive
        {
            let extra = f64::from(o.call.cost.max(1)) * (secs - c) / c.max(floor).max(1e-6);
            s.tokens = (s.tokens - extra).max(-config.burst);
            s.consumed += extra / config.window_size.as_secs_f64();
        }
        if cancelled && ratio <= config.latency_tolerance {
            // A call its client gave up on ran at least this long: evidence of slowness when
            // that is already too slow, of nothing otherwise.
            return;
        }
        let healthy = !cancelled && !o.outcome.is_failure() && ratio <= config.latency_tolerance;
        s.finished += 1;
        s.errors
            .update(if o.outcome.is_failure() { 1.0 } else { 0.0 });
        if o.outcome.is_failure() {
            s.failures
                .add(self.now(), config.window_size.as_secs_f64(), 1.0);
        }
        s.latency.update(ratio);
        if s.pool || s.probation.is_some() {
            // Slow start: a healthy call doubles the share of the rate, an unhealthy one
            // halves it (down to where probation starts).
            s.trust = if healthy {
                (s.trust * 2.0).min(1.0)
            } else {
                (s.trust / 2.0).max(config.probation)
            };
        }
        // Probation ends after `min_calls` finished calls, healthy: the full rate, and the
        // newcomer place goes back to the tenant. A session not healthy by then keeps the
        // place until it is swept.
        let well = s.errors.value().unwrap_or(0.0) <= config.error_tolerance
            && s.latency.value().unwrap_or(1.0) <= config.latency_tolerance;
        if s.finished >= u64::from(config.min_calls)
            && well
            && let Some(pool) = s.probation.take()
        {
            s.trust = 1.0;
            pool.release_newcomer(&config);
        }
    }
}

impl Observer for SessionGuard {
    fn observe(&self, o: &Observation<'_>) {
        let sessions = &self.inner.sessions;
        let key = sessions.key(o.call.session.as_str());
        let tracked = sessions.get(key).map(|s| (s, key));
        let accepted = tracked.is_some();
        if o.outcome != Outcome::ClientError
            && self.config_of(o.call).enabled
            && let Some(tool) = o.call.target()
        {
            self.learn(tool, o, tracked);
        }
        if !accepted && o.outcome == Outcome::Ok {
            // The server answered a call on this id: it is a real session.
            self.accept(&o.call.session, &o.call.tenant);
        }
    }

    /// The budget's refusals (scopes `global` and `tenant`) come before the call reaches the
    /// guard, so the guard sees such a call only here: it is counted as the client's call, in
    /// its window, and its wait as one of the last [`HINTS_KEPT`] its next calls must honour;
    /// its score is brought up to date. The guard notes its own refusals where it makes them;
    /// the later stages' (a tool's breaker, a resource's queue) say that one tool or resource
    /// is busy, not the client, and only count in its refused share.
    fn refused(&self, call: &Call, r: &Rejection) {
        let config = self.config_of(call);
        if !config.enabled || call.target().is_none() || r.scope() == Scope::AgentSession {
            return;
        }
        let now = self.now();
        let window = config.window_size.as_secs_f64();
        let before = matches!(r.scope(), Scope::Global | Scope::Tenant);
        let key = if before { self.resource_key(call) } else { 0 };
        let entry = self.state(call);
        let mut s = lock(&entry);
        if before {
            s.arrive(now, window, key, weight_of(call, &config));
            s.refused(now, window, Some(r.retry_after()));
            let (signals, t) = s.signals(now, &config);
            s.score = storm_score(&signals, &t);
        } else {
            s.refused(now, window, None);
        }
    }
}

/// What a call counts for in its session's window: its weight, or one.
fn weight_of(call: &Call, config: &SessionConfig) -> u32 {
    if config.weighted { call.cost.max(1) } else { 1 }
}

/// Who a call's client is, for the stages that count clients (the budget's census and fair
/// shares, the breakers): as a followed [`SessionGuard`] judges it, else a keyed hash of its
/// session id.
#[derive(Debug, Default)]
pub(crate) struct ClientKeys {
    sessions: std::sync::OnceLock<SessionGuard>,
    keys: std::hash::RandomState,
}

impl ClientKeys {
    /// Follows `sessions` from now on (set once; later calls change nothing).
    pub(crate) fn follow(&self, sessions: SessionGuard) {
        let _ = self.sessions.set(sessions);
    }

    /// The client `call` counts for.
    pub(crate) fn of(&self, call: &Call) -> u64 {
        self.identify(call).0
    }

    /// The client `call` counts for and the rate its own state lets it be admitted, as a
    /// followed guard gives them ([`SessionGuard::allowance`]), else its session id's, unbounded.
    pub(crate) fn allowance(&self, call: &Call) -> (u64, f64) {
        match self.sessions.get() {
            Some(guard) => guard.allowance(call),
            None => (self.of(call), f64::INFINITY),
        }
    }

    /// The client `call` counts for and its vote on its tool's healthy latency, as a followed
    /// guard gives them ([`SessionGuard::identify`]), else both its session id's.
    pub(crate) fn identify(&self, call: &Call) -> (u64, u64) {
        match self.sessions.get() {
            Some(guard) => guard.identify(call),
            None => {
                let key = std::hash::BuildHasher::hash_one(&self.keys, call.session.as_str());
                (key, key)
            }
        }
    }
}
