//! A weighted-cost token bucket as GCRA on one atomic: pure math plus a lock-free cell.
//!
//! The state is the *theoretical arrival time* (TAT) in nanoseconds. With `interval` = the
//! time one cost unit takes to refill and `burst` = the bucket's size in units, a call of cost
//! `c` arriving at `now` is admitted iff `max(TAT, now) + c * interval - now <= burst * interval`,
//! and then `TAT = max(TAT, now) + c * interval`. This is exactly a token bucket that refills
//! one unit per `interval` up to `burst` (see the proptest against a naive bucket), in one
//! `u64` that a compare-and-swap updates: no lock on the hot path.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// How much of its rate a bucket lets a caller under its fair share spend ahead.
pub(crate) const RESERVE: Duration = Duration::from_secs(1);

/// The GCRA decision for integer nanoseconds: `Ok(new_tat)` or `Err(wait_ns)`, the time until
/// the same call would be admitted.
pub(crate) fn gcra_check(
    tat: u64,
    now: u64,
    cost: u64,
    interval: u64,
    burst: u64,
) -> Result<u64, u64> {
    let start = tat.max(now);
    let new_tat = start.saturating_add(cost.saturating_mul(interval));
    let allowed = now.saturating_add(burst.saturating_mul(interval));
    if new_tat <= allowed {
        Ok(new_tat)
    } else {
        Err(new_tat - allowed)
    }
}

/// How far past its own wait [`Gcra::spread`] may put a refused caller's slot, at least.
pub(crate) const SPREAD_MIN: u64 = 1_000_000_000;

/// A GCRA bucket whose rate can change while it runs. Times are nanoseconds on a clock the
/// caller owns (stormgate uses nanoseconds since the budget was built).
#[derive(Debug)]
pub(crate) struct Gcra {
    tat: AtomicU64,
    interval: AtomicU64,
    burst: AtomicU64,
    /// The latest time a refused caller was told to come back ([`Gcra::spread`]).
    hinted: AtomicU64,
}

impl Gcra {
    /// A full bucket refilling one unit per `interval_ns`, holding `burst` units.
    pub(crate) fn new(interval_ns: u64, burst: u64) -> Self {
        Gcra {
            tat: AtomicU64::new(0),
            interval: AtomicU64::new(interval_ns.max(1)),
            burst: AtomicU64::new(burst.max(1)),
            hinted: AtomicU64::new(0),
        }
    }

    /// An empty bucket at `now`: it holds nothing until it has refilled.
    pub(crate) fn empty(now: u64, interval_ns: u64, burst: u64) -> Self {
        let g = Gcra::new(interval_ns, burst);
        let full = g.burst.load(Ordering::Relaxed) * g.interval.load(Ordering::Relaxed);
        g.tat.store(now.saturating_add(full), Ordering::Relaxed);
        g
    }

    /// Takes `cost` units at `now`, or returns the nanoseconds until it could.
    pub(crate) fn try_take(&self, now: u64, cost: u64) -> Result<(), u64> {
        self.take_within(now, cost, 0)
    }

    /// [`try_take`](Self::try_take) for a caller under its fair share: it may also spend
    /// [`RESERVE`] of the bucket's rate ahead (the bucket's level down to minus that), so the
    /// refusals of a contended bucket fall on those above their share. What it spends ahead,
    /// the others wait for.
    pub(crate) fn try_take_reserved(&self, now: u64, cost: u64) -> Result<(), u64> {
        self.take_within(
            now,
            cost,
            u64::try_from(RESERVE.as_nanos()).unwrap_or(u64::MAX),
        )
    }

    fn take_within(&self, now: u64, cost: u64, reserve_ns: u64) -> Result<(), u64> {
        let interval = self.interval.load(Ordering::Relaxed);
        let burst = self.burst.load(Ordering::Relaxed);
        let mut tat = self.tat.load(Ordering::Acquire);
        loop {
            let new_tat = gcra_check(tat, now.saturating_add(reserve_ns), cost, interval, burst)
                .map(|_| tat.max(now).saturating_add(cost.saturating_mul(interval)))?;
            match self
                .tat
                .compare_exchange_weak(tat, new_tat, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Ok(()),
                Err(current) => tat = current,
            }
        }
    }

