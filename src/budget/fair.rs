//! Fair shares inside a shared bucket: which clients are light, under theirs.
//!
//! A bucket many clients draw from is first come, first served: whoever calls most takes the
//! burst, and a light caller arriving after it is refused. So each client's recent demand is
//! kept (cost units asked per second, admitted or not, decaying over [`MEMORY`]: a client
//! refused a lot is still heavy), and at every tick each group's
//! (a tenant's, or the whole budget's) fair share per client is its rate divided among its
//! active clients (those that asked in the last [`ASKED`], admitted or not). A client using
//! at most [`LIGHT`] of its fair part (this call included) is light: it may spend the bucket's
//! reserve ([`Gcra::try_take_reserved`](super::Gcra::try_take_reserved)); the others see the
//! plain bucket, so when the bucket is contended the refusals fall on those above their share,
//! and when everyone is at its share nobody has a reserve.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::bounded::Bounded;

/// How long a client's demand keeps counting (its time constant).
pub(crate) const MEMORY: Duration = Duration::from_secs(1);
/// Clients whose demand is kept at most; past it a new client is never light.
pub(crate) const MAX_CLIENTS: usize = 100_000;
/// A client that has not asked for this long is forgotten.
const IDLE: Duration = Duration::from_secs(10);
/// The share of its fair part a client may use and still be light (may spend the reserve):
/// when every client is at its part, nobody is, and the bucket is plain for all.
pub(crate) const LIGHT: f64 = 0.5;
/// A client that asked (admitted or not) this recently is active: a light client refused by
/// a bucket someone else drained still counts.
const ASKED: Duration = Duration::from_secs(2);

/// One client's recent demand.
#[derive(Debug)]
pub(crate) struct Usage {
    /// Cost units asked per second, decayed to `last`.
    rate: f64,
    /// When it was last decayed, ns from the budget's epoch.
    last: u64,
    /// When it last asked, ns from the budget's epoch.
    seen: u64,
    /// The group it is counted in (its tenant's key, or 0 without tenants).
    group: u64,
    /// Whether a tick has counted it among its group's active clients yet.
    counted: bool,
}

/// A group's rate and active clients, set every tick: what a fair part is.
#[derive(Debug, Default)]
pub(crate) struct Part {
    rate: AtomicU64,
    clients: AtomicUsize,
}

impl Part {
    /// Sets the group's rate (units/s) and its active clients.
    pub(crate) fn set(&self, rate: f64, clients: usize) {
        self.rate.store(rate.to_bits(), Ordering::Relaxed);
        self.clients.store(clients, Ordering::Relaxed);
    }

    /// How much a client may use and be light: [`LIGHT`] of its fair part of the rate (the
    /// rate over the active clients, itself included when no tick has counted it yet). With fewer than two there is nobody to be fair to,
    /// and nobody is under it (the reserve is for contention, not a bigger burst).
    fn of(&self, counted: bool) -> f64 {
        let n = self.clients.load(Ordering::Relaxed) + usize::from(!counted);
        if n < 2 {
            -1.0
        } else {
            LIGHT * f64::from_bits(self.rate.load(Ordering::Relaxed)) / n as f64
        }
    }
}

impl Usage {
    fn decay(&mut self, now: u64) {
        let dt = now.saturating_sub(self.last) as f64 / 1e9;
        self.rate *= (-dt / MEMORY.as_secs_f64()).exp();
        self.last = self.last.max(now);
    }
}

/// The demand of every client, bounded.
#[derive(Debug)]
pub(crate) struct Clients {
    map: Bounded<Arc<Mutex<Usage>>>,
}

fn lock(u: &Mutex<Usage>) -> std::sync::MutexGuard<'_, Usage> {
    u.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Clients {
    pub(crate) fn new() -> Self {
        Clients {
            map: Bounded::new(),
        }
    }

    /// A key for a group name (a tenant).
    pub(crate) fn group(&self, name: &str) -> u64 {
        self.map.key(name)
    }

    /// The demand of `client` of `group` (`None` past [`MAX_CLIENTS`]).
    pub(crate) fn get(&self, client: u64, group: u64, now: u64) -> Option<Arc<Mutex<Usage>>> {
        self.map.get_or_insert(client, MAX_CLIENTS, || {
            Arc::new(Mutex::new(Usage {
                rate: 0.0,
                last: now,
                seen: now,
                group,
                counted: false,
            }))
        })
    }

    /// Counts a call of `cost` asked now, and tells whether the client's demand with it is
    /// light: at most [`LIGHT`] of its fair part of `part`.
    pub(crate) fn ask(usage: &Mutex<Usage>, now: u64, cost: f64, part: &Part) -> bool {
        let mut u = lock(usage);
        u.decay(now);
        u.seen = u.seen.max(now);
        u.rate += cost / MEMORY.as_secs_f64();
        u.rate <= part.of(u.counted)
    }

    /// Active clients per group now; forgets clients idle for [`IDLE`].
    pub(crate) fn active(&self, now: u64) -> HashMap<u64, usize> {
        let mut counts = HashMap::new();
        let idle = u64::try_from(IDLE.as_nanos()).unwrap_or(u64::MAX);
        let asked = u64::try_from(ASKED.as_nanos()).unwrap_or(u64::MAX);
        self.map.retain(|usage| {
            let mut u = lock(usage);
            u.decay(now);
            if now.saturating_sub(u.seen) < asked {
                *counts.entry(u.group).or_insert(0) += 1;
                u.counted = true;
            } else {
                u.counted = false;
            }
            now.saturating_sub(u.seen) < idle || Arc::strong_count(usage) > 1
        });
        counts
    }

    /// Clients whose demand is kept.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn demand_decays_and_idle_clients_are_forgotten() {
        let clients = Clients::new();
        let part = |rate: f64, n| {
            let p = Part::default();
            p.set(rate, n);
            p
        };
        let u = clients.get(1, 7, 0).unwrap();
        // Alone (not yet counted, nobody else): never light, the reserve is for contention.
        assert!(!Clients::ask(&u, 0, 0.0, &part(1000.0, 0)));
        // Not yet counted beside one other: its part is half the rate, light up to half of
        // that. 250 units asked: light; 1 more: not.
        assert!(Clients::ask(&u, 0, 250.0, &part(1000.0, 1)));
        assert!(!Clients::ask(&u, 0, 1.0, &part(1000.0, 1)));
        // One time constant later the 251 units/s are 92.3/s: light for a part of 185 or more.
        assert!(!Clients::ask(&u, S, 0.0, &part(368.0, 1)));
        assert!(Clients::ask(&u, S, 0.0, &part(372.0, 1)));
        drop(u);
        assert_eq!(clients.active(S).get(&7), Some(&1));
        // Asking is activity, admitted or not; a client gone quiet stops counting.
        let v = clients.get(2, 7, S).unwrap();
        assert!(!Clients::ask(&v, 5 * S, 0.0, &part(0.0, 0)));
        drop(v);
        assert_eq!(
            clients.active(6 * S).get(&7),
            Some(&1),
            "only the one that asked"
        );
        // Gone quiet for 10 s: forgotten.
        assert!(clients.active(20 * S).is_empty());
        assert_eq!(clients.len(), 0);
    }
}
