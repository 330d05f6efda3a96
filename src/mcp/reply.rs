//! The responses stormgate writes itself: rejections, 413, unreadable bodies, and the merge
//! of rejected batch elements into the inner service's answer.

use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::response::Response;
use bytes::{Bytes, BytesMut};
use http::{HeaderValue, StatusCode, header};
use http_body::Frame;
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

/// Adds the answers to rejected batch elements to the inner service's answer to the rest,
/// as it passes: nothing of the inner answer is held back or kept.
///
/// * `text/event-stream`: the answers are sent first, one event each, then the inner stream
///   unchanged.
/// * `application/json` (a success): the answers open the inner array (`[a,b,` then the inner
///   elements); a single inner object is wrapped (`[a,b,{...}]`); an empty or unreadable
///   inner answer is replaced by the answers alone.
/// * 202 Accepted (the rest were notifications or responses): replaced by a 200 JSON array
///   of the answers.
/// * anything else (an error status, a body that is neither): returned unchanged; the
///   rejected elements go unanswered, as the inner service's own failure would leave them.
pub(crate) fn merge(inner: Response, elements: Vec<Vec<u8>>) -> Response {
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
    let mut head = join_array(&elements);
    head.pop(); // `[a,b` open, for the inner elements to follow.
    parts.headers.remove(header::CONTENT_LENGTH);
    let body = Body::new(JsonMerge {
        inner: body,
        head: Bytes::from(head),
        state: Merging::Start,
    });
    Response::from_parts(parts, body)
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

/// Where a [`JsonMerge`] is in the inner answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Merging {
    /// Before its first byte that is not white space.
    Start,
    /// After its opening `[`, before the first byte that is not white space.
    InArray,
    /// In a single object: `]` follows its end.
    InObject,
    /// The rest passes as it is.
    Passing,
    /// Not JSON: the answers were sent alone, the rest is read and dropped.
    Dropping,
    Done,
}

/// The inner JSON answer with `head` (`[a,b`: the answers to the refused elements) merged
/// in as it passes.
struct JsonMerge {
    inner: Body,
    head: Bytes,
    state: Merging,
}

impl JsonMerge {
    /// `head`, then `sep`, then `rest`, in one frame.
    fn joined(&self, sep: &[u8], rest: &[u8]) -> Frame<Bytes> {
        let mut out = BytesMut::with_capacity(self.head.len() + sep.len() + rest.len());
        out.extend_from_slice(&self.head);
        out.extend_from_slice(sep);
        out.extend_from_slice(rest);
        Frame::data(out.freeze())
    }
}

impl http_body::Body for JsonMerge {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        loop {
            if self.state == Merging::Done {
                return Poll::Ready(None);
            }
            let frame = match std::task::ready!(Pin::new(&mut self.inner).poll_frame(cx)) {
                Some(Ok(frame)) => frame,
                Some(Err(e)) => return Poll::Ready(Some(Err(e))),
                None => {
                    let last = match self.state {
                        Merging::Start | Merging::InArray | Merging::Dropping => {
                            (self.state != Merging::Dropping).then(|| self.joined(b"]", b""))
                        }
                        Merging::InObject => Some(Frame::data(Bytes::from_static(b"]"))),
                        Merging::Passing | Merging::Done => None,
                    };
                    self.state = Merging::Done;
                    return Poll::Ready(last.map(Ok));
                }
            };
            let data = match frame.into_data() {
                Ok(data) if self.state == Merging::Passing || self.state == Merging::InObject => {
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Ok(data) => data,
                Err(frame) => return Poll::Ready(Some(Ok(frame))),
            };
            if self.state == Merging::Dropping {
                continue;
            }
            let mut rest = &data[..];
            if self.state == Merging::Start {
                let Some(at) = rest.iter().position(|b| !b.is_ascii_whitespace()) else {
                    continue;
                };
                rest = &rest[at..];
                match rest[0] {
                    b'[' => {
                        self.state = Merging::InArray;
                        rest = &rest[1..];
                    }
                    b'{' => {
                        self.state = Merging::InObject;
                        return Poll::Ready(Some(Ok(self.joined(b",", rest))));
                    }
                    _ => {
                        self.state = Merging::Dropping;
                        return Poll::Ready(Some(Ok(self.joined(b"]", b""))));
                    }
                }
            }
            // In the array, before its first element.
            let Some(at) = rest.iter().position(|b| !b.is_ascii_whitespace()) else {
                continue;
            };
            rest = &rest[at..];
            self.state = Merging::Passing;
            let sep: &[u8] = if rest[0] == b']' { b"" } else { b"," };
            return Poll::Ready(Some(Ok(self.joined(sep, rest))));
        }
    }