    /// A refused caller's wait, `wait` ns from `now` for `cost` units, made its own slot in
    /// the refill: no earlier than one call's refill after the slot told to the refusal before
    /// it, and at most one full bucket's refill (or [`SPREAD_MIN`], if more) past its own. Callers refused together are told
    /// waits spread over the refill, so when each comes back its units are there, instead of
    /// all coming back at once to be refused again.
    pub(crate) fn spread(&self, now: u64, cost: u64, wait: u64) -> u64 {
        let interval = self.interval.load(Ordering::Relaxed);
        let own = now.saturating_add(wait);
        let step = cost.saturating_mul(interval);
        let bucket = self.burst.load(Ordering::Relaxed).saturating_mul(interval);
        let limit = own.saturating_add(bucket.max(SPREAD_MIN));
        let mut told = self.hinted.load(Ordering::Relaxed);
        loop {
            let slot = own.max(told.saturating_add(step)).min(limit);
            match self
                .hinted
                .compare_exchange_weak(told, slot, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => return slot - now,
                Err(current) => told = current,
            }
        }
    }

    /// Takes `cost` units even if the bucket is empty (a guaranteed minimum spent through the
    /// shared bucket), so the shared bucket still accounts for it.
    pub(crate) fn force_take(&self, now: u64, cost: u64) {
        let add = cost.saturating_mul(self.interval.load(Ordering::Relaxed));
        let _ = self
            .tat
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |tat| {
                Some(tat.max(now).saturating_add(add))
            });
    }

    /// Gives `cost` units back (a call refused by a later stage did no work).
    pub(crate) fn refund(&self, now: u64, cost: u64) {
        let sub = cost.saturating_mul(self.interval.load(Ordering::Relaxed));
        let _ = self
            .tat
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |tat| {
                Some(tat.saturating_sub(sub).max(now.min(tat)))
            });
    }

    /// Changes the refill interval, keeping the debt in units: what was owed stays owed.
    pub(crate) fn set_interval(&self, now: u64, interval_ns: u64) {
        let interval_ns = interval_ns.max(1);
        let old = self.interval.swap(interval_ns, Ordering::AcqRel);
        if old == interval_ns {
            return;
        }
        let _ = self
            .tat
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |tat| {
                let debt = tat.saturating_sub(now) as u128;
                let scaled = debt * interval_ns as u128 / old as u128;
                Some(now.saturating_add(u64::try_from(scaled).unwrap_or(u64::MAX)))
            });
    }

    /// Changes the bucket size.
    pub(crate) fn set_burst(&self, burst: u64) {
        self.burst.store(burst.max(1), Ordering::Relaxed);
    }

    /// Units that could be taken at `now` (the tests' view of the bucket).
    #[cfg(test)]
    pub(crate) fn available(&self, now: u64) -> u64 {
        let interval = self.interval.load(Ordering::Relaxed);
        let burst = self.burst.load(Ordering::Relaxed);
        let debt = self.tat.load(Ordering::Acquire).saturating_sub(now);
        (burst.saturating_mul(interval).saturating_sub(debt)) / interval
    }
}

