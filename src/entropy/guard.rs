//! The session guard: per-session windows, health, storm score and budget.

use crate::error::ConfigError;
use std::collections::BTreeMap;
use std::hash::{BuildHasherDefault, DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use arc_swap::ArcSwap;
use dashmap::DashMap;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::time::Instant;

use super::score::{Signals, Tolerances, budget_factor, distress, storm_score};
use super::window::SessionWindow;
use crate::admit::{Admission, AdmitLayer};
use crate::budget::Ewma;
use crate::call::{Call, SessionId};
use crate::metrics;
use crate::outcome::{Observation, Observer, Outcome};
use crate::policy::{Mode, Switch};
use crate::rejection::{Reason, Rejection, Scope};

/// The session calls past `max_sessions` share.
pub const OVERFLOW_SESSION: &str = "~overflow";
/// Smoothing of a session's error rate and latency ratio, per finished call.
const HEALTH_ALPHA: f64 = 0.2;
/// Smoothing of a session's healthy entropy baseline and of each tool's healthy latency.
const BASELINE_ALPHA: f64 = 0.05;

/// Session guard settings (seed 003 sections 2.1-2.3, 4.2, 5.2).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SessionConfig {
    /// Whether the guard runs. Default true.
    pub enabled: bool,
    /// Sliding window of a session's calls (`window_size_ms`). Default 10 s (seed 4.2).
    #[serde(rename = "window_size_ms", with = "crate::duration_ms")]
    pub window_size: Duration,
    /// Buckets the window is split into. Default 10.
    pub buckets: usize,
    /// Count calls by their weight instead of one each (seed 2.1's weighted window).
    /// Default false.
    pub weighted: bool,
    /// Distinct keys stored per window; calls of further new keys count as keys seen once.
    /// Default 64.
    pub max_keys: usize,
    /// Per tool, JSON pointers into its arguments that make its resource key (e.g.
    /// `["/namespace", "/table"]`). Tools not listed use a short hash of their canonical
    /// arguments, so the same search with ever-new queries looks diverse.
    pub resource_keys: BTreeMap<String, Vec<String>>,
    /// A session's budget when healthy, cost units per second. Default 5 (stormgate's choice).
    pub base_budget: f64,
    /// Bucket size, cost units. Default 10 (stormgate's choice).
    pub burst: f64,
    /// How hard the storm score cuts the budget: factor `exp(-coefficient x score)`.
    /// Default 0.2 (seed 4.2: start at 0.2; too large catches complex tasks).
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
    /// the ratio (`latency_floor_ms`): milliseconds of noise on a sub-millisecond tool are not
    /// distress. Default 5 ms.
    #[serde(rename = "latency_floor_ms", with = "crate::duration_ms")]
    pub latency_floor: Duration,
    /// Finished calls a session needs before its health or storm score may cut its budget
    /// (evidence before penalty). Default 5.
    pub min_calls: u32,
    /// Sessions tracked at most; past it, new sessions share one overflow session, and no
    /// tracked session is evicted for them. Default 100 000.
    pub max_sessions: usize,
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
            base_budget: 5.0,
            burst: 10.0,
            entropy_coefficient: 0.2,
            min_factor: 0.02,
            recover_step: 0.1,
            error_tolerance: 0.05,
            latency_tolerance: 1.5,
            latency_floor: Duration::from_millis(5),
            min_calls: 5,
            max_sessions: 100_000,
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

/// One session's state; its own mutex, touched only by its own calls.
#[derive(Debug)]
struct Session {
    id: SessionId,
    window: SessionWindow,
    errors: Ewma,
    latency: Ewma,
    entropy_baseline: Ewma,
    tokens: f64,
    factor: f64,
    score: f64,
    last: u64,
    consumed: f64,
    calls: u64,
    /// Calls that finished (their outcome observed).
    finished: u64,
    rejected: u64,
    /// In the storm state (logged on entry and exit): entered when the factor falls below
    /// [`STORM_ENTER`], left when it is back at [`STORM_LEAVE`] or above.
    storm: bool,
}

/// A session whose budget factor falls below this is logged as entering a storm.
const STORM_ENTER: f64 = 0.5;
/// A session in a storm whose factor is back at this or above is logged as leaving it.
const STORM_LEAVE: f64 = 0.9;

impl Session {
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
    config: ArcSwap<SessionConfig>,
    epoch: Instant,
    /// Keyed by a 64-bit hash of the session id: no string is hashed twice or compared on
    /// the hot path (two ids colliding share a state; at a million sessions the odds are about
    /// 3 in 100 million).
    sessions: DashMap<u64, Arc<Mutex<Session>>, BuildHasherDefault<PassThrough>>,
    overflow: Arc<Mutex<Session>>,
    tool_latency: DashMap<String, Mutex<Ewma>>,
    top: Mutex<Vec<SessionSummary>>,
}

impl std::fmt::Debug for SessionGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionGuard")
            .field("sessions", &self.inner.sessions.len())
            .field("config", &self.inner.config.load())
            .finish()
    }
}

