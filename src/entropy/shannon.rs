//! Shannon entropy of a multiset, maintained in O(1) per change.

/// Counts per key and the entropy of their distribution, `H = -sum(p_i log2 p_i)`, kept
/// incrementally: with `N = sum(c_i)` and `S = sum(c_i log2 c_i)`, `H = log2 N - S / N`, and a
/// change of one count touches one term of `S`. Never recomputed over all keys.
///
/// The counts live in a small vector scanned linearly: a session window holds a few dozen keys
/// at most (its `max_keys`), and one compact allocation beats a hash table for that size. Each
/// count carries a note of its owner's (the window's: where the key's latest entry is), in
/// what would be the count's padding, so the owner finds both with one scan.
#[derive(Debug, Clone, Default)]
pub(crate) struct Shannon {
    counts: Vec<Count>,
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
        self.counts.iter().position(|c| c.key == key)
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
            self.counts.len() - 1
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
            self.counts.swap_remove(i);
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
