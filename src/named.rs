//! A map from configured names (tools, resource keys) to their settings, found by a call's
//! [`Name`] through the key it carries: a lookup on the per-call path hashes nothing.
//!
//! Names are keyed by [`key_of`], the key every store uses and a [`Name`] takes once when the
//! call is classified; entries are checked by their text, so two names that share a 64-bit key
//! stay apart.

use std::collections::HashMap;
use std::fmt;
use std::hash::BuildHasherDefault;

use crate::bounded::{PassThrough, key_of};
use crate::call::Name;

/// The names of one key and their values: one, but for a 64-bit accident.
type Entries<V> = Vec<(Box<str>, V)>;

/// Values by name. See the [module docs](self).
#[derive(Clone)]
pub(crate) struct NameMap<V> {
    map: HashMap<u64, Entries<V>, BuildHasherDefault<PassThrough>>,
}

impl<V> Default for NameMap<V> {
    fn default() -> Self {
        NameMap {
            map: HashMap::default(),
        }
    }
}

impl<V> NameMap<V> {
    /// Sets `name`'s value.
    pub(crate) fn insert(&mut self, name: &str, value: V) {
        let entries = self.map.entry(key_of(name)).or_default();
        match entries.iter_mut().find(|(n, _)| &**n == name) {
            Some((_, v)) => *v = value,
            None => entries.push((name.into(), value)),
        }
    }

    /// The value of `name`, by the key it carries.
    pub(crate) fn get(&self, name: &Name) -> Option<&V> {
        self.get_at(name.key(), name.as_str())
    }

    /// The value of `name`, hashed here: off the per-call path.
    pub(crate) fn get_str(&self, name: &str) -> Option<&V> {
        self.get_at(key_of(name), name)
    }

    fn get_at(&self, key: u64, name: &str) -> Option<&V> {
        let entries = self.map.get(&key)?;
        entries.iter().find(|(n, _)| &**n == name).map(|(_, v)| v)
    }

    /// Every name and its value, in no order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&str, &V)> {
        self.map.values().flatten().map(|(n, v)| (&**n, v))
    }
}

impl<K: AsRef<str>, V> FromIterator<(K, V)> for NameMap<V> {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        let mut map = NameMap::default();
        for (name, value) in iter {
            map.insert(name.as_ref(), value);
        }
        map
    }
}

impl<V: fmt::Debug> fmt::Debug for NameMap<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut entries: Vec<_> = self.iter().collect();
        entries.sort_by_key(|(n, _)| *n);
        f.debug_map().entries(entries).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Against a `HashMap` of strings: the same value for every name, by its `Name` and by
        /// its text, the last insert winning.
        #[test]
        fn finds_what_a_map_of_strings_finds(
            entries in proptest::collection::vec(("[a-c]{0,3}", any::<u8>()), 0..40),
            probes in proptest::collection::vec("[a-c]{0,3}", 0..40),
        ) {
            let map: NameMap<u8> = entries.iter().map(|(n, v)| (n.as_str(), *v)).collect();
            let reference: HashMap<&str, u8> = entries.iter().map(|(n, v)| (n.as_str(), *v)).collect();
            for probe in probes.iter().map(String::as_str).chain(reference.keys().copied()) {
                prop_assert_eq!(map.get(&Name::new(probe)), reference.get(probe));
                prop_assert_eq!(map.get_str(probe), reference.get(probe));
            }
            prop_assert_eq!(map.iter().count(), reference.len());
        }
    }

    #[test]
    fn names_that_share_a_key_stay_apart() {
        let mut map = NameMap::default();
        map.map
            .entry(key_of("a"))
            .or_default()
            .push(("b".into(), 2));
        map.insert("a", 1);
        assert_eq!(map.get(&Name::new("a")), Some(&1));
        assert_eq!(map.get_at(key_of("a"), "b"), Some(&2));
        assert_eq!(map.get_at(key_of("a"), "c"), None);
    }
}
