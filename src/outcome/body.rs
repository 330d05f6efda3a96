//! Settling calls from their answer: the pending set and the observing body.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use serde::Deserialize;
use serde_json::value::RawValue;
use tokio::time::Instant;

use super::{
    CLIENT_ERROR_CODES, INPUT_VALIDATION_PREFIXES, Observation, Observer, Outcome,
    REQUEST_TIMEOUT_CODE,
};
use crate::call::{Call, SessionId};
use crate::sse::SseParser;

/// The observers every outcome goes to.
pub(crate) type Observers = Arc<[Arc<dyn Observer>]>;

/// Request calls waiting for their answer. Dropped with calls left: they were cancelled.
pub(crate) struct Pending {
    calls: Vec<Call>,
    start: Instant,
    queue_wait: std::time::Duration,
    observers: Observers,
}

impl Pending {
    pub(crate) fn new(
        calls: Vec<Call>,
        queue_wait: std::time::Duration,
        observers: Observers,
    ) -> Self {
        Pending {
            calls,
            start: Instant::now(),
            queue_wait,
            observers,
        }
    }

    fn report(&self, call: &Call, outcome: Outcome, bytes: u64) {
        if outcome == Outcome::ClientError {
            // Rejected unrun: every stage gives back what it charged.
            call.charges.refund();
        }
        let observation = Observation {
            call,
            outcome,
            service_time: self.start.elapsed(),
            response_bytes: bytes,
            queue_wait: self.queue_wait,
        };
        for o in self.observers.iter() {
            o.observe(&observation);
        }
    }

    /// Settles the call answered by a message with this id.
    fn settle(&mut self, id: &RawValue, outcome: Outcome, bytes: u64) {
        let id = id.get().trim();
        if let Some(pos) = self
            .calls
            .iter()
            .position(|c| c.id.as_ref().is_some_and(|i| i.as_json() == id))
        {
            let call = self.calls.swap_remove(pos);
            self.report(&call, outcome, bytes);
        }
    }

    /// Settles every call still waiting.
    pub(crate) fn settle_all(&mut self, outcome: Outcome, bytes: u64) {
        for call in std::mem::take(&mut self.calls) {
            self.report(&call, outcome, bytes);
        }
    }

    /// The server minted `session` in its answer: the `initialize` calls waiting belong to it.
    pub(crate) fn minted(&mut self, session: &SessionId) {
        for call in &mut self.calls {
            if call.method.as_deref() == Some("initialize") {
                call.session = session.clone();
            }
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.calls.is_empty()
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.settle_all(Outcome::Cancelled, 0);
    }
}

#[derive(Deserialize)]
struct Reply<'a> {
    #[serde(borrow, default)]
    id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    result: Option<ResultPart<'a>>,
    #[serde(default)]
    error: Option<ErrorPart>,
}

#[derive(Deserialize)]
struct ResultPart<'a> {
    #[serde(rename = "isError", default)]
    is_error: Option<bool>,
    /// Kept raw: read only for an `isError` result.
    #[serde(borrow, default)]
    content: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct TextBlock<'a> {
    #[serde(borrow, default)]
    text: Option<std::borrow::Cow<'a, str>>,
}

impl ResultPart<'_> {
    /// An `isError` result that says the arguments were invalid (the server's input
    /// validation, before the tool ran): its first text block starts with one of
    /// [`INPUT_VALIDATION_PREFIXES`].
    fn is_input_validation_error(&self) -> bool {
        let Some(content) = self.content else {
            return false;
        };
        let Ok(blocks) = serde_json::from_str::<Vec<TextBlock<'_>>>(content.get()) else {
            return false;
        };
        blocks
            .first()
            .and_then(|b| b.text.as_deref())
            .is_some_and(|t| INPUT_VALIDATION_PREFIXES.iter().any(|p| t.starts_with(p)))
    }
}

#[derive(Deserialize)]
struct ErrorPart {
    code: i64,
}

/// The id and outcome a JSON-RPC answer carries, if it is one.
fn outcome_of(reply: Reply<'_>) -> Option<(&RawValue, Outcome)> {
    let outcome = match (&reply.result, &reply.error) {
        (_, Some(e)) if e.code == REQUEST_TIMEOUT_CODE => Outcome::Timeout,
        (_, Some(e)) if CLIENT_ERROR_CODES.contains(&e.code) => Outcome::ClientError,
        (_, Some(_)) => Outcome::Error,
        (Some(r), None) if r.is_error == Some(true) && r.is_input_validation_error() => {
            Outcome::ClientError
        }
        (Some(r), None) if r.is_error == Some(true) => Outcome::Error,
        (Some(_), None) => Outcome::Ok,
        (None, None) => return None,
    };
    Some((reply.id?, outcome))
}

