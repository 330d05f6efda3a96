//! What the classifier learns about one JSON-RPC message, and who sent it.
//!
//! The [`ClassifyLayer`](crate::classify::ClassifyLayer) attaches a [`Calls`] to the request
//! extensions of every MCP POST it could parse: one [`Call`] per JSON-RPC message (a batch
//! has several). Every layer below reads it instead of parsing the body again.
//!
//! # Identity
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
use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use http::HeaderName;
use http::request::Parts;
use serde_json::value::RawValue;

use crate::charges::Charges;
use crate::protocol::ProtocolVersion;
use crate::rejection::RejectionFormat;
use crate::snapshot::Snapshot;

/// The tenant a call is charged to. Insert it as a request extension from your auth layer.
///
/// ```
/// let mut req = http::Request::new(());
/// req.extensions_mut().insert(stormgate::Tenant::new("acme"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tenant(Arc<str>);

impl Tenant {
    /// A tenant with this name.
    pub fn new(name: impl Into<Arc<str>>) -> Self {
        Tenant(name.into())
    }

    /// The tenant every unauthenticated call belongs to.
    pub fn anonymous() -> Self {
        static ANONYMOUS: std::sync::LazyLock<Tenant> =
            std::sync::LazyLock::new(|| Tenant(Arc::from("anonymous")));
        ANONYMOUS.clone()
    }

    /// The tenant's name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Tenant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The agent session a call belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionId(Arc<str>);

impl SessionId {
    /// A session with this id.
    pub fn new(id: impl Into<Arc<str>>) -> Self {
        SessionId(id.into())
    }

    /// The session id.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
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

    /// The id `raw`, a value parsed from `body`: its span of `body`.
    pub(crate) fn in_body(body: &Bytes, raw: &RawValue) -> Self {
        RequestId(body.slice_ref(raw.get().as_bytes()))
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

/// What kind of JSON-RPC message a [`Call`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CallKind {
    /// A request: has a method and an id, expects an answer. Only requests are charged.
    Request,
    /// A notification: a method without an id. Never charged, never answered with an error.
    Notification,
    /// A client's response to a server request (`result` or `error`). Never charged.
    Response,
    /// A batch element that is not a JSON-RPC message. Forwarded for the inner service to
    /// answer; never charged.
    Invalid,
}

/// One classified JSON-RPC message.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Call {
    /// Request, notification or response.
    pub kind: CallKind,
    /// The JSON-RPC id (requests and responses).
    pub id: Option<RequestId>,
    /// The method (`tools/call`, `resources/read`, ...); `None` for responses.
    pub method: Option<Arc<str>>,
    /// `params.name` of a `tools/call`.
    pub tool: Option<Arc<str>>,
    /// `params.uri` of a `resources/read`.
    pub resource: Option<Arc<str>>,
    /// `params.name` of a `prompts/get`.
    pub prompt: Option<Arc<str>>,
    /// Who is charged.
    pub tenant: Tenant,
    /// The agent session.
    pub session: SessionId,
    /// The `MCP-Protocol-Version` the request declared, if any.
    pub protocol_version: Option<ProtocolVersion>,
    /// Weighted cost in budget units (1 until tool weights exist).
    pub cost: u32,
    /// The `Mcp-Method` / `Mcp-Name` headers disagreed with the body (the body won).
    pub header_mismatch: bool,
    /// Byte range of this message inside the request body.
    pub(crate) span: Range<usize>,
    /// Position of this message in the body the client sent (kept when a batch is split).
    pub(crate) seq: u32,
    /// `params.arguments` of a `tools/call`, the exact bytes (a slice of the body, no copy).
    pub(crate) arguments: Option<Bytes>,
    /// When the call must be answered by (its whole-round deadline), if it has one.
    pub deadline: Option<tokio::time::Instant>,
    /// What the stages charged it, shared by every copy of it (see [`Charges`]).
    pub(crate) charges: Charges,
    /// The settings its request runs under (see [`Snapshot`]), when a
    /// [`Control`](crate::control::Control) built the stack.
    pub(crate) snapshot: Option<Arc<Snapshot>>,
}

impl CallKind {
    /// The lower-case name used in metric labels.
    pub const fn as_str(self) -> &'static str {
        match self {
            CallKind::Request => "request",
            CallKind::Notification => "notification",
            CallKind::Response => "response",
            CallKind::Invalid => "invalid",
        }
    }
}

