//! What the classifier learns about one JSON-RPC message, and who sent it.
//!
//! The [`ClassifyLayer`](crate::classify::ClassifyLayer) attaches a [`Calls`] to the request
//! extensions of every MCP POST it could parse: one [`Call`] per JSON-RPC message (a batch
//! has several). Every layer below reads it instead of parsing the body again.
//!
//! A [`Call`] is the message (what the client sent: kind, id, method, target, arguments), who
//! sent it (tenant and session: [`Identify`]) and its pipeline state, which the stack writes
//! and never the client (its cost, its deadline, what the stages charged it, the settings its
//! request runs under).

use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;

use crate::charges::Charges;
use crate::protocol::ProtocolVersion;
use crate::rejection::RejectionFormat;
use crate::snapshot::Snapshot;

mod identity;
mod ids;
mod pipeline;
mod record;

pub use identity::{CLIENT_INFO_META_KEY, CredentialKey, DefaultIdentity, Identify, Meta};
pub(crate) use ids::bounded;
pub use ids::{MAX_ID_LEN, Name, RequestId, SessionId, Tenant};
pub(crate) use pipeline::Pipeline;
pub(crate) use record::Record;

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
    pub tool: Option<Name>,
    /// `params.uri` of a `resources/read`.
    pub resource: Option<Name>,
    /// `params.name` of a `prompts/get`.
    pub prompt: Option<Name>,
    /// Who is charged.
    pub tenant: Tenant,
    /// The agent session.
    pub session: SessionId,
    /// The `MCP-Protocol-Version` the request declared, if any.
    pub protocol_version: Option<ProtocolVersion>,
    /// The `Mcp-Method` / `Mcp-Name` headers disagreed with the body (the body won).
    pub header_mismatch: bool,
    /// Byte range of this message inside the request body.
    pub(crate) span: Range<usize>,
    /// Position of this message in the body the client sent (kept when a batch is split).
    pub(crate) seq: u32,
    /// `params.arguments` of a `tools/call`.
    pub(crate) arguments: Option<Arguments>,
    /// Its cost, deadline, charges and settings: the stack's, not the client's.
    pub(crate) pipeline: Pipeline,
}

/// A call's `params.arguments`: the exact bytes (a slice of the body, no copy) and, when the
/// classifier read them keyed, their canonical key, computed in the same pass as the envelope.
#[derive(Debug, Clone)]
pub(crate) struct Arguments {
    pub(crate) text: Bytes,
    /// The canonical key ([`crate::canonical`]); `None` for arguments not read keyed (under
    /// the kill switch's `off`): computed when asked.
    pub(crate) key: Option<u64>,
}

impl Arguments {
    /// The canonical key, computed here when it was not as the body was read.
    pub(crate) fn key(&self) -> u64 {
        self.key
            .unwrap_or_else(|| crate::canonical::digest(&self.text))
    }
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
            header_mismatch: false,
            span: 0..0,
            seq: 0,
            arguments: None,
            pipeline: Pipeline::default(),
        }
    }

    /// Sets the tool name (and makes it a `tools/call`).
    pub fn with_tool(mut self, tool: impl Into<Name>) -> Self {
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

    /// Sets the `tools/call` arguments (JSON text), keyed here once (as the classifier keys
    /// what it reads), not again by each stage that asks for the key.
    pub fn with_arguments(mut self, json: &str) -> Self {
        self.arguments = Some(Arguments {
            text: Bytes::copy_from_slice(json.as_bytes()),
            key: Some(crate::canonical::digest(json.as_bytes())),
        });
        self
    }

    /// The `tools/call` arguments as sent (JSON text), if any.
    pub fn arguments(&self) -> Option<&str> {
        self.arguments
            .as_ref()
            .and_then(|a| std::str::from_utf8(&a.text).ok())
    }

    /// Sets the cost.
    pub fn with_cost(mut self, cost: u32) -> Self {
        self.pipeline.cost = cost;
        self
    }

    /// Weighted cost in budget units: the tool's weight ([`cost`](crate::cost)), else 1.
    pub fn cost(&self) -> u32 {
        self.pipeline.cost
    }

    /// When the call must be answered by (its whole-round deadline), if it has one.
    pub fn deadline(&self) -> Option<tokio::time::Instant> {
        self.pipeline.deadline
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
        &self.pipeline.charges
    }

    /// The settings its request runs under, if a [`Control`](crate::control::Control) built
    /// the stack.
    pub(crate) fn snapshot(&self) -> Option<&Snapshot> {
        self.pipeline.snapshot.as_deref()
    }

    /// Its client's record, as the stage that judges clients found it.
    pub(crate) fn record(&self) -> &Record {
        &self.pipeline.record
    }

    /// The name of what the call targets: the tool, resource uri or prompt name.
    pub fn target(&self) -> Option<&str> {
        self.target_name().map(|t| &**t)
    }

    /// [`target`](Self::target), with its key.
    pub(crate) fn target_name(&self) -> Option<&Name> {
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
