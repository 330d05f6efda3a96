//! The names calls carry (methods, tools, prompts), each kept once and shared by
//! every call that names it, so classifying a call copies no name it has seen before.
//!
//! Bounded: at most [`MAX_NAMES`] names of at most [`MAX_NAME_LEN`] bytes, never evicted. A
//! name past either bound (a client can make up a new tool name per call) is copied for its
//! call alone, as it would be without the table: nothing is lost but the sharing.

use std::sync::{Arc, LazyLock};

use crate::bounded::Bounded;
use crate::call::Name;

/// The methods MCP's clients send, most frequent first: each shared by every table of the
/// process from the start, and found by its text, with no hash and no look in a table.
const METHODS: [&str; 19] = [
    "tools/call",
    "notifications/initialized",
    "initialize",
    "tools/list",
    "ping",
    "resources/read",
    "prompts/get",
    "notifications/cancelled",
    "notifications/progress",
    "resources/list",
    "resources/templates/list",
    "resources/subscribe",
    "resources/unsubscribe",
    "prompts/list",
    "completion/complete",
    "logging/setLevel",
    "notifications/roots/list_changed",
    "tasks/get",
    "tasks/result",
];

/// [`METHODS`], shared.
static KNOWN: LazyLock<[Arc<str>; METHODS.len()]> = LazyLock::new(|| METHODS.map(Arc::from));

/// Names kept at most.
pub(crate) const MAX_NAMES: usize = 4096;
/// Longest name kept, bytes.
pub(crate) const MAX_NAME_LEN: usize = 128;

/// The shared names. See the [module docs](self).
#[derive(Debug)]
pub(crate) struct Names(Bounded<Name>);

impl Default for Names {
    fn default() -> Self {
        Names(Bounded::new())
    }
}

impl Names {
    /// A call's method, shared: one of MCP's methods (see [`METHODS`]) without a look in the
    /// table, any other kept as a name is.
    pub(crate) fn method(&self, method: &str) -> Arc<str> {
        match METHODS.iter().position(|&m| m == method) {
            Some(i) => KNOWN[i].clone(),
            None => self.get(method).into_shared(),
        }
    }

    /// `name`, shared when it is kept, with its key (hashed once, here).
    pub(crate) fn get(&self, name: &str) -> Name {
        let key = self.0.key(name);
        let own = || Name::with_key(Arc::from(name), key);
        if name.len() > MAX_NAME_LEN {
            return own();
        }
        match self.0.get_or_insert(key, MAX_NAMES, own) {
            // Two names may share a 64-bit hash (the key is random per process): compared.
            Some(kept) if kept.as_str() == name => kept,
            _ => own(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_is_kept_once_and_the_store_is_bounded() {
        let names = Names::default();
        let a = names.get("tools/call");
        assert_eq!(
            a.key(),
            crate::bounded::key_of("tools/call"),
            "with its key"
        );
        assert!(
            Arc::ptr_eq(a.shared(), names.get("tools/call").shared()),
            "shared"
        );
        let long = "x".repeat(MAX_NAME_LEN + 1);
        assert_eq!(&*names.get(&long), long, "a long name is its own copy");
        for i in 0..2 * MAX_NAMES {
            assert_eq!(&*names.get(&format!("t{i}")), format!("t{i}"));
        }
        assert_eq!(names.0.len(), MAX_NAMES, "never past the bound");
        assert_eq!(&*names.method("tools/call"), "tools/call");
        assert_eq!(
            &*names.method("t1"),
            "t1",
            "a made-up method: a name of the table"
        );
        assert_eq!(&*names.method("x/y"), "x/y", "past the bound: its own copy");
        assert!(
            Arc::ptr_eq(a.shared(), names.get("tools/call").shared()),
            "kept names stay"
        );
    }

    #[test]
    fn a_known_method_is_shared_by_every_table_and_stores_nothing() {
        let (a, b) = (Names::default(), Names::default());
        for m in METHODS {
            assert_eq!(&*a.method(m), m);
            assert!(Arc::ptr_eq(&a.method(m), &b.method(m)), "{m}");
        }
        assert!(a.0.is_empty(), "known methods take no place in the table");
        let own = a.method("vendor/custom");
        assert!(
            !Arc::ptr_eq(&own, &b.method("vendor/custom")),
            "each table keeps its own"
        );
        assert!(
            Arc::ptr_eq(&own, &a.method("vendor/custom")),
            "kept as a name"
        );
        let distinct: std::collections::HashSet<_> = METHODS.iter().collect();
        assert_eq!(distinct.len(), METHODS.len(), "no method listed twice");
    }
}
