//! Shannon entropy of a multiset, maintained in O(1) per change.

/// Counts per key and the entropy of their distribution, `H = -sum(p_i log2 p_i)`, kept
/// incrementally: with `N = sum(c_i)` and `S = sum(c_i log2 c_i)`, `H = log2 N - S / N`, and a
/// change of one count touches one term of `S`. Never recomputed over all keys.
///
/// The counts live in a compact vector, scanned while it holds at most [`SCANNED`] keys; past
/// that, an open-addressing index of their places (linear probing, at most half full) finds a
/// key in a slot or two instead of a scan of up to `max_keys` (64 by default: 1 KiB read per
/// call). Each count carries a note of its owner's (the window's: where the key's latest entry
/// is), in what would be the count's padding, so the owner finds both at once.
#[derive(Debug, Clone, Default)]
pub(crate) struct Shannon {
    counts: Vec<Count>,
    /// The index: each slot a place in `counts` or [`EMPTY`]; a power of two long. Empty (and
    /// no allocation) while the counts are scanned.
    slots: Box<[u32]>,
    /// Calls counted as keys of their own without being stored (see [`Shannon::add_single`]).
    singles: u64,
    total: u64,
    sum_c_log_c: f64,
}

/// One key's count, and its owner's note on it.
#[derive(Debug, Clone, Copy)]
struct Count {
    key: u64,
    count: u32,
    note: u32,
}

/// Keys scanned before the counts are indexed: two cache lines of counts.
const SCANNED: usize = 8;

/// An index slot with no place.
const EMPTY: u32 = u32::MAX;

fn c_log_c(c: u32) -> f64 {
    if c == 0 {
        0.0
    } else {
        let c = f64::from(c);
        c * c.log2()
    }
}

impl Shannon {
    /// Adds `weight` to `key`'s count.
    #[cfg(test)]
    pub(crate) fn add(&mut self, key: u64, weight: u32) {
        self.add_at(self.find(key), key, weight);
    }

    /// Where `key`'s count is, if it is stored (non-zero).
    pub(crate) fn find(&self, key: u64) -> Option<usize> {
        if self.slots.is_empty() {
            return self.counts.iter().position(|c| c.key == key);
        }
        self.slot_of(key).map(|slot| self.slots[slot] as usize)
    }

    /// The index slot of a key's place. A key's low bits are its home slot: the keys are the
    /// guard's resource keys, SipHash under a key random per guard, so no client can choose
    /// keys that crowd one run of slots. The index is at most half full, so a probe meets an
    /// empty slot.
    fn slot_of(&self, key: u64) -> Option<usize> {
        let slot = self.probe(key, |at| at == EMPTY || self.counts[at as usize].key == key);
        (self.slots[slot] != EMPTY).then_some(slot)
    }

    /// The first slot from `key`'s home whose place satisfies `stop`.
    fn probe(&self, key: u64, stop: impl Fn(u32) -> bool) -> usize {
        let mask = self.slots.len() - 1;
        let mut slot = key as usize & mask;
        while !stop(self.slots[slot]) {
            slot = (slot + 1) & mask;
        }
        slot
    }

    /// Indexes the count at `at`, just pushed: into a free slot, or by indexing every count
    /// afresh in twice the slots once the index would be more than half full (or when the
    /// counts first pass [`SCANNED`]).
    fn index(&mut self, at: usize) {
        let stored = self.counts.len();
        if self.slots.is_empty() && stored <= SCANNED {
            return;
        }
        if stored * 2 > self.slots.len() {
            self.slots = vec![EMPTY; (stored * 2).next_power_of_two()].into_boxed_slice();
            for at in 0..stored {
                self.place(at);
            }
        } else {
            self.place(at);
        }
    }

    /// Puts the place `at` in the first free slot from its key's home.
    fn place(&mut self, at: usize) {
        let slot = self.probe(self.counts[at].key, |place| place == EMPTY);
        self.slots[slot] = at as u32;
    }

