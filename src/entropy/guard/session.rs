//! One session's state ([`Session`]) and a tenant's unverified pool ([`Pool`]), each behind
//! its own mutex and touched only by its own calls: the window, health, refusal hints, storm
//! state and budget, and what a call does to them as it arrives, starts and is refused; with
//! the constants that bound the hints a session is judged by and mark a storm. The guard's
//! table holds these; nothing here reaches the table.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use super::SessionGuard;
use super::config::{ERRORS_ALLOWED, SessionConfig};
use crate::call::{Call, SessionId, Tenant};
use crate::entropy::score::{HINTS_IGNORED_ALLOWED, Signals, Tolerances};
use crate::entropy::window::SessionWindow;
use crate::stats::{Ewma, OwnBaselines, Recent, ns};

/// How a tenant's unverified pool is named in the top-N view: this, then the tenant.
pub const UNVERIFIED_PREFIX: &str = "~unverified:";

/// How the state of a tenant's ids not yet accepted that came back before their waits is
/// named in the top-N view: this, then the tenant.
pub const UNVERIFIED_EARLY_PREFIX: &str = "~unverified-early:";

/// One session's state (or a tenant's unverified pool); its own mutex, touched only by its
/// own calls.
#[derive(Debug)]
pub(super) struct Session {
    pub(super) id: SessionId,
    pub(super) window: SessionWindow,
    pub(super) errors: Ewma,
    pub(super) latency: Ewma,
    pub(super) entropy_baseline: Ewma,
    /// Its own healthy latency per tool it calls.
    pub(super) own: OwnBaselines,
    pub(super) tokens: f64,
    pub(super) factor: f64,
    pub(super) score: f64,
    pub(super) last: u64,
    pub(super) consumed: f64,
    pub(super) calls: u64,
    /// Calls that finished (their outcome observed).
    pub(super) finished: u64,
    /// Failures within about one window (decaying with the window as time constant).
    pub(super) failures: Recent,
    /// When the last refusal told a client to come back, ns: the next refusal's wait starts
    /// after it, so the hints of a burst are spread over the refill instead of colliding.
    pub(super) hinted: u64,
    /// When its last [`HINTS_KEPT`] refusals told it to come back, ns (a ring, `next` the
    /// oldest). A call arriving while its last [`callers`](Self::callers) are all still ahead
    /// comes from a client that is not waiting for them.
    pub(super) waits: [u64; HINTS_KEPT],
    pub(super) next: usize,
    /// Its calls admitted and not yet over (answered, dropped or refunded).
    pub(super) in_flight: u32,
    /// When its last call arrived, ns, and how many arrived in a row each within
    /// [`HINTS_REACTION`] of the one before (sent at once, by as many callers).
    pub(super) arrived_at: u64,
    pub(super) burst: u32,
    /// The most calls it has had in flight at once, or sent at once: how many callers it has
    /// shown it runs, each of which may be waiting a hint of its own.
    pub(super) callers: u32,
    /// When its last refusal was given, ns, and how many refusals in a row came within
    /// [`HINTS_REACTION`] of the one before (one burst or batch, refused at once).
    pub(super) refused_at: u64,
    pub(super) quick: usize,
    /// Its calls that arrived so, within about a window.
    pub(super) ignored: Recent,
    /// Its calls (refused before the guard or not), and those refused by any stage, within
    /// about a window.
    pub(super) asked: Recent,
    pub(super) refusals: Recent,
    pub(super) rejected: u64,
    /// In the storm state (logged on entry and exit): entered when the factor falls below
    /// [`STORM_ENTER`], left when it is back at [`STORM_LEAVE`] or above.
    pub(super) storm: bool,
    /// The share of its budget's rate that refills its bucket: below 1 on probation, doubled
    /// by each healthy finished call.
    pub(super) trust: f64,
    /// On probation: the pool whose newcomer place it holds, given back when it graduates.
    pub(super) probation: Option<Arc<Pool>>,
    /// A tenant's unverified pool: on probation for good.
    pub(super) pool: bool,
}

