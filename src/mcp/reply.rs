//! The responses stormgate writes itself: rejections, 413, unreadable bodies, and the merge
//! of rejected batch elements into the inner service's answer.

use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::response::Response;
use bytes::{Bytes, BytesMut};
use http::{HeaderValue, StatusCode, header};
use http_body::Frame;
use http_body_util::BodyExt;
use serde::Serialize;
use serde_json::value::RawValue;

use crate::answer::Framing;
use crate::call::{Call, Calls};
use crate::rejection::{Rejection, RejectionData, RejectionFormat};
use crate::sse;

/// JSON-RPC "Invalid Request".
const INVALID_REQUEST: i64 = -32600;

#[derive(Serialize)]
struct Reply<'a, T: Serialize> {
    jsonrpc: &'static str,
    id: &'a RawValue,
    #[serde(flatten)]
    body: T,
}

#[derive(Serialize)]
enum Outcome<'a> {
    #[serde(rename = "error")]
    Error {
        code: i64,
        message: std::borrow::Cow<'a, str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        data: Option<RejectionData>,
    },
    #[serde(rename = "result")]
    ToolResult {
        content: [TextContent; 1],
        #[serde(rename = "isError")]
        is_error: bool,
        #[serde(rename = "structuredContent", skip_serializing_if = "Option::is_none")]
        structured_content: Option<RejectionData>,
        /// The data, for a tool that declares an `outputSchema` it would not match.
        #[serde(rename = "_meta", skip_serializing_if = "Option::is_none")]
        meta: Option<RejectionMeta>,
        /// `complete` under revisions that have it (2026-07-28 and later).
        #[serde(rename = "resultType", skip_serializing_if = "Option::is_none")]
        result_type: Option<&'a str>,
    },
}

/// `_meta` of a tool-result refusal; the key is [`META_KEY`](super::META_KEY).
#[derive(Serialize)]
struct RejectionMeta {
    #[serde(rename = "io.stormgate/rejection")]
    rejection: RejectionData,
}

#[derive(Serialize)]
struct TextContent {
    #[serde(rename = "type")]
    kind: &'static str,
    text: String,
}

fn null() -> &'static RawValue {
    // A `&'static RawValue` for `null` without allocating per call.
    static NULL: std::sync::OnceLock<Box<RawValue>> = std::sync::OnceLock::new();
    NULL.get_or_init(|| RawValue::from_string("null".into()).expect("null is JSON"))
}

fn write_json<T: Serialize>(out: &mut Vec<u8>, value: &T) {
    serde_json::to_writer(out, value).expect("serializing to a Vec cannot fail");
}

/// Writes the JSON-RPC answer to one rejected call.
pub(crate) fn rejection_element(
    call: &Call,
    rejection: &Rejection,
    calls: &Calls,
    out: &mut Vec<u8>,
) {
    let format: &RejectionFormat = &calls.format;
    let id: &RawValue = match &call.id {
        Some(id) => id.raw(),
        None => null(),
    };
    let modern = call
        .protocol_version
        .is_some_and(|v| v.reserves_rate_limit_code());
    let message = rejection.message_in(&format.message);
    let body = if let Some(tool) = call.tool.as_deref().filter(|_| format.tool_result) {
        let (structured_content, meta) = if calls.schemas.declares(tool) {
            let rejection = rejection.data();
            (None, Some(RejectionMeta { rejection }))
        } else {
            (Some(rejection.data()), None)
        };
        Outcome::ToolResult {
            content: [TextContent {
                kind: "text",
                text: message,
            }],
            is_error: true,
            structured_content,
            meta,
            result_type: modern.then_some("complete"),
        }
    } else {
        Outcome::Error {
            code: if modern {
                format.modern_code
            } else {
                format.code
            },
            message: message.into(),
            data: Some(rejection.data()),
        }
    };
    write_json(
        out,
        &Reply {
            jsonrpc: "2.0",
            id,
            body,
        },
    );
}

/// The answer elements of `rejected` (indices into `calls`), each serialized on its own.
pub(crate) fn rejection_elements(calls: &Calls, rejected: &[(usize, Rejection)]) -> Vec<Vec<u8>> {
    rejected
        .iter()
        .map(|(i, r)| {
            let mut out = Vec::with_capacity(192);
            rejection_element(&calls.calls[*i], r, calls, &mut out);
            out
        })
        .collect()
}

fn retry_after_header(rejections: impl Iterator<Item = u64>) -> Option<HeaderValue> {
    rejections.max().map(HeaderValue::from)
}

