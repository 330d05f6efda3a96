//! Fair shares inside a shared bucket: which clients are light, under theirs.
//!
//! A bucket many clients draw from is first come, first served: whoever calls most takes the
//! burst, and a light caller arriving after it is refused. So each client's recent demand is
//! kept (cost units asked per second, admitted or not, decaying over [`MEMORY`]: a client
//! refused a lot is still heavy; a new one read at what it asks from its first calls,
//! [`Usage::demand`]), and at every tick each group's (a tenant's, or the whole
//! budget's) fair part per client is the **max-min fair level** of its rate among its active
//! clients' demands (those that asked in the last [`ASKED`], admitted or not; [`level`]): what
//! each may have when nobody gets more than anyone who wants more. A client counts at most
//! what its own limit lets it have (a session the storm score has cut keeps asking, but the
//! part it cannot use is the others'), so a cut client does not pull the level down. A client
//! using at most [`LIGHT`] of that (this call included) is light: it may spend the bucket's
//! reserve ([`Gcra::try_take_reserved`](super::Gcra::try_take_reserved)); the others see the
//! plain bucket, so when the bucket is contended the refusals fall on those above their share,
//! and when everyone is at its share nobody has a reserve.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::bounded::Bounded;

/// How long a client's demand keeps counting (its time constant): long enough that a client
/// paused by its refusals' `retry_after` is still heavy when it comes back, and that one heavy
/// call of a light client is a small step of its demand (a second was too short: a complex
/// agent's 100-unit calls pushed it past half its part).
pub(crate) const MEMORY: Duration = Duration::from_secs(5);
/// Clients whose demand is kept at most; past it a new client is never light.
pub(crate) const MAX_CLIENTS: usize = 100_000;
/// A client that has not asked for this long is forgotten.
const IDLE: Duration = Duration::from_secs(10);
/// The share of its fair part a client may use and still be light (may spend the reserve):
/// when every client is at its part, nobody is, and the bucket is plain for all. Close to 1,
/// since beside a swarm the innocent are near their part: eight sub-agents leave each of
/// 13 clients about 92 units/s of 1 000, a steady agent asks 50 and a complex one 65; at
/// half their part both would meet the plain bucket the swarm keeps drained
/// (`tests/budget.rs`).
pub(crate) const LIGHT: f64 = 0.9;
/// A new client's calls count as asked over at least this much time: its first call as one a
/// second, not as a rate of its own (see [`Usage::demand`]).
const FIRST_SPAN: Duration = Duration::from_secs(1);
/// A client that asked (admitted or not) this recently is active: a light client refused by
/// a bucket someone else drained still counts.
const ASKED: Duration = Duration::from_secs(2);

/// One client's recent demand.
#[derive(Debug)]
pub(crate) struct Usage {
    /// Cost units asked, decayed to `last`, over [`MEMORY`] (units/s for a client older than
    /// the memory; see [`Usage::demand`]).
    rate: f64,
    /// When it first asked, ns from the budget's epoch.
    born: u64,
    /// When it was last decayed, ns from the budget's epoch.
    last: u64,
    /// When it last asked, ns from the budget's epoch.
    seen: u64,
    /// The most it may be admitted per second by its own limit (the session guard's), as of
    /// its last ask: its demand counts towards a fair level up to this.
    allowed: f64,
    /// The group it is counted in (its tenant's key, or 0 without tenants).
    group: u64,
    /// Whether a tick has counted it among its group's active clients yet.
    counted: bool,
}

/// A group's rate, active clients and fair level, set every tick: what a fair part is.
#[derive(Debug, Default)]
pub(crate) struct Part {
    rate: AtomicU64,
    level: AtomicU64,
    clients: AtomicUsize,
}

