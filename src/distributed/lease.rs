//! Lease accounting on one node, with no Redis and no runtime: the window clock, the lease
//! slots that admission spends from, when to ask for more, and how much.
//!
//! A lease is a number of cost units granted for one window, identified by its index
//! `floor(redis_time / lease_window)`. A node keeps two slots, one per window parity, so the
//! next window's lease can arrive (prefetched) while the current one is being spent. Each
//! slot is one `u64` updated by compare-and-swap:
//!
//! ```text
//!  bit 63   62..41          40          39..0
//!  valid    window tag      exhausted   units remaining
//! ```
//!
//! A slot whose tag is not the current window holds nothing: a lease is never spent outside
//! its window, so it *expires* at the window's end and nothing is returned to Redis.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use crate::stats::Ewma;

const REMAINING: u64 = (1 << 40) - 1;
const EXHAUSTED: u64 = 1 << 40;
const TAG_SHIFT: u32 = 41;
const TAG: u64 = (1 << 22) - 1;
const VALID: u64 = 1 << 63;

/// Headroom of a lease over the demand it is sized from.
pub(crate) const LEASE_HEADROOM: f64 = 1.5;

fn pack(window: u64, exhausted: bool, remaining: u64) -> u64 {
    VALID
        | ((window & TAG) << TAG_SHIFT)
        | if exhausted { EXHAUSTED } else { 0 }
        | remaining.min(REMAINING)
}

fn holds(slot: u64, window: u64) -> bool {
    slot & VALID != 0 && (slot >> TAG_SHIFT) & TAG == window & TAG
}

/// Maps this node's monotonic clock onto Redis's windows. The offset is learned from each
/// answer as `redis_time - local send time`, which is never less than the true offset (the
/// script runs after the request is sent): the node's idea of a window's end is never later
/// than Redis's, so a lease is never spent after its window.
#[derive(Debug)]
pub(crate) struct WindowClock {
    window_us: u64,
    /// `redis_us - local_us`, or `i64::MIN` before the first answer.
    offset_us: AtomicI64,
}

impl WindowClock {
    /// A clock for windows of `window` (at least 1 µs).
    pub(crate) fn new(window: Duration) -> Self {
        WindowClock {
            window_us: u64::try_from(window.as_micros()).unwrap_or(u64::MAX).max(1),
            offset_us: AtomicI64::new(i64::MIN),
        }
    }

    /// The window length in microseconds.
    pub(crate) fn window_us(&self) -> u64 {
        self.window_us
    }

    /// Learns the offset from one answer: the request was sent at local `sent_us` and Redis
    /// read its clock as `redis_us`.
    pub(crate) fn observe(&self, sent_us: u64, redis_us: u64) {
        let offset = i64::try_from(redis_us)
            .unwrap_or(i64::MAX)
            .saturating_sub(i64::try_from(sent_us).unwrap_or(i64::MAX));
        self.offset_us.store(offset, Ordering::Release);
    }

    /// The window index at local time `now_us`, `None` before the first answer.
    pub(crate) fn index(&self, now_us: u64) -> Option<u64> {
        let offset = self.offset_us.load(Ordering::Acquire);
        if offset == i64::MIN {
            return None;
        }
        let redis = i128::from(now_us) + i128::from(offset);
        u64::try_from(redis.max(0) as u128 / u128::from(self.window_us)).ok()
    }

    /// Local microseconds from `now_us` until window `index` ends (0 if it has).
    pub(crate) fn until_end(&self, index: u64, now_us: u64) -> u64 {
        let offset = self.offset_us.load(Ordering::Acquire);
        let end = i128::from(index + 1) * i128::from(self.window_us) - i128::from(offset);
        u64::try_from((end - i128::from(now_us)).max(0)).unwrap_or(u64::MAX)
    }
}

/// The outcome of [`Lease::spend`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Spend {
    /// Paid from the window's lease.
    Leased,
    /// No lease was asked for this window yet: this first call is admitted on credit, which
    /// the next request claims from Redis (at most one call per window per node).
    Credit,
    /// The lease is short. `exhausted`: Redis said the window is spent cluster-wide, so only
    /// the next window helps; otherwise more is on its way.
    Short {
        /// The window is spent cluster-wide.
        exhausted: bool,
    },
}

