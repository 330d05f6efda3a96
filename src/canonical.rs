//! The canonical form of a call's arguments, as one keyed hash: the same for the same JSON
//! value, whatever its objects' member order and its spacing.
//!
//! Objects hash the same whatever their key order, arrays in order, scalars by their JSON
//! value (a number by serde_json's text of it, a string by its decoded text). It is read from
//! the text while the envelope is read ([`arguments`]), in the same pass, so nothing but the
//! hash is built; from a parsed tree ([`of_value`]) for the values at configured JSON
//! pointers. Arguments longer than [`MAX_HASHED_ARGS`], or whose canonical form cannot be
//! read (a string of an unpaired surrogate, a number out of `f64`'s range, more than 127
//! levels deep), hash their first [`MAX_HASHED_ARGS`] bytes as they are and their length: the
//! cost per call is bounded whatever a client sends.
//!
//! The canonical form is written into one hasher as a stream of tagged tokens (no token is a
//! prefix of another: strings and numbers end in `0xff`, which UTF-8 never holds; arrays end
//! in `]`). An object is the one place order must not count: each member (its key, then its
//! value's stream) is hashed alone and the members are combined by addition, so a call costs
//! one hash per object member, not one per value.
//!
//! Every hash is SipHash under the process's random key ([`crate::bounded::keys`]), so a
//! client cannot choose arguments that collide: ever-new calls made to share a key would hide
//! a flailing session's diversity.

use std::fmt::{self, Write as _};
use std::hash::{BuildHasher, DefaultHasher, Hash, Hasher};
use std::ops::Range;

use serde_json::Value;

use crate::bounded::keys;
use crate::scan::{Bad, Scanner, Str};

/// Argument bytes read for a resource key at most.
pub const MAX_HASHED_ARGS: usize = 64 * 1024;

/// Containers deep a canonical form is read to (serde_json's recursion limit).
const MAX_DEPTH: usize = 127;

/// Reads the value next in `scan` (a call's arguments): its span and its canonical hash, or,
/// when that cannot be read, the hash of its bounded raw prefix. `Err` when it is not JSON.
pub(crate) fn arguments(scan: &mut Scanner<'_>) -> Result<(Range<usize>, u64), Bad> {
    scan.peek();
    let start = scan.pos();
    let mut h = keys().build_hasher();
    match value(scan, &mut h, start, 0) {
        Ok(()) if scan.pos() - start <= MAX_HASHED_ARGS => Ok((start..scan.pos(), h.finish())),
        Ok(()) | Err(Stop::Unkeyable) => {
            scan.seek(start);
            let span = scan.skip()?;
            Ok((span.clone(), raw(scan.slice(span).as_bytes())))
        }
        Err(Stop::Bad) => Err(Bad),
    }
}

/// The canonical hash of arguments given as text (a call not read from a body): as
/// [`arguments`] reads them, the raw prefix when they are not one JSON value.
pub(crate) fn digest(args: &[u8]) -> u64 {
    if args.len() > MAX_HASHED_ARGS {
        return raw(args);
    }
    let Ok(text) = std::str::from_utf8(args) else {
        return raw(args);
    };
    let mut scan = Scanner::new(text);
    match arguments(&mut scan).and_then(|(_, key)| scan.end().map(|()| key)) {
        Ok(key) => key,
        Err(Bad) => raw(args),
    }
}

/// The hash of the bounded raw prefix and the length.
fn raw(args: &[u8]) -> u64 {
    let mut h = keys().build_hasher();
    h.write_u8(b'r');
    h.write(&args[..args.len().min(MAX_HASHED_ARGS)]);
    h.write_usize(args.len());
    h.finish()
}

/// Why a canonical read stopped.
enum Stop {
    /// Not JSON.
    Bad,
    /// JSON, but no canonical form is read of it: the raw prefix is hashed instead.
    Unkeyable,
}

