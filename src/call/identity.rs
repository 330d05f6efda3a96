//! Who sent a call: its tenant and its session, read from the request.
//!
//! * **Tenant**: the [`Tenant`] request extension, which *your* authentication layer sets
//!   (outside stormgate) once it knows who the caller is. Only when configured
//!   ([`DefaultIdentity::tenant_header`]) is it read from a header, and otherwise it is
//!   `"anonymous"`. A header is not trusted by default because the client chooses it: an agent
//!   that is being throttled could name another tenant, or a fresh one per call, and escape its
//!   tenant's budget or spend someone else's. Trust a header only when a proxy you run sets it
//!   and strips the client's copy.
//! * **Session**: the `Mcp-Session-Id` header, else a keyed hash of the credential the request
//!   presents (`Authorization` by default: MCP 2026-07-28 has no sessions, and an
//!   authenticated agent's token is what tells it from another), else a configurable key of
//!   `params._meta`, else the client's declared info and address, else the tenant.
//!
//! Users with their own scheme implement [`Identify`].

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;

use http::HeaderName;
use http::request::Parts;
use serde_json::value::RawValue;

use super::ids::{SessionId, Tenant, bounded};

/// The `params._meta` object of a message, read lazily.
#[derive(Debug, Clone, Copy, Default)]
pub struct Meta<'a>(Option<&'a str>);

impl<'a> Meta<'a> {
    /// `_meta`'s JSON text, if the message has one.
    pub(crate) fn new(json: Option<&'a str>) -> Self {
        Meta(json)
    }

    /// The string value of `_meta[key]`, if `_meta` is an object holding a string there.
    pub fn get_str(&self, key: &str) -> Option<Cow<'a, str>> {
        serde_json::from_str::<Cow<'a, str>>(self.get_raw(key)?.get()).ok()
    }

    /// The JSON text of `_meta[key]`, as sent, if `_meta` is an object holding `key`.
    pub fn get_raw(&self, key: &str) -> Option<&'a RawValue> {
        let raw = self.0?;
        let map: BTreeMap<Cow<'a, str>, &'a RawValue> = serde_json::from_str(raw).ok()?;
        map.get(key).copied()
    }
}

/// How a call's tenant and session are found. Implement it for your own scheme.
pub trait Identify: Send + Sync + 'static {
    /// The tenant of a request.
    fn tenant(&self, parts: &Parts) -> Tenant;
    /// The session of one message of a request.
    fn session(&self, parts: &Parts, meta: Meta<'_>, tenant: &Tenant) -> SessionId;
}

/// The built-in identity: [`Tenant`] extension (or a configured header), and the session
/// found by this ladder, first match wins:
///
/// 1. the `Mcp-Session-Id` header (the server issued it);
/// 2. the credential the request presents in the credential header
///    ([`credential_header`](Self::credential_header), `Authorization` by default), as a
///    SipHash of its value under a key random per process (`~k` and 16 hex digits): each
///    agent's bearer token is its own session, and the token is never kept or logged in clear;
/// 3. the configured `_meta` key ([`session_meta_key`](Self::session_meta_key)), such as a
///    conversation or run id;
/// 4. session-less requests (MCP 2026-07-28 has no sessions): the client's declared info
///    (`_meta["io.modelcontextprotocol/clientInfo"]`) with its IP address (when served with
///    `into_make_service_with_connect_info::<SocketAddr>()`; not the port, since SDKs open new
///    connections freely), so clients on other hosts or of other names are other sessions.
///    Two instances of one SDK on one host declare the same and are one session: give them a
///    session key (step 3) to tell them apart;
/// 5. the tenant.
///
/// Every step but the last is the client's choice: the session guard gives such an id its own
/// state only once the server has accepted it, so a client that varies it per call gains
/// nothing.
#[derive(Debug, Clone)]
pub struct DefaultIdentity {
    tenant_header: Option<HeaderName>,
    session_meta_key: Option<String>,
    credential_header: Option<HeaderName>,
    credential_key: CredentialKey,
}

/// The key under which credentials are hashed into session ids: random per process (per
/// [`Control`](crate::control::Control), kept across reloads), so ids cannot be computed from
/// a token elsewhere, and the same token is the same session while the process runs.
#[derive(Debug, Clone, Default)]
pub struct CredentialKey(Arc<std::hash::RandomState>);

impl Default for DefaultIdentity {
    fn default() -> Self {
        DefaultIdentity {
            tenant_header: None,
            session_meta_key: None,
            credential_header: Some(http::header::AUTHORIZATION),
            credential_key: CredentialKey::default(),
        }
    }
}