/// The refill interval, in nanoseconds per unit, of a rate in units per second.
pub(crate) fn interval_for_rate(rate_per_sec: f64) -> u64 {
    if rate_per_sec <= 0.0 || !rate_per_sec.is_finite() {
        return u64::MAX / 4;
    }
    (1e9 / rate_per_sec)
        .round()
        .clamp(1.0, (u64::MAX / 4) as f64) as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A naive token bucket in nano-units: `level` refills by elapsed nanoseconds (one unit =
    /// `interval` nanoseconds) up to `burst * interval`.
    struct Naive {
        level: u64,
        last: u64,
        interval: u64,
        burst: u64,
    }

    impl Naive {
        fn take(&mut self, now: u64, cost: u64) -> bool {
            let cap = self.burst * self.interval;
            self.level = (self.level + (now - self.last)).min(cap);
            self.last = now;
            if self.level >= cost * self.interval {
                self.level -= cost * self.interval;
                true
            } else {
                false
            }
        }
    }

    /// Callers refused together, each coming back at its hint, are all admitted.
    #[test]
    fn refusals_together_are_told_slots_that_admit_them() {
        let ms = 1_000_000;
        let g = Gcra::new(10 * ms, 10); // 100 units a second, a bucket of 10
        let refused: Vec<u64> = (0..30)
            .filter_map(|_| g.try_take(0, 1).err().map(|wait| g.spread(0, 1, wait)))
            .collect();
        assert_eq!(refused.len(), 20);
        for (i, wait) in refused.iter().enumerate() {
            assert_eq!(*wait, (i as u64 + 1) * 10 * ms, "one unit's refill apart");
        }
        for wait in refused {
            assert!(g.try_take(wait, 1).is_ok(), "admitted at {wait}");
        }
    }

    proptest! {
        #[test]
        fn gcra_equals_a_naive_token_bucket(
            interval in 1u64..1_000_000,
            burst in 1u64..100,
            calls in proptest::collection::vec((0u64..3_000_000, 1u64..20), 1..200),
        ) {
            let g = Gcra::new(interval, burst);
            let mut naive = Naive { level: burst * interval, last: 0, interval, burst };
            let mut now = 0;
            for (dt, cost) in calls {
                now += dt;
                let a = g.try_take(now, cost).is_ok();
                let b = naive.take(now, cost);
                prop_assert_eq!(a, b, "at {} cost {}", now, cost);
            }
        }

        /// Reserved takes: a naive bucket whose level may go down to minus the reserve for
        /// them, and must stay at or above zero for plain takes.
        #[test]
        fn reserved_takes_equal_a_bucket_with_a_floor_below_zero(
            interval in 1_000u64..100_000_000,
            burst in 1u64..100,
            calls in proptest::collection::vec((0u64..300_000_000, 1u64..100, any::<bool>()), 1..200),
        ) {
            let g = Gcra::new(interval, burst);
            let reserve = RESERVE.as_nanos() as i128;
            let cap = (burst * interval) as i128;
            let (mut level, mut last, mut now) = (cap, 0u64, 0u64);
            for (dt, cost, reserved) in calls {
                let cost = cost.min(burst);
                now += dt;
                level = (level + (now - last) as i128).min(cap);
                last = now;
                let need = (cost * interval) as i128;
                let floor = if reserved { -reserve } else { 0 };
                let want = level - need >= floor;
                if want {
                    level -= need;
                }
                let got = if reserved { g.try_take_reserved(now, cost) } else { g.try_take(now, cost) };
                prop_assert_eq!(got.is_ok(), want, "at {} cost {} reserved {}", now, cost, reserved);
            }
        }

        #[test]
        fn the_wait_is_exact(
            interval in 1u64..1_000_000,
            burst in 1u64..50,
            cost in 1u64..50,
            pre in 0u64..100,
        ) {
            let g = Gcra::new(interval, burst.max(cost));
            for _ in 0..pre {
                let _ = g.try_take(0, 1);
            }
            match g.try_take(0, cost) {
                Ok(()) => {}
                Err(wait) => {
                    prop_assert!(g.try_take(wait - 1, cost).is_err());
                    prop_assert!(g.try_take(wait, cost).is_ok());
                }
            }
        }
    }

    #[test]
    fn rate_changes_keep_the_debt_in_units() {
        let g = Gcra::new(1_000, 10);
        for _ in 0..10 {
            g.try_take(0, 1).unwrap();
        }
        assert_eq!(g.available(0), 0);
        // Empty: 10 units owed. At 2 µs per unit, the first one is back after 2 µs, not 1 µs.
        g.set_interval(0, 2_000);
        assert_eq!(g.available(0), 0);
        assert_eq!(g.try_take(1_999, 1), Err(1));
        assert!(g.try_take(2_000, 1).is_ok());
    }

    #[test]
    fn refund_gives_units_back() {
        let g = Gcra::new(1_000, 2);
        g.try_take(0, 2).unwrap();
        assert!(g.try_take(0, 1).is_err());
        g.refund(0, 1);
        assert!(g.try_take(0, 1).is_ok());
    }
}
