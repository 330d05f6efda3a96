//! A call's resource key, read from its argument bytes once, bounded, without a `Value` tree.
//!
//! The default key hashes the canonical arguments: objects hash the same whatever their key
//! order (each member is hashed alone and the members are combined by addition), arrays in
//! order, scalars by their JSON value. It is computed while deserializing, so nothing but the
//! hash is built. Arguments longer than [`MAX_HASHED_ARGS`] hash their first
//! [`MAX_HASHED_ARGS`] bytes as they are (and their length): the guard's cost per call is
//! bounded whatever a client sends. Configured JSON pointers read a parsed tree, but only of
//! arguments up to that size.
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
/// to check they are UTF-8. `keys` keys every hash of the canonical form.
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
                        Some(v) => canonical_value(keys, v).hash(h),
                        None => h.write_u8(0),
                    }
                }
            }
            Err(_) => raw(args, h),
        },
        None => {
            let mut de = serde_json::Deserializer::from_slice(args);
            match Canonical(keys)
                .deserialize(&mut de)
                .and_then(|v| de.end().map(|()| v))
            {
                Ok(v) => v.hash(h),
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

fn mix(keys: &RandomState, tag: u8, f: impl FnOnce(&mut DefaultHasher)) -> u64 {
    let mut h = keys.build_hasher();
    h.write_u8(tag);
    f(&mut h);
    h.finish()
}

/// The canonical hash of a parsed value (the same as [`Canonical`] gives its text).
fn canonical_value(keys: &RandomState, v: &Value) -> u64 {
    match v {
        Value::Null => mix(keys, b'n', |_| {}),
        Value::Bool(b) => mix(keys, b'b', |h| b.hash(h)),
        Value::Number(n) => number(keys, n),
        Value::String(s) => string(keys, s),
        Value::Array(items) => mix(keys, b'[', |h| {
            for i in items {
                h.write_u64(canonical_value(keys, i));
            }
        }),
        Value::Object(map) => object(
            keys,
            map.iter()
                .map(|(k, v)| member(keys, key_hash(keys, k), canonical_value(keys, v))),
        ),
    }
}

/// A number by its JSON text, written straight into the hasher (no `String`).
fn number(keys: &RandomState, n: &serde_json::Number) -> u64 {
    /// Hashes the text written to it.
    struct Text<'a>(&'a mut DefaultHasher);
    impl fmt::Write for Text<'_> {
        fn write_str(&mut self, s: &str) -> fmt::Result {
            self.0.write(s.as_bytes());
            Ok(())
        }
    }
    mix(keys, b'#', |h| {
        // Writing into a hasher cannot fail.
        let _ = write!(Text(h), "{n}");
    })
}

fn string(keys: &RandomState, s: &str) -> u64 {
    mix(keys, b's', |h| s.hash(h))
}

fn key_hash(keys: &RandomState, key: &str) -> u64 {
    mix(keys, b'k', |h| key.hash(h))
}

fn member(keys: &RandomState, key: u64, value: u64) -> u64 {
    mix(keys, b':', |h| {
        h.write_u64(key);
        h.write_u64(value);
    })
}

fn object(keys: &RandomState, members: impl Iterator<Item = u64>) -> u64 {
    let sum = members.fold(0u64, u64::wrapping_add);
    mix(keys, b'{', |h| h.write_u64(sum))
}

/// Deserializes any JSON value into its canonical hash under its keys.
struct Canonical<'a>(&'a RandomState);

impl<'de> DeserializeSeed<'de> for Canonical<'_> {
    type Value = u64;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<u64, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Canonical<'_> {
    type Value = u64;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_unit<E>(self) -> Result<u64, E> {
        Ok(canonical_value(self.0, &Value::Null))
    }

    fn visit_bool<E>(self, b: bool) -> Result<u64, E> {
        Ok(canonical_value(self.0, &Value::Bool(b)))
    }

    fn visit_i64<E>(self, n: i64) -> Result<u64, E> {
        Ok(number(self.0, &n.into()))
    }

    fn visit_u64<E>(self, n: u64) -> Result<u64, E> {
        Ok(number(self.0, &n.into()))
    }

    fn visit_f64<E: de::Error>(self, n: f64) -> Result<u64, E> {
        let n = serde_json::Number::from_f64(n).ok_or_else(|| E::custom("not a JSON number"))?;
        Ok(number(self.0, &n))
    }

    fn visit_str<E>(self, s: &str) -> Result<u64, E> {
        Ok(string(self.0, s))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<u64, A::Error> {
        let mut h = self.0.build_hasher();
        h.write_u8(b'[');
        while let Some(item) = seq.next_element_seed(Canonical(self.0))? {
            h.write_u64(item);
        }
        Ok(h.finish())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<u64, A::Error> {
        let mut sum = 0u64;
        while let Some(key) = map.next_key_seed(Key(self.0))? {
            let value = map.next_value_seed(Canonical(self.0))?;
            sum = sum.wrapping_add(member(self.0, key, value));
        }
        Ok(mix(self.0, b'{', |h| h.write_u64(sum)))
    }
}

/// Deserializes an object key into its hash, borrowing it when it has no escapes.
struct Key<'a>(&'a RandomState);

impl<'de> DeserializeSeed<'de> for Key<'_> {
    type Value = u64;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<u64, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for Key<'_> {
    type Value = u64;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object key")
    }

    fn visit_str<E>(self, s: &str) -> Result<u64, E> {
        Ok(key_hash(self.0, s))
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
                (keys.hash_one(canonical_value(keys, &v)), key_under(keys, &text))
            });
            prop_assert_eq!(got, want);
        }
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