impl Call {
    /// A request with this method, id 1, the anonymous tenant and session, cost 1: for tests,
    /// benches and custom classifiers.
    pub fn request(method: impl Into<Arc<str>>) -> Self {
        Call {
            kind: CallKind::Request,
            id: Some(RequestId::from_json("1").expect("valid json")),
            method: Some(method.into()),
            tool: None,
            resource: None,
            prompt: None,
            tenant: Tenant::anonymous(),
            session: SessionId::new("anonymous"),
            protocol_version: None,
            cost: 1,
            header_mismatch: false,
            span: 0..0,
            seq: 0,
            arguments: None,
            deadline: None,
            charges: Charges::default(),
            snapshot: None,
        }
    }

    /// Sets the tool name (and makes it a `tools/call`).
    pub fn with_tool(mut self, tool: impl Into<Arc<str>>) -> Self {
        self.method = Some("tools/call".into());
        self.tool = Some(tool.into());
        self
    }

    /// Sets the tenant.
    pub fn with_tenant(mut self, tenant: Tenant) -> Self {
        self.tenant = tenant;
        self
    }

    /// Sets the session.
    pub fn with_session(mut self, session: SessionId) -> Self {
        self.session = session;
        self
    }

    /// Sets the `tools/call` arguments (JSON text).
    pub fn with_arguments(mut self, json: &str) -> Self {
        self.arguments = Some(Bytes::copy_from_slice(json.as_bytes()));
        self
    }

    /// The `tools/call` arguments as sent (JSON text), if any.
    pub fn arguments(&self) -> Option<&str> {
        self.arguments
            .as_deref()
            .and_then(|b| std::str::from_utf8(b).ok())
    }

    /// Sets the cost.
    pub fn with_cost(mut self, cost: u32) -> Self {
        self.cost = cost;
        self
    }

    /// Whether this message is charged and may be rejected (only requests are).
    pub fn is_chargeable(&self) -> bool {
        self.kind == CallKind::Request
    }

    /// What the stages that admitted this call charged it. An [`Admission`] of your own
    /// records its refund here; see [`Charges`].
    ///
    /// [`Admission`]: crate::admit::Admission
    pub fn charges(&self) -> &Charges {
        &self.charges
    }

    /// The settings its request runs under, if a [`Control`](crate::control::Control) built
    /// the stack.
    pub(crate) fn snapshot(&self) -> Option<&Snapshot> {
        self.snapshot.as_deref()
    }

    /// The name of what the call targets: the tool, resource uri or prompt name.
    pub fn target(&self) -> Option<&str> {
        self.target_name().map(|t| &**t)
    }

    /// [`target`](Self::target), shared.
    pub(crate) fn target_name(&self) -> Option<&Arc<str>> {
        self.tool
            .as_ref()
            .or(self.resource.as_ref())
            .or(self.prompt.as_ref())
    }
}

/// Who is told that a stage refused a call (it never ran): the classifier's observers.
pub(crate) trait Refusals: Send + Sync {
    /// `call` was refused with `rejection`.
    fn refused(&self, call: &Call, rejection: &crate::Rejection);
}

/// The classifier's output for one HTTP request: every JSON-RPC message of its body.
///
/// Attached to the request extensions by [`ClassifyLayer`](crate::classify::ClassifyLayer).
/// Its absence means the request is not MCP (GET, DELETE, non-JSON, not JSON-RPC); such
/// requests also carry an [`Unclassified`] marker when they were POSTs.
#[derive(Clone)]
pub struct Calls {
    /// Shared by every copy of the request's calls (a copy is a reference count).
    pub(crate) calls: Arc<[Call]>,
    pub(crate) batch: bool,
    pub(crate) body: Bytes,
    pub(crate) format: Arc<RejectionFormat>,
    /// Which tools declare an `outputSchema` (for the tool-result form).
    pub(crate) schemas: Arc<crate::schemas::ToolSchemas>,
    /// Told of every refusal of these calls.
    pub(crate) refusals: Arc<dyn Refusals>,
}

impl fmt::Debug for Calls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Calls")
            .field("calls", &self.calls)
            .field("batch", &self.batch)
            .field("format", &self.format)
            .finish_non_exhaustive()
    }
}

