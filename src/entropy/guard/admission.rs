//! How the session guard admits a call: the call arrives in its session's window, the
//! session's storm score and health set its budget factor, and its bucket (refilled at the
//! session's budget, at `probation` of it while the session is new) pays for the call or
//! refuses it with the wait until its own slot in the refill.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::returning::{SHORTEST_WAIT, Standing};
use super::session::{Pool, Session, secs_ns, weight_of};
use super::{SessionGuard, lock};
use crate::admit::Admission;
use crate::call::Call;
use crate::entropy::score::{budget_factor, distress, storm_score};
use crate::policy::Mode;
use crate::rejection::{Reason, Rejection, Scope};
use crate::stats::ns;

/// What an admitted call took from its session, to give back if a later stage refuses it.
/// The call counts as in flight for its session until the permit is dropped. A trial call
/// (see [`SessionGuard::accept`]) holds its tenant's newcomer place until then: the server's
/// success on it accepts the id with that place, a refund gives it back, and a call that ended
/// otherwise spends it.
#[derive(Debug)]
pub struct SessionPermit {
    charged: Option<(Arc<Mutex<Session>>, f64)>,
    trial: Option<(Arc<Pool>, u64)>,
}

impl SessionPermit {
    /// Nothing taken.
    const NONE: SessionPermit = SessionPermit {
        charged: None,
        trial: None,
    };
}

impl Drop for SessionPermit {
    fn drop(&mut self) {
        if let Some((entry, _)) = &self.charged {
            let mut s = lock(entry);
            s.in_flight = s.in_flight.saturating_sub(1);
        }
        if let Some((pool, key)) = &self.trial {
            pool.end_trial(*key);
        }
    }
}

impl Admission for SessionGuard {
    type Permit = SessionPermit;

    fn admit(&self, call: &Call) -> Result<SessionPermit, Rejection> {
        self.admit_at(call, Instant::now())
    }

    fn admit_at(&self, call: &Call, now: Instant) -> Result<SessionPermit, Rejection> {
        let config = self.config_of(call);
        if !config.enabled || call.target().is_none() {
            // Off, or protocol chatter (initialize, tools/list, ping): not the work guarded.
            return Ok(SessionPermit::NONE);
        }
        let now = self.at(now);
        let key = self.resource_key(call);
        let cost = f64::from(call.cost().max(1));
        // On an id the server has not accepted: how the call stands against its id's wait.
        // One that comes before it is charged to and judged by the pool's early state, so
        // clients calling through their hints do not storm the pool for the tenant's others.
        let id = call.session.key();
        let (entry, pool, standing) = match self.state(call) {
            Ok(s) => (s, None, None),
            Err(p) => {
                let standing = self.inner.returning.arrive(id, now);
                (
                    p.charged(standing == Standing::Early),
                    Some(p),
                    Some(standing),
                )
            }
        };
        let returning = standing == Some(Standing::Returned);
        let mut s = lock(&entry);
        let dt = Duration::from_nanos(now.saturating_sub(s.last)).as_secs_f64();
        let first = s.calls == 0;
        s.calls += 1;
        s.last = now;
        let window = config.window_size.get().as_secs_f64();
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
            budget_factor(
                s.score,
                config.entropy_coefficient.get(),
                config.min_factor.get(),
            )
        } else {
            1.0
        };
        // Cut at once; regained by steps only once the session is healthy again, so a storm
        // whose errors dip for a moment keeps its penalty.
        s.factor = if target <= s.factor || first {
            target
        } else if healthy || !policy.features.entropy_penalty {
            (s.factor + config.recover_step.get() * dt).min(target)
        } else {
            s.factor
        };
        s.note_storm();
        let (rate, reason) = match policy.mode {
            // Measured above; nothing refused.
            Mode::Off => return Ok(SessionPermit::NONE),
            Mode::Fixed => match policy.fixed.session_rate {
                Some(rate) => (rate.get(), Reason::FixedLimitExceeded),
                None => return Ok(SessionPermit::NONE),
            },
            Mode::Adaptive => (
                config.base_budget.get() * s.factor,
                Reason::SessionBudgetExceeded,
            ),
        };
        let cap = (config.burst.get() * rate / config.base_budget.get()).max(cost);
        // On probation (slow start): a full bucket, refilled at `trust` of the rate. A fixed
        // limit is the same for everyone.
        let trust = if policy.mode == Mode::Adaptive {
            s.trust
        } else {
            1.0
        };
        s.tokens = (s.tokens + rate * trust * dt).min(cap);
        // Consumption: admitted cost per second, decaying over one window.
        let tau = config.window_size.get().as_secs_f64();
        s.consumed *= (-dt / tau).exp();
        if s.tokens >= cost {
            s.tokens -= cost;
            s.consumed += cost / tau;
            s.start();
            drop(s);
            Ok(SessionPermit {
                charged: Some((entry, cost)),
                trial: None,
            })
        } else if let Some(pool) = pool.as_ref().filter(|_| returning)
            && pool.try_trial(id, now, &config)
        {
            // A call on an id the server has not accepted, which came back as told and which
            // its tenant's pool refuses: the id's trial, on a newcomer place, so a client that
            // reads its hints is not refused for what the pool's other clients did. Nothing of
            // the pool's bucket is taken.
            s.start();
            drop(s);
            Ok(SessionPermit {
                charged: Some((entry, 0.0)),
                trial: Some((pool.clone(), id)),
            })
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
            // The state is judged by its own wait (a pool as one client: ids made up per call
            // calling through it are ignoring it). The id of a call the pool refuses is told
            // when it may have its trial, if sooner: when a newcomer place is free, and at
            // least the shortest wait that shows it reads its hints.
            s.refused(now, window, Some(wait));
            let told = match pool.as_ref().and_then(|p| p.trial_in(id, now, &config)) {
                Some(place) => wait.min(place.max(SHORTEST_WAIT)),
                None => wait,
            };
            if pool.is_some() {
                let until = now.saturating_add(ns(told));
                self.inner.returning.told(id, until);
            }
            let reason = if reason != Reason::SessionBudgetExceeded {
                reason
            } else if s.factor < 1.0 {
                Reason::SessionStorm
            } else if trust < 1.0 {
                Reason::SessionProbation
            } else {
                reason
            };
            self.inner.rejected.count(reason);
            Err(Rejection::new(reason, Scope::AgentSession, told))
        }
    }

    fn refund(&self, mut permit: SessionPermit) {
        if let Some((entry, cost)) = &permit.charged {
            let mut s = lock(entry);
            s.tokens += cost;
            s.consumed -= cost / self.inner.config.load().window_size.get().as_secs_f64();
        }
        if let Some((pool, key)) = permit.trial.take() {
            pool.refund_trial(key, &self.inner.config.load());
        }
    }
}