/// Which window a lease request is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Target {
    /// The window now running (a cold start or a refill below the low watermark).
    Current,
    /// The next window (prefetched near the end of this one).
    Next,
}

/// One scope's lease on one node (the global budget, or one tenant): the two window slots,
/// the single request in flight, the demand since the last request and the credit taken.
#[derive(Debug, Default)]
pub(crate) struct Lease {
    slots: [AtomicU64; 2],
    asking: AtomicBool,
    demand: AtomicU64,
    debt: AtomicU64,
    last_grant: AtomicU64,
}

impl Lease {
    /// An empty lease.
    pub(crate) fn new() -> Self {
        Lease::default()
    }

    fn slot(&self, window: u64) -> &AtomicU64 {
        &self.slots[(window & 1) as usize]
    }

    /// Spends `cost` units of window `window`'s lease. Lock-free; never waits.
    pub(crate) fn spend(&self, window: u64, cost: u64) -> Spend {
        self.demand.fetch_add(cost, Ordering::Relaxed);
        let slot = self.slot(window);
        let mut s = slot.load(Ordering::Acquire);
        loop {
            let (next, result) = if !holds(s, window) {
                (pack(window, false, 0), Spend::Credit)
            } else if s & REMAINING >= cost {
                (s - cost, Spend::Leased)
            } else {
                return Spend::Short {
                    exhausted: s & EXHAUSTED != 0,
                };
            };
            match slot.compare_exchange_weak(s, next, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    if result == Spend::Credit {
                        self.debt.fetch_add(cost, Ordering::Relaxed);
                    }
                    return result;
                }
                Err(current) => s = current,
            }
        }
    }

    /// Adds `units` granted for window `window`; `exhausted` marks it spent cluster-wide. A
    /// slot holding an older window is replaced (that lease has expired).
    pub(crate) fn grant(&self, window: u64, units: u64, exhausted: bool) {
        let slot = self.slot(window);
        let _ = slot.fetch_update(Ordering::AcqRel, Ordering::Acquire, |s| {
            let (flag, have) = if holds(s, window) {
                (s & EXHAUSTED != 0, s & REMAINING)
            } else {
                (false, 0)
            };
            Some(pack(window, flag || exhausted, have.saturating_add(units)))
        });
        self.last_grant.store(units, Ordering::Relaxed);
    }

    /// Gives back `units` spent from window `window` (a later stage refused the call); lost if
    /// that window has ended.
    pub(crate) fn refund(&self, window: u64, units: u64) {
        let slot = self.slot(window);
        let _ = slot.fetch_update(Ordering::AcqRel, Ordering::Acquire, |s| {
            holds(s, window).then(|| pack(window, s & EXHAUSTED != 0, (s & REMAINING) + units))
        });
    }

    /// Units left in window `window`'s lease, and whether it is exhausted; `None` if nothing
    /// was granted or asked for that window.
    pub(crate) fn remaining(&self, window: u64) -> Option<(u64, bool)> {
        let s = self.slot(window).load(Ordering::Acquire);
        holds(s, window).then_some((s & REMAINING, s & EXHAUSTED != 0))
    }

    /// Whether to ask for more, and for which window, given `until_end` microseconds left in
    /// window `window` and the prefetch `margin`: near the end, the next window once; before
    /// that, the current window when it is cold or below the low watermark (a quarter of the
    /// last grant) and not exhausted.
    pub(crate) fn wants(&self, window: u64, until_end: u64, margin: u64) -> Option<Target> {
        if until_end <= margin {
            return self.remaining(window + 1).is_none().then_some(Target::Next);
        }
        match self.remaining(window) {
            None => Some(Target::Current),
            Some((_, true)) => None,
            Some((left, false)) => {
                let low = (self.last_grant.load(Ordering::Relaxed) / 4).max(1);
                (left < low).then_some(Target::Current)
            }
        }
    }

    /// Whether a request for `target` sent anyway (for another scope) should ask for this
    /// scope too: the next window is not held yet, or this window's lease is cold, or below
    /// half of the last grant and not exhausted.
    pub(crate) fn could_use(&self, window: u64, target: Target) -> bool {
        match target {
            Target::Next => self.remaining(window + 1).is_none(),
            Target::Current => match self.remaining(window) {
                None => true,
                Some((_, true)) => false,
                Some((left, false)) => left < self.last_grant.load(Ordering::Relaxed) / 2,
            },
        }
    }

    /// Counts `cost` units of demand without spending (a call refused before this lease was
    /// tried still tells how much this scope is asked for).
    pub(crate) fn note_demand(&self, cost: u64) {
        self.demand.fetch_add(cost, Ordering::Relaxed);
    }

    /// Claims the right to send this scope's one request in flight; `false` if one is.
    pub(crate) fn begin_request(&self) -> bool {
        !self.asking.swap(true, Ordering::AcqRel)
    }

    /// Releases it.
    pub(crate) fn end_request(&self) {
        self.asking.store(false, Ordering::Release);
    }

    /// Units asked for (admitted or not) since the last call.
    pub(crate) fn take_demand(&self) -> u64 {
        self.demand.swap(0, Ordering::Relaxed)
    }

    /// Units admitted on credit since the last call, to claim with the next request.
    pub(crate) fn take_debt(&self) -> u64 {
        self.debt.swap(0, Ordering::Relaxed)
    }
}