impl Calls {
    /// The messages, in body order.
    pub fn iter(&self) -> std::slice::Iter<'_, Call> {
        self.calls.iter()
    }

    /// How many messages the body holds.
    pub fn len(&self) -> usize {
        self.calls.len()
    }

    /// Whether the body holds no message (an empty batch).
    pub fn is_empty(&self) -> bool {
        self.calls.is_empty()
    }

    /// Whether the body was a JSON-RPC batch array.
    pub fn is_batch(&self) -> bool {
        self.batch
    }

    /// The one message of a non-batch body.
    pub fn single(&self) -> Option<&Call> {
        match (self.batch, &self.calls[..]) {
            (false, [call]) => Some(call),
            _ => None,
        }
    }

    /// How rejections of these calls are written.
    pub fn format(&self) -> &RejectionFormat {
        &self.format
    }

    /// The body bytes of message `index`, exactly as sent.
    pub(crate) fn raw(&self, index: usize) -> Bytes {
        self.body.slice(self.calls[index].span.clone())
    }
}

/// Marker extension on a POST the classifier could not read as JSON-RPC; it was forwarded as is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unclassified {
    /// The body is not JSON.
    NotJson,
    /// The body is JSON but not a JSON-RPC message or batch of messages.
    NotJsonRpc,
    /// A JSON-RPC batch where batches do not exist (the declared protocol version has none,
    /// or `[classify] batches = "off"`): forwarded untouched and charged nothing, so the MCP
    /// server's own answer applies in every mode.
    BatchUnsupported,
}

impl Unclassified {
    /// The snake_case name used in metric labels.
    pub const fn as_str(self) -> &'static str {
        match self {
            Unclassified::NotJson => "not_json",
            Unclassified::NotJsonRpc => "not_json_rpc",
            Unclassified::BatchUnsupported => "batch_unsupported",
        }
    }
}

/// The `params._meta` object of a message, read lazily.
#[derive(Debug, Clone, Copy, Default)]
pub struct Meta<'a>(Option<&'a RawValue>);

impl<'a> Meta<'a> {
    pub(crate) fn new(raw: Option<&'a RawValue>) -> Self {
        Meta(raw)
    }

    /// The string value of `_meta[key]`, if `_meta` is an object holding a string there.
    pub fn get_str(&self, key: &str) -> Option<Cow<'a, str>> {
        serde_json::from_str::<Cow<'a, str>>(self.get_raw(key)?.get()).ok()
    }

    /// The JSON text of `_meta[key]`, as sent, if `_meta` is an object holding `key`.
    pub fn get_raw(&self, key: &str) -> Option<&'a RawValue> {
        let raw = self.0?;
        let map: BTreeMap<Cow<'a, str>, &'a RawValue> = serde_json::from_str(raw.get()).ok()?;
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
            .get(crate::protocol::SESSION_ID)
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
            return SessionId(tenant.0.clone());
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

/// [`bounded`], of a shared name: the name itself (shared, not copied) when it fits.
pub(crate) fn bounded_name(name: &Arc<str>) -> Arc<str> {
    match bounded(name) {
        Cow::Borrowed(_) => name.clone(),
        Cow::Owned(hashed) => hashed.into(),
    }
}

/// Marks a request the whole stack lets by untouched (mode `off` with `off = "pass_through"`):
/// the classifier does not read it, so no stage finds calls in it to count, charge or judge.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bypassed;

/// Whether a stage that reads the classifier's output has seen a request no classify layer
/// read: a POST without [`Calls`] or an [`Unclassified`] marker comes from a stack built in
/// the wrong order. Logged once per layer.
#[derive(Debug, Default)]
pub(crate) struct Unread(std::sync::atomic::AtomicBool);

impl Unread {
    /// Logs, the first time, when `req` is a POST no classify layer read; `stage` names the
    /// layer that got it.
    pub(crate) fn check<B>(&self, req: &http::Request<B>, stage: &'static str) {
        let read = req.extensions().get::<Calls>().is_some()
            || req.extensions().get::<Unclassified>().is_some()
            || req.extensions().get::<Bypassed>().is_some();
        if req.method() == http::Method::POST
            && !read
            && !self.0.swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            tracing::warn!(
                stage,
                "a POST no ClassifyLayer read: it is let through unchecked; put ClassifyLayer \
                 outside every stormgate layer"
            );
        }
    }
}

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