/// A tenant's unverified pool: the one session state charged for every call of the tenant on
/// an id the MCP server has not accepted (so ids made up per call are one session here), the
/// one charged for such calls that came back before the wait their id was told (so clients
/// that call through their hints do not storm the pool for the tenant's new clients), and the
/// tenant's newcomer places: what accepting an id, or its trial call, takes.
#[derive(Debug)]
pub(super) struct Pool {
    pub(super) state: Arc<Mutex<Session>>,
    pub(super) early: Arc<Mutex<Session>>,
    newcomers: Mutex<Newcomers>,
}

/// A tenant's newcomer places, and the ids that had a trial call.
#[derive(Debug)]
struct Newcomers {
    /// Places free now, and when they were last refilled, ns.
    places: f64,
    refilled: u64,
    /// The last [`TRIALS_KEPT`] ids (keys) that had a trial call, oldest first, and whether
    /// it is still in flight (holding its place until it ends). An id gets one trial: one
    /// that ended without success (its calls fail, or time out) does not take place after
    /// place from the tenant's new clients.
    trials: Vec<(u64, bool)>,
}

/// The ids with a trial call a tenant's pool remembers (the oldest ended one is forgotten for
/// a new one; none is taken while all are in flight).
const TRIALS_KEPT: usize = 16;

impl Pool {
    pub(super) fn new(tenant: &Tenant, config: &SessionConfig, now: u64) -> Self {
        let state = |prefix: &str, tokens: f64| {
            let id = SessionId::new(format!("{prefix}{tenant}"));
            let mut state = SessionGuard::session(id, config, now);
            state.pool = true;
            state.trust = config.probation.get();
            state.tokens = tokens;
            Arc::new(Mutex::new(state))
        };
        Pool {
            state: state(UNVERIFIED_PREFIX, config.burst.get()),
            // Calls that did not wait their hints earn nothing at once: its bucket starts
            // empty, refilled at probation's share of the budget.
            early: state(UNVERIFIED_EARLY_PREFIX, 0.0),
            newcomers: Mutex::new(Newcomers {
                places: config.new_session_burst.get(),
                refilled: now,
                trials: Vec::new(),
            }),
        }
    }

    fn newcomers(&self) -> std::sync::MutexGuard<'_, Newcomers> {
        self.newcomers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes a newcomer place, if the tenant has one.
    pub(super) fn admit_newcomer(&self, now: u64, config: &SessionConfig) -> bool {
        self.newcomers().take(now, config)
    }

    /// Gives a newcomer place back.
    pub(super) fn release_newcomer(&self, config: &SessionConfig) {
        self.newcomers().release(config);
    }

    /// A trial call for the id `key`, which this pool refuses: it takes a newcomer place, if
    /// the tenant has one and the id has had no trial it remembers.
    pub(super) fn try_trial(&self, key: u64, now: u64, config: &SessionConfig) -> bool {
        let mut n = self.newcomers();
        if n.tried(key) {
            return false;
        }
        let full = n.trials.len() >= TRIALS_KEPT;
        let ended = n.trials.iter().position(|&(_, in_flight)| !in_flight);
        if (full && ended.is_none()) || !n.take(now, config) {
            return false;
        }
        if let (true, Some(i)) = (full, ended) {
            n.trials.remove(i);
        }
        n.trials.push((key, true));
        true
    }

    /// How long until the id `key`, refused by this pool, could have its trial: until a
    /// newcomer place is free (`ZERO` if one is now); `None` if it has had its trial.
    pub(super) fn trial_in(&self, key: u64, now: u64, config: &SessionConfig) -> Option<Duration> {
        let n = self.newcomers();
        if n.tried(key) {
            return None;
        }
        let short = (1.0 - n.at(now, config)).max(0.0);
        let secs = short / config.new_session_rate.get();
        Some(Duration::try_from_secs_f64(secs).unwrap_or(Duration::MAX))
    }