/// What an admitted call took from its session, to give back if a later stage refuses it.
#[derive(Debug)]
pub struct SessionPermit(Option<(Arc<Mutex<Session>>, f64)>);

/// The map's hasher: its keys are already uniform 64-bit hashes.
#[derive(Debug, Default, Clone, Copy)]
struct PassThrough(u64);

impl Hasher for PassThrough {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

fn session_key(id: &SessionId) -> u64 {
    let mut h = DefaultHasher::new();
    id.as_str().hash(&mut h);
    h.finish()
}

fn lock(s: &Mutex<Session>) -> std::sync::MutexGuard<'_, Session> {
    s.lock().unwrap_or_else(PoisonError::into_inner)
}

fn hash_value(v: &Value, h: &mut DefaultHasher) {
    match v {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            h.write_u8(b'{');
            for k in keys {
                k.hash(h);
                hash_value(&map[k], h);
            }
        }
        Value::Array(items) => {
            h.write_u8(b'[');
            for i in items {
                hash_value(i, h);
            }
        }
        other => other.to_string().hash(h),
    }
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
                overflow: Arc::new(Mutex::new(Self::session(
                    SessionId::new(OVERFLOW_SESSION),
                    &config,
                ))),
                switch,
                epoch: Instant::now(),
                sessions: DashMap::default(),
                tool_latency: DashMap::new(),
                top: Mutex::new(Vec::new()),
                config: ArcSwap::from_pointee(config),
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

    fn session(id: SessionId, config: &SessionConfig) -> Session {
        Session {
            id,
            window: SessionWindow::new(config.window_size, config.buckets, config.max_keys),
            // Priors: healthy until shown otherwise.
            errors: Ewma::with_prior(HEALTH_ALPHA, 0.0),
            latency: Ewma::with_prior(HEALTH_ALPHA, 1.0),
            entropy_baseline: Ewma::new(BASELINE_ALPHA),
            tokens: config.burst,
            factor: 1.0,
            score: 0.0,
            last: 0,
            consumed: 0.0,
            calls: 0,
            finished: 0,
            rejected: 0,
            storm: false,
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
        self.inner.config.load_full()
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
    /// or a short hash of its canonical arguments; the uri of a `resources/read`; the name of a
    /// `prompts/get`.
    pub fn resource_key(&self, call: &Call) -> u64 {
        let mut h = DefaultHasher::new();
        call.method.hash(&mut h);
        call.target().hash(&mut h);
        if let (Some(tool), Some(args)) = (call.tool.as_deref(), call.arguments()) {
            let config = self.inner.config.load();
            let pointers = config.resource_keys.get(tool);
            if let Ok(value) = serde_json::from_str::<Value>(args) {
                match pointers {
                    Some(ps) => {
                        for p in ps {
                            match value.pointer(p) {
                                Some(v) => hash_value(v, &mut h),
                                None => h.write_u8(0),
                            }
                        }
                    }
                    None => hash_value(&value, &mut h),
                }
            }
        }
        h.finish()
    }

    fn entry(&self, id: &SessionId) -> Arc<Mutex<Session>> {
        let key = session_key(id);
        if let Some(s) = self.inner.sessions.get(&key) {
            return s.clone();
        }
        let config = self.inner.config.load();
        if self.inner.sessions.len() >= config.max_sessions {
            return self.inner.overflow.clone();
        }
        self.inner
            .sessions
            .entry(key)
            .or_insert_with(|| Arc::new(Mutex::new(Self::session(id.clone(), &config))))
            .clone()
    }

    /// The current storm score, entropy and budget factor of a session.
    pub fn summary(&self, id: &SessionId) -> Option<SessionSummary> {
        let s = self.inner.sessions.get(&session_key(id))?;
        let s = lock(&s);
        Some(self.summarize(&s))
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

    /// Forgets sessions unseen for `idle_ttl` and refreshes the top-N view. The sweeper calls
    /// it; tests may call it directly. Returns the sessions forgotten.
    pub fn sweep(&self) -> usize {
        let now = self.now();
        let config = self.inner.config.load();
        let ttl = u64::try_from(config.idle_ttl.as_nanos()).unwrap_or(u64::MAX);
        let before = self.inner.sessions.len();
        let n = config.top_n;
        let mut top: Vec<SessionSummary> = Vec::with_capacity(n + 1);
        self.inner.sessions.retain(|_, s| {
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
        });
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
                SessionGuard { inner }.sweep();
            }
        })
    }

    fn tool_baseline(&self, tool: &str) -> Option<f64> {
        self.inner
            .tool_latency
            .get(tool)
            .and_then(|e| e.lock().unwrap_or_else(PoisonError::into_inner).value())
    }
}