/// The max-min fair level of `rate` among clients asking `demands` (units/s): the `L` with
/// `sum(min(d, L)) = rate`, so every client asking less than `L` may have all it asks and the
/// others `L` each. When everyone's demand fits, the heaviest demand (or the equal split, if
/// more): the heaviest client has no reserve then either. At least `rate / n` always.
pub(crate) fn level(rate: f64, demands: &mut [f64]) -> f64 {
    let n = demands.len();
    if n == 0 {
        return rate;
    }
    demands.sort_by(f64::total_cmp);
    let mut left = rate;
    for (i, &d) in demands.iter().enumerate() {
        let k = (n - i) as f64;
        if d * k >= left {
            return left / k;
        }
        left -= d;
    }
    demands[n - 1].max(rate / n as f64)
}

impl Part {
    /// A part of `rate` (units/s) no tick has counted clients for yet: a client's fair part
    /// is the whole rate until the first tick says how many share it. (A part at rate 0
    /// would put every call of a new group's first tick beyond its share, where it can take
    /// no waiter's place in a full queue.)
    pub(crate) fn new(rate: f64) -> Self {
        let part = Part::default();
        part.set(rate, &mut []);
        part
    }

    /// Sets the group's rate (units/s) and its active clients' demands.
    pub(crate) fn set(&self, rate: f64, demands: &mut [f64]) {
        self.rate.store(rate.to_bits(), Ordering::Relaxed);
        self.level
            .store(level(rate, demands).to_bits(), Ordering::Relaxed);
        self.clients.store(demands.len(), Ordering::Relaxed);
    }

    /// A client's fair part of the group's rate: the group's fair level; for a client no tick
    /// has counted yet (new, or asking less often than every [`ASKED`]), at least the rate
    /// split equally among the active clients and itself.
    fn fair(&self, counted: bool) -> f64 {
        let level = f64::from_bits(self.level.load(Ordering::Relaxed));
        if counted {
            return level;
        }
        let n = self.clients.load(Ordering::Relaxed) + 1;
        level.max(f64::from_bits(self.rate.load(Ordering::Relaxed)) / n as f64)
    }

    /// Where a client asking `demand` stands: light when it uses at most [`LIGHT`] of its fair
    /// part and there are at least two active clients (with fewer there is nobody to be fair
    /// to: the reserve is for contention, not a bigger burst); beyond its share when it asks
    /// more than its fair part.
    fn standing(&self, demand: f64, counted: bool) -> Standing {
        let fair = self.fair(counted);
        let n = self.clients.load(Ordering::Relaxed) + usize::from(!counted);
        Standing {
            light: n >= 2 && demand <= LIGHT * fair,
            beyond: demand > fair,
        }
    }
}

/// Where a client stands against its fair part, as of one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Standing {
    /// It may spend the bucket's reserve: at most [`LIGHT`] of its fair part, with someone to
    /// be fair to.
    pub(crate) light: bool,
    /// It asks more than its fair part: what it is admitted is what others leave unused.
    pub(crate) beyond: bool,
}

impl Usage {
    fn decay(&mut self, now: u64) {
        let dt = now.saturating_sub(self.last) as f64 / 1e9;
        self.rate *= (-dt / MEMORY.as_secs_f64()).exp();
        self.last = self.last.max(now);
    }