    /// The state a call on an id not yet accepted is charged to and judged by: the pool's,
    /// or, for a call that came before its id's wait, the early state's.
    pub(super) fn charged(&self, early: bool) -> Arc<Mutex<Session>> {
        if early {
            self.early.clone()
        } else {
            self.state.clone()
        }
    }

    /// The trial of the id `key` is over; whether it was in flight (its place is then the
    /// caller's, to accept the id with).
    pub(super) fn end_trial(&self, key: u64) -> bool {
        let mut n = self.newcomers();
        match n.trials.iter_mut().find(|(k, _)| *k == key) {
            Some((_, in_flight)) => std::mem::replace(in_flight, false),
            None => false,
        }
    }

    /// The trial of the id `key` never ran: its place is given back, and the id forgotten.
    pub(super) fn refund_trial(&self, key: u64, config: &SessionConfig) {
        let mut n = self.newcomers();
        if let Some(i) = n
            .trials
            .iter()
            .position(|&(k, in_flight)| k == key && in_flight)
        {
            n.trials.remove(i);
            n.release(config);
        }
    }
}

impl Newcomers {
    /// Gives a place back.
    fn release(&mut self, config: &SessionConfig) {
        self.places = (self.places + 1.0).min(config.new_session_burst.get());
    }

    /// Whether the id `key` had a trial it remembers.
    fn tried(&self, key: u64) -> bool {
        self.trials.iter().any(|&(k, _)| k == key)
    }

    /// The places free at `now`, refilled since they were last counted.
    fn at(&self, now: u64, config: &SessionConfig) -> f64 {
        let dt = Duration::from_nanos(now.saturating_sub(self.refilled)).as_secs_f64();
        (self.places + config.new_session_rate.get() * dt).min(config.new_session_burst.get())
    }

    /// Refills the places to `now` and takes one, if there is one.
    fn take(&mut self, now: u64, config: &SessionConfig) -> bool {
        self.places = self.at(now, config);
        self.refilled = now;
        if self.places >= 1.0 {
            self.places -= 1.0;
            true
        } else {
            false
        }
    }
}

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
pub(super) fn secs_ns(secs: f64) -> u64 {
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
    pub(super) fn arrive(&mut self, now: u64, window: f64, key: u64, weight: u32) {
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
    pub(super) fn start(&mut self) {
        self.in_flight = self.in_flight.saturating_add(1);
        self.callers = self.callers.max(self.in_flight);
    }

    /// One of its calls was refused now; with `wait`, the refusal told the whole client (its
    /// session's budget or share is spent) to come back after it.
    pub(super) fn refused(&mut self, now: u64, window: f64, wait: Option<Duration>) {
        self.refusals.add(now, window, 1.0);
        let Some(wait) = wait else { return };
        self.quick = if now.saturating_sub(self.refused_at) < REACTION_NS {
            self.quick.saturating_add(1)
        } else {
            0
        };
        self.refused_at = now;
        self.waits[self.next] = now.saturating_add(ns(wait));
        self.next = (self.next + 1) % HINTS_KEPT;
    }

    /// What its score is computed from now, and the tolerances it is judged by.
    pub(super) fn signals(&self, now: u64, config: &SessionConfig) -> (Signals, Tolerances) {
        let window = config.window_size.get().as_secs_f64();
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
            error_rate: config.error_tolerance.get(),
            latency_ratio: config.latency_tolerance.get(),
            ignored_hints: HINTS_IGNORED_ALLOWED,
        };
        (signals, tolerances)
    }

    /// Logs a change of storm state (the session as a hash: its id is the client's choice).
    pub(super) fn note_storm(&mut self) {
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

/// What a call counts for in its session's window: its weight, or one.
pub(super) fn weight_of(call: &Call, config: &SessionConfig) -> u32 {
    if config.weighted {
        call.cost().max(1)
    } else {
        1
    }
}