    /// Forgets the count at `at`, about to be removed: its slot is emptied and the places
    /// probed past it are shifted back (so every probe still meets its key before an empty
    /// slot).
    fn unindex(&mut self, at: usize) {
        if self.slots.is_empty() {
            return;
        }
        let mask = self.slots.len() - 1;
        let mut hole = self
            .slot_of(self.counts[at].key)
            .expect("a stored key is indexed");
        let mut slot = hole;
        loop {
            slot = (slot + 1) & mask;
            let next = self.slots[slot];
            if next == EMPTY {
                break;
            }
            // It may fill the hole if the hole is between its home and its slot.
            let home = self.counts[next as usize].key as usize & mask;
            if slot.wrapping_sub(home) & mask >= slot.wrapping_sub(hole) & mask {
                self.slots[hole] = next;
                hole = slot;
            }
        }
        self.slots[hole] = EMPTY;
    }

    /// The count that was last, at `from`, was moved to `to`: its slot now says so.
    fn moved(&mut self, from: usize, to: usize) {
        if self.slots.is_empty() {
            return;
        }
        let slot = self.probe(self.counts[to].key, |place| place == from as u32);
        self.slots[slot] = to as u32;
    }

    /// Adds `weight` to `key`'s count, found at `at` by [`find`](Self::find) (`None`: not
    /// stored, so stored now with its note 0), and returns where it is; `None` for a weight of
    /// 0, which changes nothing.
    pub(crate) fn add_at(&mut self, at: Option<usize>, key: u64, weight: u32) -> Option<usize> {
        if weight == 0 {
            return at;
        }
        let at = at.unwrap_or_else(|| {
            self.counts.push(Count {
                key,
                count: 0,
                note: 0,
            });
            let at = self.counts.len() - 1;
            self.index(at);
            at
        });
        let c = &mut self.counts[at].count;
        self.sum_c_log_c += c_log_c(*c + weight) - c_log_c(*c);
        *c += weight;
        self.total += u64::from(weight);
        Some(at)
    }

    /// The owner's note on the count at `at`.
    pub(crate) fn note(&mut self, at: usize) -> &mut u32 {
        &mut self.counts[at].note
    }

    /// Takes `weight` back from `key`'s count (never below zero).
    pub(crate) fn remove(&mut self, key: u64, weight: u32) {
        let Some(i) = self.find(key) else {
            return;
        };
        let c = &mut self.counts[i].count;
        let w = weight.min(*c);
        self.sum_c_log_c += c_log_c(*c - w) - c_log_c(*c);
        *c -= w;
        self.total -= u64::from(w);
        if *c == 0 {
            self.unindex(i);
            self.counts.swap_remove(i);
            let last = self.counts.len();
            if i < last {
                self.moved(last, i);
            }
        }
        if self.total == 0 {
            self.sum_c_log_c = 0.0; // no drift left behind
        }
    }

    /// Counts one call of `weight` as a key seen once, without storing the key: the honest
    /// assumption for calls past a cap on distinct keys (each new key adds the most entropy a
    /// new key can), at no memory cost.
    pub(crate) fn add_single(&mut self, weight: u32) {
        self.singles += 1;
        self.total += u64::from(weight);
        self.sum_c_log_c += c_log_c(weight);
    }

    /// Takes back a call counted with [`add_single`](Shannon::add_single).
    pub(crate) fn remove_single(&mut self, weight: u32) {
        self.singles = self.singles.saturating_sub(1);
        self.total = self.total.saturating_sub(u64::from(weight));
        self.sum_c_log_c -= c_log_c(weight);
        if self.total == 0 {
            self.sum_c_log_c = 0.0;
        }
    }

    /// The entropy in bits.
    pub(crate) fn entropy(&self) -> f64 {
        if self.total == 0 {
            return 0.0;
        }
        let n = self.total as f64;
        (n.log2() - self.sum_c_log_c / n).max(0.0)
    }

