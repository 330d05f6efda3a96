//! One bounded keyed store for state kept per client-chosen key (a session id, a tenant, a
//! tool name).
//!
//! Keys are never stored: an entry is found by a 64-bit SipHash of its key under one key
//! random per process ([`key_of`]), so a client cannot choose ids that collide, and a megabyte
//! of id costs 8 bytes here. Every store hashes a name alike, so a name a call carries is
//! hashed once per call (a [`SessionId`](crate::SessionId), a [`Tenant`](crate::Tenant) and a
//! [`Name`](crate::Name) hold theirs), not once per store that looks it up.
//!
//! The store holds at most `cap` entries (the cap is passed on each insert, so a reload can
//! change it): past it, nothing new is inserted and no entry is evicted for a newcomer: the
//! caller sends it to its store's one shared entry, named [`OVERFLOW`]. Entries leave only
//! through [`retain`](Bounded::retain), which the owner's sweeper calls.

use std::hash::{BuildHasher, BuildHasherDefault, Hash, Hasher, RandomState};
use std::sync::OnceLock;

use dashmap::DashMap;

/// The name of the entry that what a full store turns away shares: the FIFO key of keys past
/// `max_keys`, the tenant of tenants past `max_tenants`, the unverified pool of tenants past
/// the session guard's `max_tenants`.
pub const OVERFLOW: &str = "~overflow";

/// The keyed hash every store finds `key`'s entry by: SipHash under the process's one random
/// key.
pub(crate) fn key_of<K: Hash + ?Sized>(key: &K) -> u64 {
    keys().hash_one(key)
}

/// The process's one random SipHash key: [`key_of`]'s, and the canonical form's of a call's
/// arguments ([`crate::canonical`]).
pub(crate) fn keys() -> &'static RandomState {
    static KEYS: OnceLock<RandomState> = OnceLock::new();
    KEYS.get_or_init(RandomState::new)
}

/// A map of at most `cap` entries keyed by a keyed hash. See the [module docs](self).
pub(crate) struct Bounded<V> {
    map: DashMap<u64, V, BuildHasherDefault<PassThrough>>,
}

impl<V> std::fmt::Debug for Bounded<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bounded")
            .field("len", &self.map.len())
            .finish_non_exhaustive()
    }
}

impl<V> Bounded<V> {
    /// An empty store.
    pub(crate) fn new() -> Self {
        Bounded {
            map: DashMap::default(),
        }
    }

    /// The hash of `key` ([`key_of`]): what every other method takes.
    pub(crate) fn key<K: Hash + ?Sized>(&self, key: &K) -> u64 {
        key_of(key)
    }

    /// The entry at `key`, if stored.
    pub(crate) fn get(&self, key: u64) -> Option<V>
    where
        V: Clone,
    {
        self.map.get(&key).map(|v| v.clone())
    }

    /// The entry at `key`, made by `make` and stored if absent and fewer than `cap` entries
    /// are stored; `None` when absent and full. (Racing inserts may pass `cap` by at most the
    /// number of threads inserting at that moment.)
    pub(crate) fn get_or_insert(&self, key: u64, cap: usize, make: impl FnOnce() -> V) -> Option<V>
    where
        V: Clone,
    {
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

    /// Calls `f` on every entry stored.
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

impl<V> Bounded<V> {
    /// Runs `f` on the entry at `key`, made by `make` and stored first if absent and fewer than
    /// `cap` entries are stored; `None` (and `f` not run) when absent and full. The entry is
    /// locked while `f` runs.
    pub(crate) fn with_entry<R>(
        &self,
        key: u64,
        cap: usize,
        make: impl FnOnce() -> V,
        f: impl FnOnce(&mut V) -> R,
    ) -> Option<R> {
        if !self.map.contains_key(&key) && self.map.len() >= cap {
            return None;
        }
        Some(f(&mut self.map.entry(key).or_insert_with(make)))
    }

    /// Stores `value` at `key` in place of what is there, whatever the cap: for an entry the
    /// caller made under the cap, now settled.
    pub(crate) fn replace(&self, key: u64, value: V) {
        self.map.insert(key, value);
    }

    /// Forgets the entry at `key`.
    pub(crate) fn remove(&self, key: u64) {
        self.map.remove(&key);
    }

    /// Whether an entry is stored at `key`.
    pub(crate) fn contains(&self, key: u64) -> bool {
        self.map.contains_key(&key)
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

    /// One step of the entry API's model.
    #[derive(Debug, Clone)]
    enum Op {
        /// `with_entry`: add one to the entry (made at 0).
        Bump(u8),
        /// `replace` with this value.
        Replace(u8, u32),
        /// `remove`.
        Remove(u8),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            any::<u8>().prop_map(|k| Op::Bump(k % 16)),
            (any::<u8>(), any::<u32>()).prop_map(|(k, v)| Op::Replace(k % 16, v)),
            any::<u8>().prop_map(|k| Op::Remove(k % 16)),
        ]
    }

    proptest! {
        /// The entry API against a map: `with_entry` makes an entry only under the cap and
        /// runs on it under its lock, `replace` stores whatever the cap, `remove` forgets.
        #[test]
        fn the_entry_api_is_a_capped_map(cap in 1usize..8, ops in proptest::collection::vec(op(), 0..200)) {
            let store: Bounded<u32> = Bounded::new();
            let mut reference: std::collections::HashMap<u8, u32> = Default::default();
            for op in ops {
                match op {
                    Op::Bump(k) => {
                        let got = store.with_entry(store.key(&k), cap, || 0, |v| {
                            *v += 1;
                            *v
                        });
                        let want = if reference.contains_key(&k) || reference.len() < cap {
                            let v = reference.entry(k).or_insert(0);
                            *v += 1;
                            Some(*v)
                        } else {
                            None
                        };
                        prop_assert_eq!(got, want);
                    }
                    Op::Replace(k, v) => {
                        store.replace(store.key(&k), v);
                        reference.insert(k, v);
                    }
                    Op::Remove(k) => {
                        store.remove(store.key(&k));
                        reference.remove(&k);
                    }
                }
                prop_assert_eq!(store.len(), reference.len());
                for k in 0..16u8 {
                    prop_assert_eq!(store.contains(store.key(&k)), reference.contains_key(&k));
                    prop_assert_eq!(store.get(store.key(&k)), reference.get(&k).copied());
                }
            }
        }
    }

    proptest! {
        /// Every store hashes a name alike, and as the name's own key does: a session id, a
        /// tenant or a target hashed once when the call is classified finds its entry in every
        /// store.
        #[test]
        fn every_store_hashes_a_name_as_the_name_does(a in ".{0,300}", b in ".{0,300}") {
            let (x, y) = (Bounded::<()>::new(), Bounded::<()>::new());
            prop_assert_eq!(x.key(a.as_str()), y.key(a.as_str()));
            prop_assert_eq!(crate::SessionId::new(a.as_str()).key(), x.key(a.as_str()));
            prop_assert_eq!(crate::Tenant::new(a.as_str()).key(), x.key(a.as_str()));
            prop_assert_eq!(crate::Name::new(a.as_str()).key(), x.key(a.as_str()));
            if a != b {
                prop_assert_ne!(x.key(a.as_str()), x.key(b.as_str()));
            }
        }
    }
}
