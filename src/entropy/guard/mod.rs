//! The session guard: per-session windows, health, storm score and budget.
//!
//! This module holds the guard itself: its table of accepted sessions and tenants' unverified
//! pools, the top-N view and its API. Its settings are in `config`, one session's state in
//! `session`, how a call is admitted ([`Admission`](crate::admit::Admission) for
//! [`SessionGuard`]) in `admission`, what the outcome hook teaches it in `learning`. It is the [`Judge`] of who a call's client is for the stages that count
//! clients.

mod admission;
mod config;
mod learning;
mod returning;
mod session;

pub use admission::SessionPermit;
pub use config::{ERRORS_ALLOWED, SessionConfig};
pub use session::{
    HINTS_CALLERS, HINTS_KEPT, HINTS_REACTION, UNVERIFIED_EARLY_PREFIX, UNVERIFIED_PREFIX,
};

use crate::error::ConfigError;
use std::any::Any;
use std::hash::{BuildHasher, Hash, Hasher, RandomState};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};

use crate::snapshot::{Live, Read};
use serde::Serialize;
use tokio::time::Instant;

use super::key::hash_arguments;
use super::window::SessionWindow;
use crate::admit::AdmitLayer;
use crate::bounded::{Bounded, OVERFLOW};
use crate::call::{Call, Name, SessionId, Tenant};
use crate::clients::Judge;
use crate::clients::sealed::Judging;
use crate::metrics;
use crate::outcome::Observer;
use crate::policy::{Mode, Switch};
use crate::stats::{Ewma, OwnBaselines, Recent, ToolBaselines, ns};
use config::{BASELINE_ALPHA, HEALTH_ALPHA};
use returning::Returning;
use session::{Pool, Session};

pub use crate::stats::MAX_TOOLS;

