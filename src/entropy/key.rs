//! A call's resource key, read from its argument bytes once, bounded, without a `Value` tree.
//!
//! The default key hashes the canonical arguments: objects hash the same whatever their key
//! order, arrays in order, scalars by their JSON value. It is computed while deserializing, so
//! nothing but the hash is built. Arguments longer than [`MAX_HASHED_ARGS`] hash their first
//! [`MAX_HASHED_ARGS`] bytes as they are (and their length): the guard's cost per call is
//! bounded whatever a client sends. Configured JSON pointers read a parsed tree, but only of
//! arguments up to that size.
//!
//! The canonical form is written into one hasher as a stream of tagged tokens (no token is a
//! prefix of another: strings and numbers end in `0xff`, which UTF-8 never holds; arrays end in
//! `]`). An object is the one place order must not count: each member (its key, then its
//! value's stream) is hashed alone and the members are combined by addition, so a call costs
//! one hash per object member, not one per value.
//!
//! Every hash is SipHash under a key random per guard, so a client cannot choose arguments
//! that collide: ever-new calls made to share a key would hide a flailing session's diversity.

use std::fmt::{self, Write as _};
use std::hash::{BuildHasher, DefaultHasher, Hash, Hasher, RandomState};

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

/// Argument bytes read for a resource key at most.
pub const MAX_HASHED_ARGS: usize = 64 * 1024;

/// Hashes the arguments `args` (JSON text, not yet checked) into `h`: canonically, or by their
/// bounded raw prefix when too long or not JSON. Bytes past the bound are never read, not even
/// to check they are UTF-8. `keys` keys the hash of each object member.
pub(crate) fn hash_arguments(
    args: &[u8],
    pointers: Option<&[String]>,
    keys: &RandomState,
    h: &mut DefaultHasher,
) {
    if args.len() > MAX_HASHED_ARGS {
        return raw(args, h);
    }
    match pointers {
        Some(pointers) => match serde_json::from_slice::<Value>(args) {
            Ok(value) => {
                for p in pointers {
                    match value.pointer(p) {
                        Some(v) => canonical_value(keys, v, h),
                        None => h.write_u8(0),
                    }
                }
            }
            Err(_) => raw(args, h),
        },
        None => {
            // Checked as UTF-8 once, whole: read as text, serde does not check each string
            // again.
            let Ok(text) = std::str::from_utf8(args) else {
                return raw(args, h);
            };
            // Into a copy, kept only if the whole text is one JSON value.
            let mut canonical = h.clone();
            let mut de = serde_json::Deserializer::from_str(text);
            let read = Canonical {
                keys,
                h: &mut canonical,
            }
            .deserialize(&mut de);
            match read.and_then(|()| de.end()) {
                Ok(()) => *h = canonical,
                Err(_) => raw(args, h),
            }
        }
    }
}

/// The bounded raw prefix and the length.
fn raw(args: &[u8], h: &mut DefaultHasher) {
    h.write_u8(b'r');
    h.write(&args[..args.len().min(MAX_HASHED_ARGS)]);
    h.write_usize(args.len());
}

/// Writes the canonical form of a parsed value into `h` (what [`Canonical`] writes of its
/// text).
fn canonical_value(keys: &RandomState, v: &Value, h: &mut DefaultHasher) {
    match v {
        Value::Null => null(h),
        Value::Bool(b) => boolean(*b, h),
        Value::Number(n) => number(n, h),
        Value::String(s) => string(s, h),
        Value::Array(items) => {
            h.write_u8(b'[');
            for i in items {
                canonical_value(keys, i, h);
            }
            h.write_u8(b']');
        }
        Value::Object(map) => {
            let sum = map.iter().fold(0u64, |sum, (k, v)| {
                let mut m = member(keys, k);
                canonical_value(keys, v, &mut m);
                sum.wrapping_add(m.finish())
            });
            object(sum, h);
        }
    }
}

fn null(h: &mut DefaultHasher) {
    h.write_u8(b'n');
}