/// Sizes lease requests from recent demand: an EWMA of the demand rate times the span asked
/// for, with [`LEASE_HEADROOM`].
#[derive(Debug, Clone)]
pub(crate) struct Sizer {
    rate: Ewma,
    last_us: Option<u64>,
}

impl Default for Sizer {
    fn default() -> Self {
        Sizer {
            rate: Ewma::new(0.5),
            last_us: None,
        }
    }
}

impl Sizer {
    /// Folds in `demand` units asked since the last request (at `now_us`) and returns the
    /// units to ask for to cover `span_us`: at least `floor`.
    pub(crate) fn size(&mut self, demand: u64, now_us: u64, span_us: u64, floor: u64) -> u64 {
        if let Some(last) = self.last_us {
            let elapsed = now_us.saturating_sub(last).max(1_000) as f64 / 1e6;
            self.rate.update(demand as f64 / elapsed);
        }
        self.last_us = Some(now_us);
        let rate = self.rate.value().unwrap_or(0.0);
        let want = (rate * span_us as f64 / 1e6 * LEASE_HEADROOM).ceil();
        (want.min(REMAINING as f64) as u64).max(floor).max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn first_call_of_a_window_is_credit_then_short_until_the_grant() {
        let lease = Lease::new();
        assert_eq!(lease.spend(7, 3), Spend::Credit);
        assert_eq!(lease.spend(7, 1), Spend::Short { exhausted: false });
        assert_eq!(lease.take_debt(), 3);
        lease.grant(7, 2, false);
        assert_eq!(lease.spend(7, 1), Spend::Leased);
        assert_eq!(lease.spend(7, 2), Spend::Short { exhausted: false });
        lease.grant(7, 0, true);
        assert_eq!(lease.spend(7, 2), Spend::Short { exhausted: true });
        assert_eq!(lease.take_demand(), 9);
    }

    #[test]
    fn a_lease_expires_with_its_window() {
        let lease = Lease::new();
        lease.grant(4, 100, false);
        lease.grant(5, 10, false); // prefetched: both held
        assert_eq!(lease.remaining(4), Some((100, false)));
        assert_eq!(lease.remaining(5), Some((10, false)));
        // Window 6 shares window 4's slot: 4's units are gone, never spent in 6.
        assert_eq!(lease.spend(6, 1), Spend::Credit);
        assert_eq!(lease.remaining(4), None);
        lease.refund(4, 5); // a refund for an ended window is dropped
        assert_eq!(lease.remaining(6), Some((0, false)));
    }

    #[test]
    fn wants_prefetch_near_the_end_and_refills_below_the_watermark() {
        let lease = Lease::new();
        assert_eq!(lease.wants(1, 400, 50), Some(Target::Current), "cold");
        lease.grant(1, 100, false);
        assert_eq!(lease.wants(1, 400, 50), None);
        for _ in 0..80 {
            assert_eq!(lease.spend(1, 1), Spend::Leased);
        }
        assert_eq!(lease.wants(1, 400, 50), Some(Target::Current), "20 < 25");
        assert_eq!(lease.wants(1, 40, 50), Some(Target::Next));
        lease.grant(2, 50, false);
        assert_eq!(lease.wants(1, 40, 50), None, "next already held");
        lease.grant(1, 0, true);
        assert_eq!(
            lease.wants(1, 400, 50),
            None,
            "exhausted: only the next window helps"
        );
    }

    #[test]
    fn could_use_rides_along_from_half_the_last_grant() {
        let lease = Lease::new();
        assert!(lease.could_use(1, Target::Current), "cold");
        assert!(lease.could_use(1, Target::Next), "next not held");
        lease.grant(1, 100, false);
        for _ in 0..60 {
            lease.spend(1, 1);
        }
        assert_eq!(
            lease.wants(1, 400, 50),
            None,
            "40 left: not below a quarter"
        );
        assert!(
            lease.could_use(1, Target::Current),
            "40 < 50: worth asking along"
        );
        lease.grant(2, 10, false);
        assert!(!lease.could_use(1, Target::Next), "next already held");
    }

    #[test]
    fn one_request_in_flight() {
        let lease = Lease::new();
        assert!(lease.begin_request());
        assert!(!lease.begin_request());
        lease.end_request();
        assert!(lease.begin_request());
    }

    #[test]
    fn the_clock_never_ends_a_window_late() {
        let clock = WindowClock::new(Duration::from_millis(500));
        assert_eq!(clock.index(0), None);
        // Sent at local 1 000 µs; Redis read 10 000 250 000 µs (window 20 000, 250 ms in).
        clock.observe(1_000, 10_000_250_000);
        assert_eq!(clock.index(1_000), Some(20_000));
        assert_eq!(clock.until_end(20_000, 1_000), 250_000);
        assert_eq!(clock.index(251_000), Some(20_001));
        assert_eq!(clock.until_end(20_000, 300_000), 0);
    }

    #[test]
    fn sizes_follow_demand_with_headroom() {
        let mut s = Sizer::default();
        assert_eq!(s.size(0, 0, 500_000, 1), 1, "no history: the floor");
        // 1000 units in 0.5 s = 2000/s; half a second of it with 50% headroom.
        assert_eq!(s.size(1000, 500_000, 500_000, 1), 1500);
        assert_eq!(s.size(0, 500_100, 500_000, 7), 750, "EWMA halves toward 0");
    }

    proptest! {
        /// Concurrent-free model check: whatever the sequence of grants, spends and refunds,
        /// the units spent from a window (net of refunds) never exceed what was granted for it
        /// plus the one call on credit.
        #[test]
        fn never_spends_more_than_granted_plus_one_credit(
            ops in proptest::collection::vec((0u8..3, 0u64..4, 1u64..20), 1..300),
        ) {
            let lease = Lease::new();
            let mut granted = [0u64; 4];
            let mut spent = [0u64; 4];
            let mut credit = [0u64; 4];
            let mut window = 0;
            for (op, advance, units) in ops {
                if advance == 0 { window = (window + 1).min(3); }
                let w = window as usize;
                match op {
                    0 => { lease.grant(window, units, false); granted[w] += units; }
                    1 => match lease.spend(window, units) {
                        Spend::Leased => spent[w] += units,
                        Spend::Credit => { credit[w] += 1; spent[w] += units; granted[w] += units; }
                        Spend::Short { .. } => {}
                    },
                    _ => if spent[w] >= units && lease.remaining(window).is_some() {
                        lease.refund(window, units);
                        spent[w] -= units;
                    },
                }
                prop_assert!(spent[w] <= granted[w]);
                prop_assert!(credit[w] <= 1);
            }
        }
    }
}
