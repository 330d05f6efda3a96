//! Outcome observation: how long each call took and how it ended, learned once for every
//! layer that needs it.
//!
//! [`OutcomeLayer`] sits innermost, right around the MCP service, so the service time it
//! measures excludes any queue wait. For every request call that reaches the inner service it
//! reports one [`Observation`] to each [`Observer`]:
//!
//! * `application/json` answers: the body is scanned as it passes to the client (chunks are
//!   forwarded at once, not held) and matched by JSON-RPC id at its end;
//! * `text/event-stream` answers (rmcp's default): the events are parsed as they pass, without
//!   buffering the stream or delaying any event, and each call is settled by the event that
//!   carries its id;
//! * an HTTP 5xx, a JSON-RPC error, or a `tools/call` result with `isError: true` is an
//!   [`Outcome::Error`]; JSON-RPC error -32001 (the MCP SDKs' request timeout) is an
//!   [`Outcome::Timeout`]; an HTTP 4xx and the JSON-RPC errors of the client's own mistakes
//!   ([`CLIENT_ERROR_CODES`]: an unknown method or tool, bad arguments, a malformed request)
//!   and `isError` results of the server's input validation ([`INPUT_VALIDATION_PREFIXES`])
//!   are [`Outcome::ClientError`], never evidence against the backend;
//! * a client that goes away (the response future or body dropped before the answer passed) is
//!   [`Outcome::Cancelled`].

mod body;
mod layer;
mod service;

use std::sync::Arc;
use std::time::Duration;

pub use layer::OutcomeLayer;
pub use service::{Observed, ResponseFuture};

pub use crate::extensions::QueueWait;

use crate::call::Call;

/// How a call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// It answered normally.
    Ok,
    /// HTTP 5xx, a JSON-RPC error other than the client's mistakes, or an `isError` tool
    /// result.
    Error,
    /// It timed out (JSON-RPC error -32001).
    Timeout,
    /// The client went away before the answer.
    Cancelled,
    /// The server refused the request as invalid: HTTP 4xx (e.g. an unknown session), or a
    /// JSON-RPC error in [`CLIENT_ERROR_CODES`] (an unknown tool, bad arguments). Not a failure
    /// of the backend: one client's mistakes must not drive the budget down for everyone, nor
    /// open a breaker.
    ClientError,
}

impl Outcome {
    /// How many outcomes there are.
    pub const COUNT: usize = 5;

    /// Every outcome, in [`index`](Self::index) order.
    pub const ALL: [Outcome; Outcome::COUNT] = [
        Outcome::Ok,
        Outcome::Error,
        Outcome::Timeout,
        Outcome::Cancelled,
        Outcome::ClientError,
    ];

    /// The outcome's place in [`ALL`](Self::ALL).
    pub const fn index(self) -> usize {
        match self {
            Outcome::Ok => 0,
            Outcome::Error => 1,
            Outcome::Timeout => 2,
            Outcome::Cancelled => 3,
            Outcome::ClientError => 4,
        }
    }

    /// Whether the backend failed (errors and timeouts; a cancel is the client's doing).
    pub fn is_failure(self) -> bool {
        matches!(self, Outcome::Error | Outcome::Timeout)
    }

    /// The lower-case name used in metric labels.
    pub const fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Error => "error",
            Outcome::Timeout => "timeout",
            Outcome::Cancelled => "cancelled",
            Outcome::ClientError => "client_error",
        }
    }
}

/// One finished call.
#[derive(Debug, Clone, Copy)]
pub struct Observation<'a> {
    /// The call.
    pub call: &'a Call,
    /// How it ended.
    pub outcome: Outcome,
    /// From the inner service being called to the answer passing (queue wait excluded).
    pub service_time: Duration,
    /// Bytes of the answer that carried it (the whole body for JSON, the event for SSE).
    pub response_bytes: u64,
    /// How long it waited in a FIFO queue before it ran (zero when it did not wait).
    pub queue_wait: Duration,
    /// When it finished (the answer passed, or the call was otherwise settled): the one
    /// instant every observer records it at, so none reads the clock again.
    pub at: tokio::time::Instant,
}

/// Receives every [`Observation`], and every refusal. Must be cheap and must not block: it
/// runs on the request and response paths.
pub trait Observer: Send + Sync + 'static {
    /// One call finished.
    fn observe(&self, observation: &Observation<'_>);

    /// A stage refused `call` (it never ran). Reported when the observer is also given to
    /// [`ClassifyLayer::observers`](crate::classify::ClassifyLayer::observers). Does nothing by
    /// default.
    fn refused(&self, call: &Call, rejection: &crate::Rejection) {
        let _ = (call, rejection);
    }
}

/// JSON-RPC error code of a request timeout in the MCP SDKs.
pub const REQUEST_TIMEOUT_CODE: i64 = -32001;

/// JSON-RPC error codes that say the request was the client's mistake: parse error, invalid
/// request, method not found, invalid params (MCP servers answer an unknown tool or bad
/// arguments with -32602). Answered without running anything: [`Outcome::ClientError`].
pub const CLIENT_ERROR_CODES: [i64; 4] = [-32700, -32600, -32601, -32602];

/// How the MCP SDKs begin the `isError` result of a call whose arguments failed the server's
/// input validation (the tool never ran): rmcp (`failed to deserialize parameters`) and the
/// TypeScript SDK (`MCP error -32602: Input validation error`, `Input validation error`).
/// Such a result is an [`Outcome::ClientError`].
pub const INPUT_VALIDATION_PREFIXES: [&str; 3] = [
    "failed to deserialize parameters",
    "MCP error -32602",
    "Input validation error",
];

/// Observers told of refusals, as the classifier hands them to each request's [`Calls`].
///
/// [`Calls`]: crate::Calls
pub(crate) struct Observers(pub(crate) Vec<Arc<dyn Observer>>);

impl crate::call::Refusals for Observers {
    fn refused(&self, call: &Call, rejection: &crate::Rejection) {
        for o in &self.0 {
            o.refused(call, rejection);
        }
    }
}
