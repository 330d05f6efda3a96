//! A call's resource key from its arguments: their canonical key, read with the envelope in
//! the same pass ([`crate::canonical`]), or, for a tool with configured JSON pointers, the
//! canonical form of the values at those pointers.

use std::hash::{DefaultHasher, Hasher};

use serde_json::Value;

use crate::call::Arguments;
use crate::canonical;
pub use crate::canonical::MAX_HASHED_ARGS;

/// Hashes a call's arguments into `h`: the values at `pointers` (a missing one as `0`), read
/// from a parsed tree of arguments up to [`MAX_HASHED_ARGS`] bytes; else, and for arguments
/// longer or not JSON, their canonical key.
pub(crate) fn hash_arguments(args: &Arguments, pointers: Option<&[String]>, h: &mut DefaultHasher) {
    let tree = pointers
        .filter(|_| args.text.len() <= MAX_HASHED_ARGS)
        .and_then(|p| Some((p, serde_json::from_slice::<Value>(&args.text).ok()?)));
    match tree {
        Some((pointers, value)) => {
            for p in pointers {
                match value.pointer(p) {
                    Some(v) => canonical::of_value(v, h),
                    None => h.write_u8(0),
                }
            }
        }
        None => h.write_u64(args.key()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Call;

    fn key(args: &str, pointers: Option<&[String]>) -> u64 {
        let call = Call::request("tools/call").with_arguments(args);
        let mut h = DefaultHasher::new();
        hash_arguments(call.arguments.as_ref().unwrap(), pointers, &mut h);
        h.finish()
    }

    #[test]
    fn pointers_key_by_their_values_alone() {
        let q = ["/q".to_owned()];
        assert_eq!(
            key(r#"{"q":"x","page":1}"#, Some(&q)),
            key(r#"{"page":2,"q":"x"}"#, Some(&q)),
            "only the pointed value counts"
        );
        assert_ne!(key(r#"{"q":"x"}"#, Some(&q)), key(r#"{"q":"y"}"#, Some(&q)));
        assert_ne!(
            key(r#"{"q":"x","page":1}"#, None),
            key(r#"{"q":"x","page":2}"#, None)
        );
        assert_ne!(
            key(r#"{"r":"x"}"#, Some(&q)),
            key(r#"{"q":"x"}"#, Some(&q)),
            "missing"
        );
        let long = format!(r#"{{"q":"x","pad":"{}"}}"#, " ".repeat(MAX_HASHED_ARGS));
        assert_eq!(
            key(&long, Some(&q)),
            key(&long, None),
            "past the bound: the raw prefix"
        );
    }
}