impl Admission for SessionGuard {
    type Permit = SessionPermit;

    fn admit(&self, call: &Call) -> Result<SessionPermit, Rejection> {
        let config = self.inner.config.load();
        if !config.enabled || call.target().is_none() {
            // Off, or protocol chatter (initialize, tools/list, ping): not the work guarded.
            return Ok(SessionPermit(None));
        }
        let now = self.now();
        let key = self.resource_key(call);
        let cost = f64::from(call.cost.max(1));
        let entry = self.entry(&call.session);
        let mut s = lock(&entry);
        let dt = Duration::from_nanos(now.saturating_sub(s.last)).as_secs_f64();
        let first = s.calls == 0;
        s.calls += 1;
        s.last = now;
        let weight = if config.weighted { call.cost.max(1) } else { 1 };
        s.window.record(Duration::from_nanos(now), key, weight);
        let signals = Signals {
            entropy: s.window.entropy(),
            entropy_baseline: s.entropy_baseline.value(),
            error_rate: s.errors.value().unwrap_or(0.0),
            latency_ratio: s.latency.value().unwrap_or(1.0),
        };
        let t = &Tolerances {
            error_rate: config.error_tolerance,
            latency_ratio: config.latency_tolerance,
        };
        let healthy = distress(&signals, t) == 0.0;
        if healthy {
            s.entropy_baseline.update(signals.entropy);
        }
        s.score = storm_score(&signals, t);
        let policy = self.inner.switch.load();
        let evidence = s.finished >= u64::from(config.min_calls);
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
        s.tokens = (s.tokens + rate * dt).min(cap);
        // Consumption: admitted cost per second, decaying over one window.
        let tau = config.window_size.as_secs_f64();
        s.consumed *= (-dt / tau).exp();
        if s.tokens >= cost {
            s.tokens -= cost;
            s.consumed += cost / tau;
            drop(s);
            Ok(SessionPermit(Some((entry, cost))))
        } else {
            s.rejected += 1;
            let wait = (cost - s.tokens) / rate;
            ::metrics::counter!(metrics::SESSION_REJECTED).increment(1);
            Err(Rejection::new(
                reason,
                Scope::AgentSession,
                Duration::from_secs_f64(wait.max(0.001)),
            ))
        }
    }

    fn refund(&self, permit: SessionPermit) {
        if let Some((entry, cost)) = permit.0 {
            let mut s = lock(&entry);
            s.tokens += cost;
            s.consumed -= cost / self.inner.config.load().window_size.as_secs_f64();
        }
    }
}

impl Observer for SessionGuard {
    fn observe(&self, o: &Observation<'_>) {
        let config = self.inner.config.load();
        if !config.enabled || o.outcome == Outcome::ClientError {
            return;
        }
        let Some(tool) = o.call.target() else {
            return;
        };
        let secs = o.service_time.as_secs_f64().max(1e-6);
        let floor = config.latency_floor.as_secs_f64();
        let ratio = self.tool_baseline(tool).map_or(1.0, |b| {
            let ratio = secs / b.max(1e-6);
            // Within the floor of its healthy latency: noise, not slowness.
            if secs <= b + floor {
                ratio.min(1.0)
            } else {
                ratio
            }
        });
        let cancelled = o.outcome == Outcome::Cancelled;
        if cancelled && ratio <= config.latency_tolerance {
            // A call its client gave up on ran at least this long: evidence of slowness when
            // that is already too slow, of nothing otherwise.
            return;
        }
        if !cancelled && !o.outcome.is_failure() && ratio <= config.latency_tolerance {
            self.inner
                .tool_latency
                .entry(tool.to_owned())
                .or_insert_with(|| Mutex::new(Ewma::new(BASELINE_ALPHA)))
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .update(secs);
        }
        let key = session_key(&o.call.session);
        let Some(entry) = self.inner.sessions.get(&key).map(|e| e.clone()) else {
            return;
        };
        let mut s = lock(&entry);
        s.finished += 1;
        s.errors
            .update(if o.outcome.is_failure() { 1.0 } else { 0.0 });
        s.latency.update(ratio);
    }
}
