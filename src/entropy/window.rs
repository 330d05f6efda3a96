//! A session's sliding window of calls per key, bucketed, with its entropy.

use std::collections::VecDeque;
use std::time::Duration;

use super::shannon::Shannon;

/// Calls of one key in one bucket (`weight` in all), or, when `singles > 0`, that many calls
/// of `weight` each past the key cap, counted as keys seen once (see [`Shannon::add_single`]).
#[derive(Debug, Clone, Copy)]
struct Entry {
    bucket: u64,
    key: u64,
    weight: u32,
    singles: u32,
}

/// Counts per key over the last `window` (in `buckets` buckets), and their Shannon entropy.
/// Each call is added once and expired once: O(1) amortised.
#[derive(Debug, Clone)]
pub(crate) struct SessionWindow {
    bucket_len: Duration,
    buckets: usize,
    max_keys: usize,
    /// Entries in bucket order: one compact ring per session.
    ring: VecDeque<Entry>,
    shannon: Shannon,
}

impl SessionWindow {
    /// A window of `window` split into `buckets` buckets, storing at most `max_keys` distinct
    /// keys; calls of further new keys count as keys seen once, which keeps the entropy
    /// honest (a session cycling through endless new keys still reads as maximally diverse).
    pub(crate) fn new(window: Duration, buckets: usize, max_keys: usize) -> Self {
        let buckets = buckets.max(1);
        SessionWindow {
            bucket_len: (window / buckets as u32).max(Duration::from_millis(1)),
            buckets,
            max_keys: max_keys.max(1),
            ring: VecDeque::new(),
            shannon: Shannon::default(),
        }
    }

    fn expire(&mut self, index: u64) {
        while let Some(front) = self.ring.front() {
            if front.bucket + (self.buckets as u64) > index {
                break;
            }
            let old = self.ring.pop_front().expect("front exists");
            if old.singles > 0 {
                for _ in 0..old.singles {
                    self.shannon.remove_single(old.weight);
                }
            } else {
                self.shannon.remove(old.key, old.weight);
            }
        }
    }

    /// Counts one call of `key` with `weight` at `elapsed` (time since any fixed origin).
    pub(crate) fn record(&mut self, elapsed: Duration, key: u64, weight: u32) {
        let index = (elapsed.as_nanos() / self.bucket_len.as_nanos()) as u64;
        self.expire(index);
        let single = !self.shannon.contains(key) && self.shannon.stored() >= self.max_keys;
        let same = self
            .ring
            .iter_mut()
            .rev()
            .take_while(|e| e.bucket == index)
            .find(|e| {
                if single {
                    e.singles > 0 && e.weight == weight
                } else {
                    e.singles == 0 && e.key == key
                }
            });
        match (same, single) {
            (Some(e), true) => e.singles += 1,
            (Some(e), false) => e.weight += weight,
            (None, _) => self.ring.push_back(Entry {
                bucket: index,
                key,
                weight,
                singles: u32::from(single),
            }),
        }
        if single {
            self.shannon.add_single(weight);
            return;
        }
        self.shannon.add(key, weight);
    }

    /// Drops what fell out of the window by `elapsed`.
    #[cfg(test)]
    pub(crate) fn advance(&mut self, elapsed: Duration) {
        self.expire((elapsed.as_nanos() / self.bucket_len.as_nanos()) as u64);
    }

    /// Entropy of the window, bits.
    pub(crate) fn entropy(&self) -> f64 {
        self.shannon.entropy()
    }

    /// Calls (weights) in the window.
    pub(crate) fn total(&self) -> u64 {
        self.shannon.total()
    }

    /// Distinct keys in the window.
    #[cfg(test)]
    pub(crate) fn distinct(&self) -> usize {
        self.shannon.distinct()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    #[test]
    fn calls_expire_with_their_bucket() {
        let mut w = SessionWindow::new(s(10), 10, 64);
        w.record(s(0), 1, 1);
        w.record(s(5), 2, 1);
        assert!((w.entropy() - 1.0).abs() < 1e-12);
        w.advance(s(10)); // the first bucket [0, 1) s leaves at 10 s
        assert_eq!(w.total(), 1);
        assert_eq!(w.entropy(), 0.0);
        w.advance(s(15));
        assert_eq!(w.total(), 0);
    }

    #[test]
    fn keys_past_the_cap_still_count_as_new_keys() {
        let mut capped = SessionWindow::new(s(10), 10, 4);
        let mut free = SessionWindow::new(s(10), 10, 1000);
        for k in 0..100 {
            capped.record(s(1), k, 1);
            free.record(s(1), k, 1);
        }
        assert_eq!(capped.distinct(), 100);
        assert!(
            (capped.entropy() - free.entropy()).abs() < 1e-9,
            "honest: log2(100)"
        );
        capped.advance(s(20));
        assert_eq!(capped.total(), 0);
        assert_eq!(capped.entropy(), 0.0);
    }
}
