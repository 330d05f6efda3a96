//! One bounded keyed store for state kept per client-chosen key (a session id, a tenant, a
//! tool name).
//!
//! Keys are never stored: an entry is found by a 64-bit SipHash of its key under a key random
//! per store (per process and per stage), so a client cannot choose ids that collide, and a
//! megabyte of id costs 8 bytes here. The store holds at most `cap` entries (the cap is passed
//! on each insert, so a reload can change it): past it, nothing new is inserted and no entry is
//! evicted for a newcomer (the caller decides where the newcomer goes). Entries leave only
//! through [`retain`](Bounded::retain), which the owner's sweeper calls.

use std::hash::{BuildHasher, BuildHasherDefault, Hash, Hasher, RandomState};

use dashmap::DashMap;

/// A map of at most `cap` entries keyed by a keyed hash. See the [module docs](self).
pub(crate) struct Bounded<V> {
    map: DashMap<u64, V, BuildHasherDefault<PassThrough>>,
    keys: RandomState,
}

impl<V> std::fmt::Debug for Bounded<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bounded")
            .field("len", &self.map.len())
            .finish_non_exhaustive()
    }
}

impl<V: Clone> Bounded<V> {
    /// An empty store with a fresh random key.
    pub(crate) fn new() -> Self {
        Bounded {
            map: DashMap::default(),
            keys: RandomState::new(),
        }
    }

    /// The store's hash of `key`: what every other method takes.
    pub(crate) fn key<K: Hash + ?Sized>(&self, key: &K) -> u64 {
        self.keys.hash_one(key)
    }

    /// The entry at `key`, if stored.
    pub(crate) fn get(&self, key: u64) -> Option<V> {
        self.map.get(&key).map(|v| v.clone())
    }

    /// The entry at `key`, made by `make` and stored if absent and fewer than `cap` entries
    /// are stored; `None` when absent and full. (Racing inserts may pass `cap` by at most the
    /// number of threads inserting at that moment.)
    pub(crate) fn get_or_insert(
        &self,
        key: u64,
        cap: usize,
        make: impl FnOnce() -> V,
    ) -> Option<V> {
        if let Some(v) = self.get(key) {
            return Some(v);
        }
        if self.map.len() >= cap {
            return None;
        }
        Some(self.map.entry(key).or_insert_with(make).clone())
    }

    /// Keeps only the entries for which `keep` is true.
    pub(crate) fn retain(&self, mut keep: impl FnMut(&V) -> bool) {
        self.map.retain(|_, v| keep(v));
    }

    /// Calls `f` on every entry.
    pub(crate) fn for_each(&self, mut f: impl FnMut(&V)) {
        for entry in self.map.iter() {
            f(entry.value());
        }
    }

    /// Entries stored.
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether nothing is stored.
    pub(crate) fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

/// The map's own hasher: its keys are already uniform keyed hashes.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct PassThrough(u64);

impl Hasher for PassThrough {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Against a naive reference: never more than `cap` entries, what is stored stays,
        /// a full store refuses newcomers, and keys of any length cost nothing.
        #[test]
        fn holds_the_cap_and_never_evicts(
            cap in 1usize..20,
            keys in proptest::collection::vec(
                proptest::collection::vec(any::<u8>(), 0..2000),
                0..100,
            ),
        ) {
            let store: Bounded<usize> = Bounded::new();
            let mut reference: Vec<Vec<u8>> = Vec::new();
            for (i, k) in keys.iter().enumerate() {
                let got = store.get_or_insert(store.key(k), cap, || i);
                match reference.iter().position(|r| r == k) {
                    // Stored by its first occurrence (a full store never takes one later).
                    Some(_) => prop_assert_eq!(got, keys.iter().position(|x| x == k)),
                    None if reference.len() < cap => {
                        reference.push(k.clone());
                        prop_assert_eq!(got, Some(i));
                    }
                    None => prop_assert_eq!(got, None),
                }
                prop_assert!(store.len() <= cap);
                prop_assert_eq!(store.len(), reference.len());
            }
        }
    }

    #[test]
    fn two_stores_hash_the_same_key_apart() {
        let (a, b) = (Bounded::<()>::new(), Bounded::<()>::new());
        assert_ne!(a.key("session-1"), b.key("session-1"));
        assert_eq!(a.key("session-1"), a.key("session-1"));
    }
}
