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
/// Each call is added once and expired once: O(1) amortised (a key is found by a scan of at
/// most eight stored keys, past that by an index).
///
/// Entries are numbered as they are pushed (mod 2^32): the entry numbered `n` is at
/// `ring[n - popped]`. Each stored key's count notes the number of its latest entry, and the
/// window the number of its latest entry of calls past the cap, so a call finds the entry of
/// its bucket it adds to without scanning the ring.
#[derive(Debug, Clone)]
pub(crate) struct SessionWindow {
    bucket_len: Duration,
    buckets: u32,
    max_keys: u32,
    /// Entries in bucket order: one compact ring per session.
    ring: VecDeque<Entry>,
    /// Entries popped from the ring's front so far (mod 2^32).
    popped: u32,
    /// The number of the latest entry of calls past the key cap.
    last_single: u32,
    shannon: Shannon,
}

impl SessionWindow {
    /// A window of `window` split into `buckets` buckets, storing at most `max_keys` distinct
    /// keys; calls of further new keys count as keys seen once, which keeps the entropy
    /// honest (a session cycling through endless new keys still reads as maximally diverse).
    pub(crate) fn new(window: Duration, buckets: usize, max_keys: usize) -> Self {
        let buckets = u32::try_from(buckets).unwrap_or(u32::MAX).max(1);
        SessionWindow {
            bucket_len: (window / buckets).max(Duration::from_millis(1)),
            buckets,
            max_keys: u32::try_from(max_keys).unwrap_or(u32::MAX).max(1),
            ring: VecDeque::new(),
            popped: 0,
            last_single: 0,
            shannon: Shannon::default(),
        }
    }

    fn expire(&mut self, index: u64) {
        while let Some(front) = self.ring.front() {
            if front.bucket + u64::from(self.buckets) > index {
                break;
            }
            let old = self.ring.pop_front().expect("front exists");
            self.popped = self.popped.wrapping_add(1);
            if old.singles > 0 {
                for _ in 0..old.singles {
                    self.shannon.remove_single(old.weight);
                }
            } else {
                self.shannon.remove(old.key, old.weight);
            }
        }
    }

    /// The place in the ring of the entry numbered `n`, if it is of bucket `index` and `is` it.
    fn entry(&self, n: u32, index: u64, is: impl Fn(&Entry) -> bool) -> Option<usize> {
        let at = n.wrapping_sub(self.popped) as usize;
        self.ring
            .get(at)
            .is_some_and(|e| e.bucket == index && is(e))
            .then_some(at)
    }

    /// Adds a call to the entry of bucket `index` at `at`, else to a new one; returns the
    /// number of the entry.
    fn add_to(&mut self, at: Option<usize>, new: Entry) -> u32 {
        let at = match at {
            Some(at) => {
                let e = &mut self.ring[at];
                if new.singles > 0 {
                    e.singles += new.singles;
                } else {
                    e.weight += new.weight;
                }
                at
            }
            None => {
                self.ring.push_back(new);
                self.ring.len() - 1
            }
        };
        self.popped.wrapping_add(at as u32)
    }

    /// Counts one call of `key` with `weight` at `elapsed` (time since any fixed origin). A
    /// call of weight 0 counts for nothing.
    pub(crate) fn record(&mut self, elapsed: Duration, key: u64, weight: u32) {
        if weight == 0 {
            return;
        }
        let index = (elapsed.as_nanos() / self.bucket_len.as_nanos()) as u64;
        self.expire(index);
        let stored = self.shannon.find(key);
        let entry = Entry {
            bucket: index,
            key,
            weight,
            singles: 0,
        };
        if stored.is_none() && self.shannon.stored() >= self.max_keys as usize {
            // Past the cap: the bucket's entry of such calls of this weight (one per weight;
            // the latest is remembered, another is looked for).
            let single = |e: &Entry| e.singles > 0 && e.weight == weight;
            let at = self.entry(self.last_single, index, single).or_else(|| {
                let from = self.ring.len();
                self.ring
                    .iter()
                    .rev()
                    .take_while(|e| e.bucket == index)
                    .position(single)
                    .map(|back| from - 1 - back)
            });
            self.last_single = self.add_to(
                at,
                Entry {
                    singles: 1,
                    ..entry
                },
            );
            self.shannon.add_single(weight);
            return;
        }
        // The key's entry of this bucket, if it has one, is its latest.
        let at = stored.and_then(|i| {
            let n = *self.shannon.note(i);
            self.entry(n, index, |e| e.singles == 0 && e.key == key)
        });
        let n = self.add_to(at, entry);
        if let Some(i) = self.shannon.add_at(stored, key, weight) {
            *self.shannon.note(i) = n;
        }
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

    /// The window as it was before entries were numbered: the bucket's entry a call adds to
    /// found by scanning the bucket, the key's count by two more scans.
    struct Scanned {
        bucket_len: Duration,
        buckets: usize,
        max_keys: usize,
        ring: VecDeque<Entry>,
        shannon: Shannon,
    }

    impl Scanned {
        fn record(&mut self, elapsed: Duration, key: u64, weight: u32) {
            let index = (elapsed.as_nanos() / self.bucket_len.as_nanos()) as u64;
            while let Some(front) = self.ring.front() {
                if front.bucket + (self.buckets as u64) > index {
                    break;
                }
                let old = self.ring.pop_front().unwrap();
                if old.singles > 0 {
                    (0..old.singles).for_each(|_| self.shannon.remove_single(old.weight));
                } else {
                    self.shannon.remove(old.key, old.weight);
                }
            }
            let single = self.shannon.find(key).is_none() && self.shannon.stored() >= self.max_keys;
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
            } else {
                self.shannon.add(key, weight);
            }
        }
    }

    proptest::proptest! {
        /// Against the scanning window it replaced: the same entropy, bit for bit, the same
        /// totals, keys and entries after every call, whatever the keys, weights, times, cap
        /// and buckets.
        #[test]
        fn numbered_entries_count_as_the_scans_did(
            buckets in 1usize..5,
            max_keys in 1usize..6,
            calls in proptest::collection::vec((0u64..3, 0u64..9, 1u32..4), 1..300),
        ) {
            let window = s(4);
            let mut w = SessionWindow::new(window, buckets, max_keys);
            let mut r = Scanned {
                bucket_len: (window / buckets as u32).max(Duration::from_millis(1)),
                buckets,
                max_keys,
                ring: VecDeque::new(),
                shannon: Shannon::default(),
            };
            let mut at = Duration::ZERO;
            for (step, key, weight) in calls {
                at += Duration::from_millis(700 * step);
                w.record(at, key, weight);
                r.record(at, key, weight);
                proptest::prop_assert_eq!(w.entropy().to_bits(), r.shannon.entropy().to_bits());
                proptest::prop_assert_eq!(w.total(), r.shannon.total());
                proptest::prop_assert_eq!(w.distinct(), r.shannon.distinct());
                let entries = |ring: &VecDeque<Entry>| {
                    ring.iter().map(|e| (e.bucket, e.key, e.weight, e.singles)).collect::<Vec<_>>()
                };
                proptest::prop_assert_eq!(entries(&w.ring), entries(&r.ring));
            }
        }
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