/// The one vote on a tool's healthy latency of all calls on ids the server has not accepted.
const UNVERIFIED_VOTER: u64 = u64::MAX;

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
    /// This guard's name in a call's record ([`Record`](crate::call::Record)), like no other
    /// guard's of the process.
    judge: usize,
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
    /// Which ids the pools refused came back as told.
    returning: Returning,
    /// Each tool's healthy service time, by a keyed hash of its name.
    tool_latency: ToolBaselines,
    top: Mutex<Vec<SessionSummary>>,
    /// The key of every resource key's hash, random per guard.
    keys: RandomState,
    /// `stormgate_session_rejected_total`.
    rejected: metrics::RefusalCounts,
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
        static NEXT_JUDGE: AtomicUsize = AtomicUsize::new(1);
        let guard = SessionGuard {
            inner: Arc::new(Inner {
                judge: NEXT_JUDGE.fetch_add(1, Ordering::Relaxed),
                overflow: Arc::new(Pool::new(&Tenant::new(OVERFLOW), &config, 0)),
                switch,
                epoch: Instant::now(),
                sessions: Bounded::new(),
                pools: Bounded::new(),
                returning: Returning::new(),
                tool_latency: ToolBaselines::new(),
                top: Mutex::new(Vec::new()),
                keys: RandomState::new(),
                rejected: metrics::RefusalCounts::total(metrics::SESSION_REJECTED),
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

    /// The guard's settings cell, for a control's snapshots.
    pub(crate) fn cell(&self) -> &Live<SessionConfig> {
        &self.inner.config
    }

    /// The settings `call` runs under (its request's snapshot's).
    pub(crate) fn config_of<'a>(&self, call: &'a Call) -> Read<'a, SessionConfig> {
        self.inner.config.read(call.snapshot())
    }

    fn session(id: SessionId, config: &SessionConfig, now: u64) -> Session {
        Session {
            id,
            window: SessionWindow::new(
                config.window_size.get(),
                config.buckets.get(),
                config.max_keys.get(),
            ),
            // Priors: healthy until shown otherwise.
            errors: Ewma::with_prior(HEALTH_ALPHA, 0.0),
            latency: Ewma::with_prior(HEALTH_ALPHA, 1.0),
            entropy_baseline: Ewma::new(BASELINE_ALPHA),
            own: OwnBaselines::default(),
            tokens: config.burst.get(),
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
        self.at(Instant::now())
    }

    /// `instant` in the guard's time: nanoseconds since its epoch.
    fn at(&self, instant: Instant) -> u64 {
        ns(instant.saturating_duration_since(self.inner.epoch))
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
        // The target by the key it carries (its text's keyed hash, taken once per call).
        h.write_u64(call.target_name().map_or(0, Name::key));
        if let (Some(tool), Some(args)) = (call.tool.as_deref(), call.arguments.as_ref())
            && self.inner.switch.of(call).mode != Mode::Off
        {
            let config = self.config_of(call);
            let pointers = config.resource_keys.get(tool).map(Vec::as_slice);
            hash_arguments(args, pointers, &mut h);
        }
        h.finish()
    }

    /// The tenant's unverified pool (made on first use; the shared one past `max_tenants`).
    fn pool(&self, tenant: &Tenant) -> Arc<Pool> {
        let config = self.inner.config.load();
        let now = self.now();
        let pools = &self.inner.pools;
        pools
            .get_or_insert(tenant.key(), config.max_tenants.get(), || {
                Arc::new(Pool::new(tenant, &config, now))
            })
            .unwrap_or_else(|| self.inner.overflow.clone())
    }

    /// Where a call is charged and judged: its session's state, once the MCP server has
    /// accepted the session, else its tenant's unverified pool (whose state it is charged to
    /// depends on the call: [`Pool::charged`]).
    fn state(&self, call: &Call) -> Result<Arc<Mutex<Session>>, Arc<Pool>> {
        match self.tracked(call) {
            Ok((_, s)) => Ok(s),
            Err(_) => Err(self.pool(&call.tenant)),
        }
    }

    /// The state of `pool` a call on an id not yet accepted arriving at `now` is charged to:
    /// the pool's, or its early state's if the call comes before its id's wait.
    fn charged(&self, pool: &Pool, call: &Call, now: u64) -> Arc<Mutex<Session>> {
        pool.charged(self.inner.returning.early(call.session.key(), now))
    }

    /// Tells the guard that the MCP server accepted `session` of `tenant`; the guard's observer
    /// calls it when the server minted the id on `initialize`, or answered with success a call
    /// on it that came back as told (so ids made up per call, which never come back, take no
    /// place; see the [module docs](crate::entropy)).
    /// The session gets its own state, on probation, if its tenant has a newcomer place (the
    /// one its trial call holds, if that was the call) and fewer than `max_sessions` are
    /// tracked; otherwise its calls stay in the tenant's unverified pool (and it may be
    /// accepted on a later success). Returns whether it is tracked now.
    pub fn accept(&self, session: &SessionId, tenant: &Tenant) -> bool {
        let sessions = &self.inner.sessions;
        let key = session.key();
        if sessions.get(key).is_some() {
            return true;
        }
        let config = self.inner.config.load();
        let now = self.now();
        let pool = self.pool(tenant);
        // Its trial call's place, or a place of its own.
        if !pool.end_trial(key) && !pool.admit_newcomer(now, &config) {
            return false;
        }
        let made = sessions.get_or_insert(key, config.max_sessions.get(), || {
            let mut s = Self::session(session.clone(), &config, now);
            s.trust = config.probation.get();
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
    /// key of its tenant's unverified pool: the tenant's key, inverted, so it meets a
    /// session's (the tenant's own name as a session among them) only by a 64-bit accident.
    /// Once found, the session is kept in the call's [`Record`]: one lookup per call.
    ///
    /// [`Record`]: crate::call::Record
    fn tracked(&self, call: &Call) -> Result<(u64, Arc<Mutex<Session>>), u64> {
        let key = call.session.key();
        call.record()
            .found(self.inner.judge, || {
                let s = self.inner.sessions.get(key)?;
                Some(s as Arc<dyn Any + Send + Sync>)
            })
            .and_then(|s| s.downcast::<Mutex<Session>>().ok())
            .map(|s| (key, s))
            .ok_or_else(|| !call.tenant.key())
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
            Err(pool) => (
                pool,
                self.inner
                    .pools
                    .get(!pool)
                    .map(|p| self.charged(&p, call, self.now())),
            ),
        };
        let allowance = match state {
            Some(s) if config.enabled => {
                let s = lock(&s);
                config.base_budget.get() * s.factor * s.trust
            }
            _ => f64::INFINITY,
        };
        (client, allowance)
    }

    /// Whether `session` has its own state (the MCP server accepted it).
    pub fn is_tracked(&self, session: &SessionId) -> bool {
        let sessions = &self.inner.sessions;
        sessions.get(session.key()).is_some()
    }

    /// The current storm score, entropy and budget factor of a session.
    pub fn summary(&self, id: &SessionId) -> Option<SessionSummary> {
        let sessions = &self.inner.sessions;
        let s = sessions.get(id.key())?;
        let s = lock(&s);
        Some(self.summarize(&s))
    }

    /// The same for a tenant's unverified pool, if it has one.
    pub fn unverified(&self, tenant: &Tenant) -> Option<SessionSummary> {
        let pools = &self.inner.pools;
        let p = pools.get(tenant.key())?;
        let s = lock(&p.state);
        Some(self.summarize(&s))
    }

    /// Tenants with an unverified pool now.
    pub fn pools(&self) -> usize {
        self.inner.pools.len()
    }

    fn summarize(&self, s: &Session) -> SessionSummary {
        SessionSummary {
            call_rate: s.window.total() as f64
                / self.inner.config.load().window_size.get().as_secs_f64(),
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
        let ttl = ns(config.idle_ttl.get());
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
        self.inner.pools.retain(|p| keep(&p.state) | keep(&p.early));
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
            let mut interval = tokio::time::interval_at(Instant::now() + every.get(), every.get());
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

/// The budget and the breakers count clients as the guard judges them.
impl Judge for SessionGuard {}

impl Judging for SessionGuard {
    fn allowance(&self, call: &Call) -> (u64, f64) {
        SessionGuard::allowance(self, call)
    }

    fn identify(&self, call: &Call) -> (u64, u64) {
        SessionGuard::identify(self, call)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::call::Record;

    /// A call as the classifier makes it: its record kept.
    fn classified(session: &str) -> Call {
        let mut call = Call::request("tools/call")
            .with_tool("search")
            .with_session(SessionId::new(session));
        call.pipeline.record = Record::kept();
        call
    }

    #[tokio::test]
    async fn a_call_found_accepted_is_judged_so_for_the_whole_call() {
        let guard = SessionGuard::new(SessionConfig::default()).unwrap();
        let tenant = Tenant::anonymous();
        let (a, b) = (SessionId::new("a"), SessionId::new("b"));
        assert!(guard.accept(&a, &tenant));
        let pool = !tenant.key();
        // Found accepted: stays so for the call, though the session is forgotten meanwhile.
        let on_a = classified("a");
        assert_eq!(guard.identify(&on_a), (a.key(), a.key()));
        guard.inner.sessions.retain(|_| false);
        assert_eq!(guard.identify(&on_a), (a.key(), a.key()));
        assert_eq!(guard.allowance(&on_a).0, a.key());
        // A call built by hand, a copy and a new call are looked up afresh.
        let by_hand = Call::request("tools/call")
            .with_tool("search")
            .with_session(a.clone());
        assert_eq!(guard.identify(&by_hand), (pool, UNVERIFIED_VOTER));
        assert_eq!(guard.identify(&on_a.clone()), (pool, UNVERIFIED_VOTER));
        assert_eq!(guard.identify(&classified("a")), (pool, UNVERIFIED_VOTER));
        // Not accepted yet: looked up again, so an id accepted while its call runs is judged
        // accepted by the stages after.
        let on_b = classified("b");
        assert_eq!(guard.identify(&on_b), (pool, UNVERIFIED_VOTER));
        assert!(guard.accept(&b, &tenant));
        assert_eq!(guard.identify(&on_b), (b.key(), b.key()));
        // Another guard does not read this one's record.
        let other = SessionGuard::new(SessionConfig::default()).unwrap();
        assert_eq!(other.identify(&on_a), (pool, UNVERIFIED_VOTER));
        assert!(other.accept(&b, &tenant));
        assert_eq!(other.identify(&on_b), (b.key(), b.key()));
    }
}
