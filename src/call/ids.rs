//! The names a call is known by: its tenant, its session, its target, its JSON-RPC id, each
//! bounded where a client chooses it; the first three carry their key in every store of
//! per-name state, taken once.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use serde_json::value::RawValue;

use crate::bounded::key_of;

/// Implements what a name with its cached store key shares: its constructor (which takes the
/// key), the text, equality, order and hashing by the text alone (the key is a function of
/// it), `Debug` and `Display` as the text.
macro_rules! keyed_name {
    ($name:ident, $new:literal, $text:literal) => {
        impl PartialEq for $name {
            fn eq(&self, other: &Self) -> bool {
                self.key == other.key && self.name == other.name
            }
        }

        impl Eq for $name {}

        impl std::hash::Hash for $name {
            fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
                self.name.hash(state);
            }
        }

        impl PartialOrd for $name {
            fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
                Some(self.cmp(other))
            }
        }

        impl Ord for $name {
            fn cmp(&self, other: &Self) -> std::cmp::Ordering {
                self.name.cmp(&other.name)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_tuple(stringify!($name))
                    .field(&&*self.name)
                    .finish()
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.name)
            }
        }

        impl $name {
            #[doc = $new]
            pub fn new(name: impl Into<Arc<str>>) -> Self {
                let name = name.into();
                $name {
                    key: key_of(&*name),
                    name,
                }
            }

            #[doc = $text]
            pub fn as_str(&self) -> &str {
                &self.name
            }

            /// The name's key in every store of state kept per name (its keyed hash, taken
            /// once when it is made): the one hash of it a call costs.
            pub(crate) fn key(&self) -> u64 {
                self.key
            }
        }
    };
}

/// The tenant a call is charged to. Insert it as a request extension from your auth layer.
///
/// ```
/// let mut req = http::Request::new(());
/// req.extensions_mut().insert(stormgate::Tenant::new("acme"));
/// ```
#[derive(Clone)]
pub struct Tenant {
    name: Arc<str>,
    key: u64,
}

keyed_name!(Tenant, "A tenant with this name.", "The tenant's name.");

impl Tenant {
    /// The tenant every unauthenticated call belongs to.
    pub fn anonymous() -> Self {
        static ANONYMOUS: std::sync::LazyLock<Tenant> =
            std::sync::LazyLock::new(|| Tenant::new("anonymous"));
        ANONYMOUS.clone()
    }
}

/// The agent session a call belongs to.
#[derive(Clone)]
pub struct SessionId {
    name: Arc<str>,
    key: u64,
}

keyed_name!(SessionId, "A session with this id.", "The session id.");

impl SessionId {
    /// The tenant's name as a session (the identity's last rung), shared, not copied, with
    /// its key.
    pub(crate) fn of_tenant(tenant: &Tenant) -> Self {
        SessionId {
            name: tenant.name.clone(),
            key: tenant.key,
        }
    }
}

/// What a call targets: a tool's name, a resource's URI or a prompt's name, with its key in
/// every store of state kept per target (taken once, when the call is classified). Reads as
/// the text (`Deref<Target = str>`), so `call.tool.as_deref() == Some("search")` works.
#[derive(Clone)]
pub struct Name {
    name: Arc<str>,
    key: u64,
}

keyed_name!(Name, "A target with this name.", "The name.");

impl Name {
    /// The name with its key known (a store that hashed it already).
    pub(crate) fn with_key(name: Arc<str>, key: u64) -> Self {
        debug_assert_eq!(key, key_of(&*name));
        Name { name, key }
    }

    /// The name, shared.
    pub(crate) fn shared(&self) -> &Arc<str> {
        &self.name
    }

    /// The name, shared, without its key.
    pub(crate) fn into_shared(self) -> Arc<str> {
        self.name
    }
}

impl std::ops::Deref for Name {
    type Target = str;

    fn deref(&self) -> &str {
        &self.name
    }
}

impl From<&str> for Name {
    fn from(name: &str) -> Self {
        Name::new(name)
    }
}

impl From<String> for Name {
    fn from(name: String) -> Self {
        Name::new(name)
    }
}

impl From<Arc<str>> for Name {
    fn from(name: Arc<str>) -> Self {
        Name::new(name)
    }
}

/// A JSON-RPC id exactly as the client wrote it (number, string or null), echoed verbatim.
/// Classified from a body, it is that body's text (a slice of it, not a copy).
#[derive(Clone)]
pub struct RequestId(Bytes);

impl RequestId {
    /// Parses an id from its JSON text.
    pub fn from_json(json: &str) -> Result<Self, serde_json::Error> {
        let json = json.trim();
        serde_json::from_str::<&RawValue>(json)?;
        Ok(RequestId(Bytes::copy_from_slice(json.as_bytes())))
    }

    /// The id's JSON text, as sent.
    pub fn as_json(&self) -> &str {
        // The text of a parsed JSON value: UTF-8 by construction.
        std::str::from_utf8(&self.0).unwrap_or("null")
    }

    /// The id's JSON text as bytes: compared without reading it as text again.
    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The id whose JSON text `json` was read from `body`: its span of `body`.
    pub(crate) fn in_body(body: &Bytes, json: &str) -> Self {
        RequestId(body.slice_ref(json.as_bytes()))
    }

    pub(crate) fn raw(&self) -> &RawValue {
        serde_json::from_str(self.as_json()).unwrap_or(RawValue::NULL)
    }
}

impl fmt::Debug for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("RequestId").field(&self.as_json()).finish()
    }
}

impl PartialEq for RequestId {
    fn eq(&self, other: &Self) -> bool {
        self.as_json() == other.as_json()
    }
}

impl Eq for RequestId {}

/// The longest client-chosen identity (session id, tenant header) kept as it is, bytes.
pub const MAX_ID_LEN: usize = 128;

/// `id` as stored: as it is up to [`MAX_ID_LEN`] bytes, else `~` and a 64-bit hash of it (so a
/// megabyte of `Mcp-Session-Id` costs 17 bytes wherever the id is kept or logged, and long
/// ids stay apart).
pub(crate) fn bounded(id: &str) -> Cow<'_, str> {
    if id.len() <= MAX_ID_LEN {
        return Cow::Borrowed(id);
    }
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    id.hash(&mut h);
    Cow::Owned(format!("~{:016x}", h.finish()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Any client-chosen identity is stored in at most MAX_ID_LEN bytes, and distinct long
        /// ids stay apart.
        #[test]
        fn ids_of_any_length_are_stored_bounded(a in ".{0,400}", b in ".{0,400}") {
            let (x, y) = (bounded(&a), bounded(&b));
            prop_assert!(x.len() <= MAX_ID_LEN);
            if a.len() <= MAX_ID_LEN {
                prop_assert_eq!(&*x, a.as_str());
            }
            if a != b {
                prop_assert_ne!(x, y);
            }
        }
    }
}