fn boolean(b: bool, h: &mut DefaultHasher) {
    h.write_u8(b'b');
    h.write_u8(u8::from(b));
}

/// A number by its JSON text, written straight into the hasher (no `String`).
fn number(n: &serde_json::Number, h: &mut DefaultHasher) {
    /// Hashes the text written to it.
    struct Text<'a>(&'a mut DefaultHasher);
    impl fmt::Write for Text<'_> {
        fn write_str(&mut self, s: &str) -> fmt::Result {
            self.0.write(s.as_bytes());
            Ok(())
        }
    }
    h.write_u8(b'#');
    // Writing into a hasher cannot fail.
    let _ = write!(Text(h), "{n}");
    h.write_u8(0xff);
}

fn string(s: &str, h: &mut DefaultHasher) {
    h.write_u8(b's');
    // The bytes, then 0xff.
    s.hash(h);
}

/// A member's own hasher, its key written: its value's stream follows.
fn member(keys: &RandomState, key: &str) -> DefaultHasher {
    let mut m = keys.build_hasher();
    key.hash(&mut m);
    m
}

/// An object: the sum of its members' hashes, whatever their order.
fn object(sum: u64, h: &mut DefaultHasher) {
    h.write_u8(b'{');
    h.write_u64(sum);
}

/// Deserializes any JSON value, writing its canonical form into `h`.
struct Canonical<'a> {
    keys: &'a RandomState,
    h: &'a mut DefaultHasher,
}

impl<'de> DeserializeSeed<'de> for Canonical<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Canonical<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        null(self.h);
        Ok(())
    }

    fn visit_bool<E>(self, b: bool) -> Result<(), E> {
        boolean(b, self.h);
        Ok(())
    }

    fn visit_i64<E>(self, n: i64) -> Result<(), E> {
        number(&n.into(), self.h);
        Ok(())
    }

    fn visit_u64<E>(self, n: u64) -> Result<(), E> {
        number(&n.into(), self.h);
        Ok(())
    }

    fn visit_f64<E: de::Error>(self, n: f64) -> Result<(), E> {
        let n = serde_json::Number::from_f64(n).ok_or_else(|| E::custom("not a JSON number"))?;
        number(&n, self.h);
        Ok(())
    }

    fn visit_str<E>(self, s: &str) -> Result<(), E> {
        string(s, self.h);
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let Canonical { keys, h } = self;
        h.write_u8(b'[');
        while let Some(()) = seq.next_element_seed(Canonical { keys, h: &mut *h })? {}
        h.write_u8(b']');
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut sum = 0u64;
        while let Some(mut m) = map.next_key_seed(Key(self.keys))? {
            map.next_value_seed(Canonical {
                keys: self.keys,
                h: &mut m,
            })?;
            sum = sum.wrapping_add(m.finish());
        }
        object(sum, self.h);
        Ok(())
    }
}

/// Deserializes an object key into its member's hasher, borrowing the key when it has no
/// escapes.
struct Key<'a>(&'a RandomState);