impl From<Bad> for Stop {
    fn from(Bad: Bad) -> Self {
        Stop::Bad
    }
}

/// Reads one value, writing its canonical form into `h`. `start` is where the arguments
/// began, `depth` the containers it is in.
fn value(
    scan: &mut Scanner<'_>,
    h: &mut DefaultHasher,
    start: usize,
    depth: usize,
) -> Result<(), Stop> {
    if scan.pos() - start > MAX_HASHED_ARGS {
        return Err(Stop::Unkeyable);
    }
    // A token is read whole before it is hashed: one past the bound is not hashed.
    let within = |scan: &Scanner<'_>| match scan.pos() - start {
        n if n > MAX_HASHED_ARGS => Err(Stop::Unkeyable),
        _ => Ok(()),
    };
    match scan.peek().ok_or(Bad)? {
        b'"' => {
            let s = scan.string()?;
            within(scan)?;
            string(s, h)
        }
        b'-' | b'0'..=b'9' => {
            let n = scan.number()?;
            within(scan)?;
            number(n, h)
        }
        b't' | b'f' | b'n' => {
            match scan.literal()? {
                "null" => null(h),
                word => boolean(word == "true", h),
            }
            Ok(())
        }
        b'[' if depth < MAX_DEPTH => {
            h.write_u8(b'[');
            scan.array(|scan| value(scan, h, start, depth + 1))?;
            h.write_u8(b']');
            Ok(())
        }
        b'{' if depth < MAX_DEPTH => {
            let mut sum = 0u64;
            scan.object(|scan, key| -> Result<(), Stop> {
                let mut m = keys().build_hasher();
                key.decode(|piece| m.write(piece.as_bytes()))
                    .map_err(|_| Stop::Unkeyable)?;
                m.write_u8(0xff);
                value(scan, &mut m, start, depth + 1)?;
                sum = sum.wrapping_add(m.finish());
                Ok(())
            })?;
            object(sum, h);
            Ok(())
        }
        b'[' | b'{' => Err(Stop::Unkeyable),
        _ => Err(Stop::Bad),
    }
}