impl DefaultIdentity {
    /// The `Tenant` extension; the session from `Mcp-Session-Id`, the `Authorization`
    /// credential, the declared client, then the tenant.
    pub fn new() -> Self {
        Self::default()
    }

    /// Reads the credential from this header (default `Authorization`); `None`: credentials
    /// are not an identity.
    pub fn credential_header(mut self, header: Option<HeaderName>) -> Self {
        self.credential_header = header;
        self
    }

    /// Hashes credentials under `key` (to keep the same sessions across a reload).
    pub fn credential_key(mut self, key: CredentialKey) -> Self {
        self.credential_key = key;
        self
    }

    /// The key credentials are hashed under.
    pub fn key(&self) -> CredentialKey {
        self.credential_key.clone()
    }

    /// Reads the tenant from this header when no `Tenant` extension is set. Only do this when
    /// a proxy you control sets the header (see the module docs).
    pub fn tenant_header(mut self, header: HeaderName) -> Self {
        self.tenant_header = Some(header);
        self
    }

    /// Reads the session from `params._meta[key]` when there is no `Mcp-Session-Id`.
    pub fn session_meta_key(mut self, key: impl Into<String>) -> Self {
        self.session_meta_key = Some(key.into());
        self
    }
}

impl Identify for DefaultIdentity {
    fn tenant(&self, parts: &Parts) -> Tenant {
        if let Some(tenant) = parts.extensions.get::<Tenant>() {
            return tenant.clone();
        }
        self.tenant_header
            .as_ref()
            .and_then(|h| parts.headers.get(h))
            .and_then(|v| v.to_str().ok())
            .filter(|v| !v.is_empty())
            .map(|v| Tenant::new(bounded(v)))
            .unwrap_or_else(Tenant::anonymous)
    }

    fn session(&self, parts: &Parts, meta: Meta<'_>, tenant: &Tenant) -> SessionId {
        if let Some(id) = parts
            .headers
            .get(&crate::protocol::SESSION_ID)
            .and_then(|v| v.to_str().ok())
            .filter(|v| !v.is_empty())
        {
            return SessionId::new(bounded(id));
        }
        if let Some(credential) = self
            .credential_header
            .as_ref()
            .and_then(|h| parts.headers.get(h))
            .filter(|v| !v.is_empty())
        {
            use std::hash::BuildHasher;
            let hash = self.credential_key.0.hash_one(credential.as_bytes());
            return SessionId::new(format!("~k{hash:016x}"));
        }
        if let Some(id) = self
            .session_meta_key
            .as_deref()
            .and_then(|k| meta.get_str(k))
        {
            return SessionId::new(bounded(&id));
        }
        let info = meta.get_raw(CLIENT_INFO_META_KEY);
        // The address, not the port: SDKs open a new connection for many requests.
        let peer = parts
            .extensions
            .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
            .map(|c| c.0.ip());
        if info.is_none() && peer.is_none() {
            return SessionId::of_tenant(tenant);
        }
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        tenant.as_str().hash(&mut h);
        info.map(RawValue::get).hash(&mut h);
        peer.hash(&mut h);
        SessionId::new(format!("~c{:016x}", h.finish()))
    }
}

/// The `_meta` key under which MCP 2026-07-28 requests declare their client (name, version).
pub const CLIENT_INFO_META_KEY: &str = "io.modelcontextprotocol/clientInfo";
#[cfg(test)]
mod tests {
    use super::*;

    fn session_of(identity: &DefaultIdentity, token: &str) -> SessionId {
        let req = http::Request::post("/mcp")
            .header("authorization", token)
            .body(())
            .unwrap();
        let (parts, ()) = req.into_parts();
        identity.session(&parts, Meta::new(None), &Tenant::anonymous())
    }

    #[test]
    fn a_credential_is_a_session_by_its_keyed_hash() {
        let a = DefaultIdentity::new();
        let s1 = session_of(&a, "Bearer one");
        assert_eq!(
            s1,
            session_of(&a, "Bearer one"),
            "the same token, the same session"
        );
        assert_ne!(s1, session_of(&a, "Bearer two"));
        assert!(s1.as_str().starts_with("~k") && !s1.as_str().contains("one"));
        // Another key (another process): another id for the same token; the same key (a
        // reload keeps it): the same.
        assert_ne!(s1, session_of(&DefaultIdentity::new(), "Bearer one"));
        let reloaded = DefaultIdentity::new().credential_key(a.key());
        assert_eq!(s1, session_of(&reloaded, "Bearer one"));
        // Off: the next rung (here the tenant).
        let off = DefaultIdentity::new().credential_header(None);
        assert_eq!(session_of(&off, "Bearer one").as_str(), "anonymous");
    }
}