impl<'de> DeserializeSeed<'de> for Key<'_> {
    type Value = DefaultHasher;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<DefaultHasher, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for Key<'_> {
    type Value = DefaultHasher;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object key")
    }

    fn visit_str<E>(self, s: &str) -> Result<DefaultHasher, E> {
        Ok(member(self.0, s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    thread_local!(static KEYS: RandomState = RandomState::new());

    fn key_under(keys: &RandomState, args: &str) -> u64 {
        let mut h = keys.build_hasher();
        hash_arguments(args.as_bytes(), None, keys, &mut h);
        h.finish()
    }

    fn key(args: &str) -> u64 {
        KEYS.with(|keys| key_under(keys, args))
    }

    #[test]
    fn keys_are_random_per_guard_and_numbers_hash_by_their_text() {
        let (a, b) = (RandomState::new(), RandomState::new());
        let args = r#"{"q":"orders","n":[1,2.5,-3]}"#;
        assert_eq!(key_under(&a, args), key_under(&a, args));
        assert_ne!(key_under(&a, args), key_under(&b, args));
        assert_eq!(key(r#"{"n":10}"#), key(r#"{ "n" : 10 }"#));
        assert_ne!(key(r#"{"n":10}"#), key(r#"{"n":11}"#));
        assert_ne!(
            key(r#"{"n":10}"#),
            key(r#"{"n":"10"}"#),
            "a number is not its string"
        );
    }

    #[test]
    fn key_order_and_whitespace_do_not_matter_values_do() {
        assert_eq!(
            key(r#"{"a":1,"b":[1,2]}"#),
            key(r#"{ "b" : [1, 2], "a": 1 }"#)
        );
        assert_ne!(key(r#"{"a":1,"b":[1,2]}"#), key(r#"{"a":1,"b":[2,1]}"#));
        assert_ne!(key(r#"{"q":"x"}"#), key(r#"{"q":"y"}"#));
        assert_ne!(key(r#"{"a":{"b":1}}"#), key(r#"{"b":{"a":1}}"#));
        assert_ne!(key("[[1],2]"), key("[[1,2]]"), "where an array ends counts");
        assert_ne!(
            key(r#"["asb"]"#),
            key(r#"["a","b"]"#),
            "where a string ends counts"
        );
        assert_ne!(key("[[]]"), key("[]"));
        assert_ne!(key(r#"{"a":{}}"#), key(r#"{"a":[]}"#));
        assert_eq!(
            key(r#"{"q":"\u0078"}"#),
            key(r#"{"q":"x"}"#),
            "escapes read"
        );
    }

    #[test]
    fn long_arguments_cost_a_bounded_prefix() {
        let long = format!(r#"{{"q":"{}"}}"#, "x".repeat(4 << 20));
        let other = format!(r#"{{"q":"{}y"}}"#, "x".repeat(4 << 20));
        // Same first 64 KiB, different length: still apart.
        assert_ne!(key(&long), key(&other));
        assert_eq!(key(&long), key(&long));
    }

    proptest! {
        /// Against the naive reference (a parsed tree, hashed canonically): the same key.
        #[test]
        fn streaming_equals_the_tree(v in arb_json()) {
            let text = v.to_string();
            let (want, got) = KEYS.with(|keys| {
                let mut h = keys.build_hasher();
                canonical_value(keys, &v, &mut h);
                (h.finish(), key_under(keys, &text))
            });
            prop_assert_eq!(got, want);
        }
    }

    proptest! {
        /// Against what a key means (two arguments share one exactly when they are the same
        /// JSON value): keys agree with `Value` equality, and the same value written with its
        /// objects' members in another order, and other spacing, is the same key.
        #[test]
        fn keys_agree_with_json_equality(a in arb_small(), b in arb_small()) {
            prop_assert_eq!(key(&a.to_string()) == key(&b.to_string()), a == b);
            prop_assert_eq!(key(&a.to_string()), key(&reordered(&a)));
        }
    }

    /// `v` as JSON text with every object's members in reverse order, spaced.
    fn reordered(v: &Value) -> String {
        match v {
            Value::Array(items) => {
                let items: Vec<String> = items.iter().map(reordered).collect();
                format!("[ {} ]", items.join(" , "))
            }
            Value::Object(map) => {
                let members: Vec<String> = map
                    .iter()
                    .rev()
                    .map(|(k, v)| format!("{} : {}", Value::from(k.as_str()), reordered(v)))
                    .collect();
                format!("{{ {} }}", members.join(" , "))
            }
            leaf => leaf.to_string(),
        }
    }

    /// Values of few leaves and shapes, so that two drawn apart are often equal or nearly so.
    fn arb_small() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            Just(Value::from(1)),
            Just(Value::from("")),
            Just(Value::from("a")),
        ];
        leaf.prop_recursive(3, 8, 3, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..3).prop_map(Value::Array),
                proptest::collection::btree_map("[ab]", inner, 0..3)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    fn arb_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|n| Value::Number(n.into())),
            "[a-z\\\\\"]{0,8}".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 32, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                proptest::collection::btree_map("[a-z]{0,4}", inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }
}