/// Writes the canonical form of a parsed value into `h` (what [`arguments`] writes of its
/// text).
pub(crate) fn of_value(v: &Value, h: &mut DefaultHasher) {
    match v {
        Value::Null => null(h),
        Value::Bool(b) => boolean(*b, h),
        Value::Number(n) => number_of(n, h),
        Value::String(s) => {
            h.write_u8(b's');
            s.hash(h);
        }
        Value::Array(items) => {
            h.write_u8(b'[');
            for i in items {
                of_value(i, h);
            }
            h.write_u8(b']');
        }
        Value::Object(map) => {
            let sum = map.iter().fold(0u64, |sum, (k, v)| {
                let mut m = keys().build_hasher();
                k.hash(&mut m);
                of_value(v, &mut m);
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

/// A string by its decoded bytes, then `0xff` (as `str`'s `Hash` writes it).
fn string(s: Str<'_>, h: &mut DefaultHasher) -> Result<(), Stop> {
    h.write_u8(b's');
    s.decode(|piece| h.write(piece.as_bytes()))
        .map_err(|_| Stop::Unkeyable)?;
    h.write_u8(0xff);
    Ok(())
}

/// A number by serde_json's text of it. An integer that fits 64 bits is that text as sent;
/// any other is read as serde_json reads it (and is unkeyable where serde_json refuses it).
fn number(text: &str, h: &mut DefaultHasher) -> Result<(), Stop> {
    let digits = text.strip_prefix('-').unwrap_or(text);
    // `-0` is serde_json's `-0.0`.
    let plain = digits.bytes().all(|b| b.is_ascii_digit()) && digits.len() <= 18 && text != "-0";
    if plain {
        h.write_u8(b'#');
        h.write(text.as_bytes());
        h.write_u8(0xff);
        return Ok(());
    }
    let n = serde_json::from_str::<serde_json::Number>(text).map_err(|_| Stop::Unkeyable)?;
    number_of(&n, h);
    Ok(())
}

/// A parsed number by its JSON text, written straight into the hasher (no `String`).
fn number_of(n: &serde_json::Number, h: &mut DefaultHasher) {
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

/// An object: the sum of its members' hashes, whatever their order.
fn object(sum: u64, h: &mut DefaultHasher) {
    h.write_u8(b'{');
    h.write_u64(sum);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn key(args: &str) -> u64 {
        digest(args.as_bytes())
    }

    /// The naive reference: the text parsed into a tree (serde_json), hashed from it; the raw
    /// prefix where serde_json cannot read it.
    fn reference(args: &str) -> u64 {
        if args.len() > MAX_HASHED_ARGS {
            return raw(args.as_bytes());
        }
        match serde_json::from_str::<Value>(args) {
            Ok(v) => {
                let mut h = keys().build_hasher();
                of_value(&v, &mut h);
                h.finish()
            }
            Err(_) => raw(args.as_bytes()),
        }
    }

    #[test]
    fn a_call_built_by_hand_is_keyed_once_as_it_is_made() {
        let call = crate::Call::request("tools/call").with_arguments(r#"{ "q" : "x" }"#);
        let arguments = call.arguments.as_ref().unwrap();
        assert_eq!(arguments.key, Some(key(r#"{"q":"x"}"#)));
    }

    #[test]
    fn numbers_hash_by_their_text_and_strings_by_theirs() {
        assert_eq!(key(r#"{"n":10}"#), key(r#"{ "n" : 10 }"#));
        assert_ne!(key(r#"{"n":10}"#), key(r#"{"n":11}"#));
        assert_ne!(
            key(r#"{"n":10}"#),
            key(r#"{"n":"10"}"#),
            "a number is not its string"
        );
        assert_eq!(key("1e3"), key("1000.0"), "serde_json's text of the number");
        assert_eq!(key("-0"), key("-0.0"));
        assert_ne!(key("0"), key("-0"));
        assert_eq!(key("1e400"), raw(b"1e400"), "out of f64's range: unkeyable");
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
        assert_eq!(key(r#"{"\u0071":"x"}"#), key(r#"{"q":"x"}"#), "in keys too");
        assert_eq!(
            key(r#"["\ud800"]"#),
            raw(br#"["\ud800"]"#),
            "no text: unkeyable"
        );
    }

    #[test]
    fn long_or_deep_arguments_cost_a_bounded_prefix() {
        let long = format!(r#"{{"q":"{}"}}"#, "x".repeat(4 << 20));
        let other = format!(r#"{{"q":"{}y"}}"#, "x".repeat(4 << 20));
        // Same first 64 KiB, different length: still apart.
        assert_ne!(key(&long), key(&other));
        assert_eq!(key(&long), raw(long.as_bytes()));
        let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        assert_eq!(key(&deep(127)), reference(&deep(127)));
        assert_ne!(key(&deep(127)), raw(deep(127).as_bytes()));
        assert_eq!(
            key(&deep(128)),
            raw(deep(128).as_bytes()),
            "serde_json's limit"
        );
        assert_eq!(key("[1,"), raw(b"[1,"), "not JSON");
    }

    proptest! {
        /// Against the naive reference (a parsed tree, hashed canonically): the same key.
        #[test]
        fn streaming_equals_the_tree(v in arb_json()) {
            let text = v.to_string();
            prop_assert_eq!(key(&text), reference(&text));
        }

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
            any::<u64>().prop_map(|n| Value::Number(n.into())),
            any::<f64>().prop_map(Value::from),
            "[a-z\\\\\"\u{e9}\u{1f600}\n\u{1}]{0,8}".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 32, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                proptest::collection::btree_map("[a-z\"\\\\]{0,4}", inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }
}