fn settle_message(pending: &mut Pending, text: &[u8]) {
    if let Ok(reply) = serde_json::from_slice::<Reply<'_>>(text)
        && let Some((id, outcome)) = outcome_of(reply)
    {
        pending.settle(id, outcome, text.len() as u64);
    }
}

/// How an answer is scanned.
pub(crate) enum Scan {
    /// `application/json`: a copy of the body, read at its end.
    Json(BytesMut),
    /// `text/event-stream`: events as they pass.
    Sse(SseParser),
}

impl Scan {
    fn data(&mut self, pending: &mut Pending, chunk: &Bytes) {
        match self {
            Scan::Json(buf) => buf.extend_from_slice(chunk),
            Scan::Sse(parser) => parser.feed(chunk, |event| settle_message(pending, event)),
        }
    }

    fn end(&mut self, pending: &mut Pending) {
        if let Scan::Json(buf) = self {
            let text = buf.trim_ascii();
            match text.first() {
                Some(b'[') => {
                    if let Ok(items) = serde_json::from_slice::<Vec<&RawValue>>(text) {
                        for item in items {
                            settle_message(pending, item.get().as_bytes());
                        }
                    }
                }
                _ => settle_message(pending, text),
            }
        }
        // Whatever the answer did not settle was never answered: the server failed it.
        pending.settle_all(Outcome::Error, 0);
    }
}

pin_project! {
    /// A response body that settles its calls as it passes, without holding any chunk back.
    pub(crate) struct ObservedBody<B> {
        #[pin]
        inner: B,
        scan: Scan,
        pending: Pending,
    }
}

impl<B> ObservedBody<B> {
    pub(crate) fn new(inner: B, scan: Scan, pending: Pending) -> Self {
        ObservedBody {
            inner,
            scan,
            pending,
        }
    }
}

impl<B> Body for ObservedBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.project();
        let frame = this.inner.poll_frame(cx);
        match &frame {
            Poll::Ready(Some(Ok(f))) => {
                if let Some(data) = f.data_ref()
                    && !this.pending.is_empty()
                {
                    this.scan.data(this.pending, data);
                }
            }
            Poll::Ready(Some(Err(_))) => this.pending.settle_all(Outcome::Error, 0),
            Poll::Ready(None) => this.scan.end(this.pending),
            Poll::Pending => {}
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(text: &str) -> Outcome {
        outcome_of(serde_json::from_str(text).unwrap()).unwrap().1
    }

    #[test]
    fn the_clients_mistakes_are_client_errors() {
        for code in CLIENT_ERROR_CODES {
            let text =
                format!(r#"{{"jsonrpc":"2.0","id":1,"error":{{"code":{code},"message":"x"}}}}"#);
            assert_eq!(outcome(&text), Outcome::ClientError, "{code}");
        }
        assert_eq!(
            outcome(r#"{"id":1,"error":{"code":-32603,"message":"internal"}}"#),
            Outcome::Error
        );
        assert_eq!(
            outcome(r#"{"id":1,"error":{"code":-32001,"message":"timeout"}}"#),
            Outcome::Timeout
        );
        for text in [
            "failed to deserialize parameters: missing field `table`",
            "MCP error -32602: Input validation error: Invalid arguments for tool t: x",
            "Input validation error: bad",
        ] {
            let answer = serde_json::json!({"id": 1, "result": {"isError": true,
                "content": [{"type": "text", "text": text}]}});
            assert_eq!(outcome(&answer.to_string()), Outcome::ClientError, "{text}");
        }
        assert_eq!(
            outcome(
                r#"{"id":1,"result":{"isError":true,"content":[{"type":"text","text":"connection pool exhausted"}]}}"#
            ),
            Outcome::Error,
            "a tool's own failure"
        );
        assert_eq!(
            outcome(
                r#"{"id":1,"result":{"content":[{"type":"text","text":"failed to deserialize parameters"}]}}"#
            ),
            Outcome::Ok,
            "only isError results are read"
        );
    }
}