    /// Distinct keys with a non-zero count (calls counted as singles included).
    #[cfg(test)]
    pub(crate) fn distinct(&self) -> usize {
        self.counts.len() + self.singles as usize
    }

    /// Distinct keys stored.
    pub(crate) fn stored(&self) -> usize {
        self.counts.len()
    }

    /// The sum of all counts.
    pub(crate) fn total(&self) -> u64 {
        self.total
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use proptest::prelude::*;

    fn naive(counts: &HashMap<u64, u32>) -> f64 {
        let n: f64 = counts.values().map(|&c| f64::from(c)).sum();
        if n == 0.0 {
            return 0.0;
        }
        -counts
            .values()
            .filter(|&&c| c > 0)
            .map(|&c| {
                let p = f64::from(c) / n;
                p * p.log2()
            })
            .sum::<f64>()
    }

    proptest! {
        /// After every random sequence of additions and removals (window expiries), the
        /// incremental entropy equals a naive recomputation to 1e-9.
        #[test]
        fn incremental_equals_naive(ops in proptest::collection::vec((any::<bool>(), 0u64..12, 1u32..5), 1..400)) {
            let mut h = Shannon::default();
            let mut reference: HashMap<u64, u32> = HashMap::new();
            for (add, key, w) in ops {
                if add {
                    h.add(key, w);
                    *reference.entry(key).or_insert(0) += w;
                } else {
                    h.remove(key, w);
                    if let Some(c) = reference.get_mut(&key) {
                        *c -= w.min(*c);
                    }
                }
                prop_assert!((h.entropy() - naive(&reference)).abs() < 1e-9);
                prop_assert_eq!(h.total(), reference.values().map(|&c| u64::from(c)).sum::<u64>());
            }
        }
    }
}

#[cfg(test)]
mod index_tests {
    use std::collections::HashMap;

    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Through any additions and removals of up to 160 keys that share their low bits in
        /// fours (long probe runs, shifted back on removal), every key is found where its
        /// count is, with the count a plain map of counts holds, and absent keys are not found.
        #[test]
        fn the_index_finds_each_key_as_a_scan_would(
            ops in proptest::collection::vec((any::<bool>(), 0u64..40, 0u64..4, 1u32..3), 1..600),
        ) {
            let mut h = Shannon::default();
            let mut reference: HashMap<u64, u32> = HashMap::new();
            let key = |hi: u64, lo: u64| (hi << 32) | lo;
            for (add, hi, lo, w) in ops {
                let k = key(hi, lo);
                if add {
                    h.add(k, w);
                    *reference.entry(k).or_insert(0) += w;
                } else {
                    h.remove(k, w);
                    if let Some(c) = reference.get_mut(&k) {
                        *c -= w.min(*c);
                    }
                }
                for hi in 0..40 {
                    for lo in 0..4 {
                        let k = key(hi, lo);
                        let expected = reference.get(&k).copied().filter(|&c| c > 0);
                        let found = h.find(k).map(|at| (h.counts[at].key, h.counts[at].count));
                        prop_assert_eq!(found, expected.map(|c| (k, c)), "key {:x}", k);
                    }
                }
                prop_assert!(h.slots.is_empty() || h.counts.len() * 2 <= h.slots.len());
            }
        }
    }
}

/// The examples of this module's documentation, run.
#[cfg(test)]
mod examples {
    #[test]
    fn two_equally_likely_keys_are_one_bit() {
        use crate::entropy::shannon::Shannon;

        let mut h = Shannon::default();
        h.add(1, 1);
        h.add(2, 1);
        assert!((h.entropy() - 1.0).abs() < 1e-12); // two equally likely keys: 1 bit
        h.remove(2, 1);
        assert_eq!(h.entropy(), 0.0);
    }
}