/// A response of `status` with the JSON `body`.
pub(crate) fn json_response(status: StatusCode, body: impl Into<Body>) -> Response {
    let mut res = Response::new(body.into());
    *res.status_mut() = status;
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    res
}

/// The whole answer to a request every request element of which was rejected, and that holds
/// nothing else worth forwarding.
pub(crate) fn rejection_response(calls: &Calls, rejected: &[(usize, Rejection)]) -> Response {
    let elements = rejection_elements(calls, rejected);
    let body = if calls.batch {
        join_array(&elements)
    } else {
        elements.into_iter().next().unwrap_or_default()
    };
    let mut res = json_response(StatusCode::OK, body);
    if let Some(v) = retry_after_header(rejected.iter().map(|(_, r)| r.retry_after_secs())) {
        res.headers_mut().insert(header::RETRY_AFTER, v);
    }
    res
}

/// A JSON-RPC "Invalid Request" error with id null, for bodies stormgate refuses to read.
pub(crate) fn invalid_request(status: StatusCode, message: &str) -> Response {
    json_response(status, error_element(None, INVALID_REQUEST, message))
}

/// The JSON-RPC error answer `code`, `message` (no `data`) to the call with `id` (`None`:
/// null).
pub(crate) fn error_element(id: Option<&RawValue>, code: i64, message: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(128);
    write_json(
        &mut out,
        &Reply {
            jsonrpc: "2.0",
            id: id.unwrap_or(null()),
            body: Outcome::Error {
                code,
                message: message.into(),
                data: None,
            },
        },
    );
    out
}

/// `[a,b,c]` from serialized elements.
pub(crate) fn join_array<B: AsRef<[u8]>>(elements: &[B]) -> Vec<u8> {
    let len = elements.iter().map(|e| e.as_ref().len() + 1).sum::<usize>() + 2;
    let mut out = Vec::with_capacity(len);
    out.push(b'[');
    for (i, e) in elements.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(e.as_ref());
    }
    out.push(b']');
    out
}

/// Adds the answers to rejected batch elements to the inner service's answer to the rest.
///
/// * `text/event-stream`: the answers are sent first, one event each, then the inner stream
///   unchanged (nothing of it is buffered).
/// * `application/json` (a success): the inner array (or single object) is extended.
/// * 202 Accepted (the rest were notifications or responses): replaced by a 200 JSON array
///   of the answers.
/// * anything else (an error status, a body that is not JSON): returned unchanged; the
///   rejected elements go unanswered, as the inner service's own failure would leave them.
pub(crate) async fn merge(inner: Response, elements: Vec<Vec<u8>>) -> Response {
    let (mut parts, body) = inner.into_parts();
    let framing = Framing::of(&parts.headers);
    if framing == Some(Framing::Sse) {
        let mut head = BytesMut::new();
        for e in &elements {
            sse::write_event(&mut head, e);
        }
        parts.headers.remove(header::CONTENT_LENGTH);
        let body = Body::new(Prepend {
            head: Some(head.freeze()),
            inner: body,
        });
        return Response::from_parts(parts, body);
    }
    if parts.status == StatusCode::ACCEPTED {
        return json_response(StatusCode::OK, join_array(&elements));
    }
    if !parts.status.is_success() || framing != Some(Framing::Json) {
        return Response::from_parts(parts, body);
    }
    let bytes = match body.collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) => return Response::from_parts(parts, Body::new(Failed(Some(e)))),
    };
    let text = bytes.trim_ascii();
    let mut all: Vec<&[u8]> = Vec::with_capacity(elements.len() + 1);
    let inner_elements;
    match text.first() {
        Some(b'[') => {
            inner_elements = serde_json::from_slice::<Vec<&RawValue>>(text).unwrap_or_default();
            all.extend(inner_elements.iter().map(|e| e.get().as_bytes()));
        }
        Some(b'{') => all.push(text),
        _ => {}
    }
    all.extend(elements.iter().map(Vec::as_slice));
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, Body::from(join_array(&all)))
}

/// A body that yields `head` and then `inner`.
struct Prepend {
    head: Option<Bytes>,
    inner: Body,
}

impl http_body::Body for Prepend {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        if let Some(head) = self.head.take() {
            return Poll::Ready(Some(Ok(Frame::data(head))));
        }
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.head.is_none() && self.inner.is_end_stream()
    }
}

/// A body that fails at once with the error reading the original failed with.
struct Failed(Option<axum::Error>);

impl http_body::Body for Failed {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Poll::Ready(self.0.take().map(Err))
    }
}
