//! What the guard learns from the outcome hook ([`Observer`] for [`SessionGuard`]): from each
//! finished call, its tool's healthy latency, the health of the session or pool it was
//! charged to, the backend time it held past that latency, and probation's slow start and
//! end; from the refusals of other stages, the client's calls and the waits it was told to
//! honour. Admission reads what this writes.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::returning::Standing;
use super::session::{Session, weight_of};
use super::{SessionGuard, UNVERIFIED_VOTER, lock};
use crate::call::{Call, Name};
use crate::entropy::score::storm_score;
use crate::outcome::{Observation, Observer, Outcome};
use crate::policy::Mode;
use crate::rejection::{Rejection, Scope};

impl SessionGuard {
    /// Learns from a finished call of `tool`: its tool's healthy latency, and the health of
    /// the state it was charged to (`tracked`, with its key, else its tenant's pool).
    fn learn(&self, tool: &Name, o: &Observation<'_>, tracked: Option<(Arc<Mutex<Session>>, u64)>) {
        let config = self.config_of(o.call);
        let secs = o.service_time.as_secs_f64().max(1e-6);
        let floor = config.latency_floor.as_secs_f64();
        let cancelled = o.outcome == Outcome::Cancelled;
        // The tool's healthy latency learns from every call nothing held back; being the
        // minimum of five minutes' period means, a slowdown does not teach it for five minutes.
        let learns = !cancelled && !o.outcome.is_failure() && o.queue_wait.is_zero();
        let now = Duration::from_nanos(self.at(o.at));
        // Its state and its vote on the tool's latency: its session's, or its tenant's pool
        // and the one vote of every call on an id the server has not accepted.
        let (entry, voter) = match tracked {
            Some(tracked) => tracked,
            None => {
                let pool = self.inner.pools.get(o.call.tenant.key());
                let pool = pool.as_deref().unwrap_or(&self.inner.overflow);
                let last = self.inner.returning.last(o.call.session.key());
                (
                    pool.charged(last == Some(Standing::Early)),
                    UNVERIFIED_VOTER,
                )
            }
        };
        let tools = &self.inner.tool_latency;
        let key = tool.key();
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
            let extra = f64::from(o.call.cost().max(1)) * (secs - c) / c.max(floor).max(1e-6);
            s.tokens = (s.tokens - extra).max(-config.burst.get());
            s.consumed += extra / config.window_size.get().as_secs_f64();
        }
        if cancelled && ratio <= config.latency_tolerance.get() {
            // A call its client gave up on ran at least this long: evidence of slowness when
            // that is already too slow, of nothing otherwise.
            return;
        }
        let healthy =
            !cancelled && !o.outcome.is_failure() && ratio <= config.latency_tolerance.get();
        s.finished += 1;
        s.errors
            .update(if o.outcome.is_failure() { 1.0 } else { 0.0 });
        if o.outcome.is_failure() {
            s.failures
                .add(self.now(), config.window_size.get().as_secs_f64(), 1.0);
        }
        s.latency.update(ratio);
        if s.pool || s.probation.is_some() {
            // Slow start: a healthy call doubles the share of the rate, an unhealthy one
            // halves it (down to where probation starts).
            s.trust = if healthy {
                (s.trust * 2.0).min(1.0)
            } else {
                (s.trust / 2.0).max(config.probation.get())
            };
        }
        // Probation ends after `min_calls` finished calls, healthy: the full rate, and the
        // newcomer place goes back to the tenant. A session not healthy by then keeps the
        // place until it is swept.
        let well = s.errors.value().unwrap_or(0.0) <= config.error_tolerance.get()
            && s.latency.value().unwrap_or(1.0) <= config.latency_tolerance.get();
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
        let key = o.call.session.key();
        let tracked = self.tracked(o.call).ok().map(|(key, s)| (s, key));
        let accepted = tracked.is_some();
        if o.outcome != Outcome::ClientError
            && self.config_of(o.call).enabled
            && let Some(tool) = o.call.target_name()
        {
            self.learn(tool, o, tracked);
        }
        // The server minted this id, or answered with success a call on it that came back as
        // told (made-up ids, which never come back, take no newcomer place): a real session.
        // An id minted while its tenant has no place was told nothing: its first call comes
        // back as told (it cost the client a round trip, and the server chose it).
        if accepted || o.outcome != Outcome::Ok {
            return;
        }
        if o.call.method.as_deref() == Some("initialize") {
            if !self.accept(&o.call.session, &o.call.tenant) {
                self.inner.returning.minted(key, self.now());
            }
        } else if self.inner.returning.last(key) == Some(Standing::Returned) {
            self.accept(&o.call.session, &o.call.tenant);
        }
    }

    /// The budget's refusals (scopes `global` and `tenant`) come before the call reaches the
    /// guard, so the guard sees such a call only here: it is counted as the client's call, in
    /// its window, and its wait as one of the last [`HINTS_KEPT`] its next calls must honour;
    /// its score is brought up to date. The guard notes its own refusals where it makes them;
    /// the later stages' (a tool's breaker, a resource's queue) say that one tool or resource
    /// is busy, not the client, and only count in its refused share.
    ///
    /// [`HINTS_KEPT`]: super::HINTS_KEPT
    fn refused(&self, call: &Call, r: &Rejection) {
        let config = self.config_of(call);
        if !config.enabled || call.target().is_none() || r.scope() == Scope::AgentSession {
            return;
        }
        let now = self.now();
        let window = config.window_size.get().as_secs_f64();
        let before = matches!(r.scope(), Scope::Global | Scope::Tenant);
        let key = if before { self.resource_key(call) } else { 0 };
        let entry = match self.state(call) {
            Ok(s) => s,
            Err(pool) => self.charged(&pool, call, now),
        };
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