    /// Its demand, units/s: `rate` corrected for the memory it has not lived yet. A decayed
    /// sum started at zero is `1 - exp(-age / MEMORY)` of the rate a client asks, so a new
    /// client bursting (a swarm's sub-agent, eight scans in its first 300 ms) would read as
    /// light until its eighth call and spend the reserve the innocent need; divided by that
    /// share, its demand is what it asks from its second call on. Its age counts from
    /// [`FIRST_SPAN`] before its first call, so that call counts as one a second (a steady
    /// client is read at its rate, 10% over at most) and the correction fades as the client
    /// ages (under 2% after 20 s).
    fn demand(&self, now: u64) -> f64 {
        let age = now.saturating_sub(self.born) as f64 / 1e9 + FIRST_SPAN.as_secs_f64();
        self.rate / (1.0 - (-age / MEMORY.as_secs_f64()).exp())
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
                born: now,
                allowed: f64::INFINITY,
                last: now,
                seen: now,
                group,
                counted: false,
            }))
        })
    }

    /// Counts a call of `cost` asked now by a client its own limit admits at most `allowed`
    /// units/s, and tells where the client's demand with it stands against its fair part of
    /// `part`.
    pub(crate) fn ask(
        usage: &Mutex<Usage>,
        now: u64,
        (cost, allowed): (f64, f64),
        part: &Part,
    ) -> Standing {
        let mut u = lock(usage);
        u.decay(now);
        u.allowed = allowed;
        u.seen = u.seen.max(now);
        u.rate += cost / MEMORY.as_secs_f64();
        part.standing(u.demand(now), u.counted)
    }

    /// The demands of the active clients of each group now; forgets clients idle for
    /// [`IDLE`].
    pub(crate) fn active(&self, now: u64) -> HashMap<u64, Vec<f64>> {
        let mut demands: HashMap<u64, Vec<f64>> = HashMap::new();
        let idle = u64::try_from(IDLE.as_nanos()).unwrap_or(u64::MAX);
        let asked = u64::try_from(ASKED.as_nanos()).unwrap_or(u64::MAX);
        self.map.retain(|usage| {
            let mut u = lock(usage);
            u.decay(now);
            if now.saturating_sub(u.seen) < asked {
                demands
                    .entry(u.group)
                    .or_default()
                    .push(u.demand(now).min(u.allowed));
                u.counted = true;
            } else {
                u.counted = false;
            }
            now.saturating_sub(u.seen) < idle || Arc::strong_count(usage) > 1
        });
        demands
    }

    /// The cost a new client's first call asks for its demand to read `demand` units/s.
    #[cfg(test)]
    pub(crate) fn first_ask(demand: f64) -> f64 {
        let span = FIRST_SPAN.as_secs_f64() / MEMORY.as_secs_f64();
        demand * MEMORY.as_secs_f64() * (1.0 - (-span).exp())
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

    /// A part of `rate` among `n` clients that each ask nothing (the equal split).
    fn part(rate: f64, n: usize) -> Part {
        let p = Part::default();
        p.set(rate, &mut vec![0.0; n]);
        p
    }

    /// Asks `cost` for a client no limit of its own holds back.
    fn ask(u: &Mutex<Usage>, now: u64, cost: f64, part: &Part) -> bool {
        Clients::ask(u, now, (cost, f64::INFINITY), part).light
    }

    /// A client its own limit holds to 2 units/s counts for 2 in its group's demands however
    /// much it asks, and is still not light: it asks far more than its part.
    #[test]
    fn a_client_counts_towards_the_level_only_for_what_its_own_limit_lets_it_have() {
        let clients = Clients::new();
        let cut = clients.get(1, 7, 0).unwrap();
        let free = clients.get(2, 7, 0).unwrap();
        assert!(!Clients::ask(&cut, 0, (2500.0, 2.0), &part(100.0, 2)).light);
        assert!(!ask(&free, 0, 2500.0, &part(100.0, 2)));
        let mut demands = clients.active(0).remove(&7).unwrap();
        demands.sort_by(f64::total_cmp);
        // 2500 units at once, its first call: as asked over a second.
        assert_eq!(demands, [2.0, 500.0 / (1.0 - (-1.0f64 / 5.0).exp())]);
        assert_eq!(level(100.0, &mut demands), 98.0);
    }

    /// Before the first tick a new client asking less than the whole rate is within its
    /// share (it was beyond a part of rate 0 whatever it asked), and one asking more is not.
    #[test]
    fn before_any_tick_a_client_is_beyond_its_share_only_past_the_whole_rate() {
        let part = Part::new(1000.0);
        let clients = Clients::new();
        let steady = clients.get(1, 7, 0).unwrap();
        let burst = clients.get(2, 7, 0).unwrap();
        let standing = |u, cost| Clients::ask(u, 0, (cost, f64::INFINITY), &part);
        // Its first call counts as asked over a second, 10% over: 50 units ask 55.2/s.
        assert!(!standing(&steady, 50.0).beyond);
        assert!(standing(&burst, 1000.0).beyond);
        // Nobody to be fair to yet: not light either.
        assert!(!standing(&steady, 0.0).light);
    }

    #[test]
    fn demand_decays_and_idle_clients_are_forgotten() {
        let clients = Clients::new();
        let u = clients.get(1, 7, 0).unwrap();
        // Alone (not yet counted, nobody else): never light, the reserve is for contention.
        assert!(!ask(&u, 0, 0.0, &part(1000.0, 0)));
        // Not yet counted beside one other asking nothing: its part is the level, the whole
        // rate, light up to 0.9 of it. A new client's first call counts as asked over a
        // second (10% over, as the memory's 5 s have not passed): 815 units light, 1 more not.
        assert!(ask(&u, 0, 815.0, &part(1000.0, 1)));
        assert!(!ask(&u, 0, 1.0, &part(1000.0, 1)));
        // One time constant later the 163.2 units/s asked are 60.04/s decayed, 85.9/s
        // corrected for a memory of 6 s of 5: light for a part of 95.5 or more.
        assert!(!ask(&u, 5 * S, 0.0, &part(95.0, 1)));
        assert!(ask(&u, 5 * S, 0.0, &part(96.0, 1)));
        drop(u);
        assert_eq!(clients.active(5 * S).get(&7).map(Vec::len), Some(1));
        // Asking is activity, admitted or not; a client gone quiet stops counting.
        let v = clients.get(2, 7, 5 * S).unwrap();
        assert!(!ask(&v, 9 * S, 0.0, &part(0.0, 0)));
        drop(v);
        assert_eq!(
            clients.active(10 * S).get(&7).map(Vec::len),
            Some(1),
            "only the one that asked"
        );
        // Gone quiet for 10 s: forgotten.
        assert!(clients.active(25 * S).is_empty());
        assert_eq!(clients.len(), 0);
    }

    #[test]
    fn the_level_is_max_min_fair() {
        // 1000 among 4 x 50, 190 and a runaway asking 2000: the runaway gets what is left,
        // 610, and the others all they ask.
        let mut d = vec![50.0, 2000.0, 50.0, 190.0, 50.0, 50.0];
        assert_eq!(level(1000.0, &mut d), 610.0);
        // Everyone at the same demand past the rate: the equal split.
        assert_eq!(level(1000.0, &mut [400.0; 4]), 250.0);
        // Everyone fits: the heaviest demand, or the equal split if more.
        assert_eq!(level(1000.0, &mut [300.0, 100.0]), 500.0);
        assert_eq!(level(1000.0, &mut [900.0, 50.0]), 900.0);
    }

    proptest::proptest! {
        /// Against a naive bisection of `sum(min(d, L)) = rate`.
        #[test]
        fn the_level_matches_a_bisection(
            rate in 1.0f64..1e5,
            demands in proptest::collection::vec(0.0f64..1e5, 1..40),
        ) {
            let total: f64 = demands.iter().sum();
            let n = demands.len() as f64;
            let expected = if total <= rate {
                demands.iter().copied().fold(0.0, f64::max).max(rate / n)
            } else {
                let (mut lo, mut hi) = (0.0, rate);
                for _ in 0..200 {
                    let mid = (lo + hi) / 2.0;
                    let given: f64 = demands.iter().map(|&d| d.min(mid)).sum();
                    if given < rate { lo = mid } else { hi = mid }
                }
                hi
            };
            let got = level(rate, &mut demands.clone());
            proptest::prop_assert!((got - expected).abs() <= 1e-6 * expected.max(1.0), "{got} vs {expected}");
            proptest::prop_assert!(got >= rate / n - 1e-9);
        }
    }
}