    fn is_end_stream(&self) -> bool {
        match self.state {
            Merging::Passing => self.inner.is_end_stream(),
            state => state == Merging::Done,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, StreamBody};
    use proptest::prelude::*;

    fn inner(body: &[u8], cuts: &[prop::sample::Index]) -> Response {
        let mut at: Vec<usize> = cuts.iter().map(|i| i.index(body.len() + 1)).collect();
        at.sort_unstable();
        let mut chunks = Vec::new();
        let mut from = 0;
        for to in at.into_iter().chain([body.len()]) {
            chunks.push(Ok::<_, axum::Error>(Frame::data(Bytes::copy_from_slice(
                &body[from..to],
            ))));
            from = to;
        }
        let stream = StreamBody::new(futures::stream::iter(chunks));
        let mut response = Response::new(Body::new(stream));
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        response
    }

    fn merged(body: &[u8], cuts: &[prop::sample::Index], refused: &[Vec<u8>]) -> Vec<u8> {
        let response = merge(inner(body, cuts), refused.to_vec());
        assert!(response.headers().get(header::CONTENT_LENGTH).is_none());
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(response.into_body().collect())
            .unwrap()
            .to_bytes()
            .to_vec()
    }

    proptest! {
        /// However the inner answer comes in chunks, the merged answer is one JSON array of
        /// the inner answer's messages and the refusals; an empty or unreadable inner answer
        /// leaves the refusals alone.
        #[test]
        fn refusals_are_merged_into_the_answer_as_it_passes(
            inner_ids in prop::collection::vec(0u32..100, 0..4),
            single in any::<bool>(),
            space in prop_oneof![Just(""), Just(" \n ")],
            refused in prop::collection::vec(100u32..200, 1..3),
            garbage in prop_oneof![Just(None), Just(Some("")), Just(Some("  ")), Just(Some("oops"))],
            cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..8),
        ) {
            let message = |id: u32| format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{{"a":[1,"]"]}}}}"#);
            let (body, mut expected): (String, Vec<u32>) = match garbage {
                Some(g) => (g.to_owned(), vec![]),
                None if single && !inner_ids.is_empty() => {
                    (format!("{space}{}{space}", message(inner_ids[0])), vec![inner_ids[0]])
                }
                None => {
                    let all: Vec<String> = inner_ids.iter().map(|i| message(*i)).collect();
                    (format!("{space}[{space}{}{space}]{space}", all.join(",")), inner_ids.clone())
                }
            };
            let refusals: Vec<Vec<u8>> = refused.iter().map(|i| message(*i).into_bytes()).collect();
            expected.extend(&refused);
            let out = merged(body.as_bytes(), &cuts, &refusals);
            let array: Vec<serde_json::Value> = serde_json::from_slice(&out)
                .map_err(|e| TestCaseError::fail(format!("{e}: {}", String::from_utf8_lossy(&out))))?;
            let mut ids: Vec<u32> = array.iter().map(|m| m["id"].as_u64().unwrap() as u32).collect();
            ids.sort_unstable();
            expected.sort_unstable();
            prop_assert_eq!(ids, expected);
        }
    }
}
