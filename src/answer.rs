//! The one answer scanner: how stormgate reads the MCP server's answers as they pass.
//!
//! An answer is `application/json` (one message, or a batch array, read at its end) or
//! `text/event-stream` (one message an event, read as each event completes; nothing is held
//! back or delayed). [`Scan`] splits it into JSON-RPC messages and parses each once into the
//! one borrowed view, [`Message`] (its `id`, `result` and `error` kept raw), which it hands to
//! a [`Listener`]. [`AnswerBody`] is the one body wrapper: it forwards every frame unchanged and
//! scans it on the way. The listeners are small:
//!
//! * the outcome layer's pending calls (`outcome::body`): each call's [`Outcome`] from the
//!   message that carries its id, the others failed at the end or cancelled on drop;
//! * the idempotency layer's capture: the first call's `result` or `error`, to replay;
//! * the classifier's tool-list learning (`schemas`): which tools declare an
//!   `outputSchema`, from a `tools/list` answer (at most [`MAX_ANSWER`] bytes read);
//! * the deadline's unanswered calls (`deadline`): which ids the stream already answered, so a
//!   cut answers only the others. It keeps its own body (it cuts and appends), around a
//!   [`Scan`].
//!
//! # One scan per layer, not one per stack
//!
//! Each layer that has something to learn from an answer wraps it once with its own listener;
//! a layer with nothing to learn (no pending call, no listed tool, not a `tools/list`) does not
//! wrap at all. A single wrapper for the whole stack would have to sit at one place in it, but
//! the layers do not see the same answer: the outcome layer (innermost) reads the server's own
//! answer and learns of a cut (a call past its deadline, a client gone) from the body being
//! dropped, while the idempotency layer and the classifier sit outside the FIFO limiter, whose
//! deadline cut appends refusals and whose batch merge adds the refused elements. Moving their
//! listeners to one shared scan would change what each of them observes (a call cut at its
//! deadline would count as an error, not as cancelled), and each layer must keep working on its
//! own. In practice the wrappers rarely overlap: the tool-list one only wraps `tools/list`
//! answers and the idempotency one only wraps listed tools' calls, so most answers are scanned
//! once, by the outcome layer, and the bytes of one message are parsed once per wrapper.
//!
//! [`Outcome`]: crate::outcome::Outcome
//! [`MAX_ANSWER`]: crate::mcp::MAX_ANSWER

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::{HeaderMap, header};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::sse::SseParser;

/// How an answer's messages are framed, from its `Content-Type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Framing {
    /// `application/json`: one message or a batch array, read at the end of the body.
    Json,
    /// `text/event-stream`: one message an event, read as each event completes.
    Sse,
}

impl Framing {
    /// The framing `headers` declare: `None` for a `Content-Type` that is neither.
    pub(crate) fn of(headers: &HeaderMap) -> Option<Framing> {
        let content_type = headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        if content_type.starts_with("text/event-stream") {
            Some(Framing::Sse)
        } else if content_type.starts_with("application/json") {
            Some(Framing::Json)
        } else {
            None
        }
    }

    /// [`of`](Self::of), reading anything that is not an event stream as JSON.
    pub(crate) fn or_json(headers: &HeaderMap) -> Framing {
        Self::of(headers).unwrap_or(Framing::Json)
    }
}

/// One JSON-RPC message of an answer, parsed once and borrowed from it. A `null` member reads
/// as absent.
#[derive(Debug, Clone, Copy, Deserialize)]
pub(crate) struct Message<'a> {
    /// The id, raw.
    #[serde(borrow, default)]
    pub(crate) id: Option<&'a RawValue>,
    /// The `result` member, raw.
    #[serde(borrow, default)]
    pub(crate) result: Option<&'a RawValue>,
    /// The `error` member, raw.
    #[serde(borrow, default)]
    pub(crate) error: Option<&'a RawValue>,
    /// Bytes of the message: the batch element, the event's data, or the whole JSON body.
    #[serde(skip)]
    pub(crate) len: usize,
}

impl<'a> Message<'a> {
    /// The message in `text`, if `text` is a JSON object.
    pub(crate) fn parse(text: &'a [u8]) -> Option<Message<'a>> {
        let mut message: Message<'_> = serde_json::from_slice(text).ok()?;
        message.len = text.len();
        Some(message)
    }

    /// The id as JSON text, to compare with a call's.
    pub(crate) fn id(&self) -> Option<&'a str> {
        self.id.map(|i| i.get().trim())
    }
}

/// What a layer learns from an answer, one message at a time.
pub(crate) trait Listener {
    /// Whether it still wants messages: once it does not, the answer passes unread.
    fn wants(&self) -> bool {
        true
    }

    /// One message of the answer.
    fn message(&mut self, message: &Message<'_>);

    /// The answer ended, whole or failed; called once, after its last message. A listener
    /// dropped without it was cut off (the client went away, or a deadline passed).
    fn end(&mut self) {}
}

/// The scanning state of one answer: bytes in, each message to a [`Listener`] once.
#[derive(Debug)]
pub(crate) struct Scan {
    framing: Framing,
    json: Vec<u8>,
    sse: SseParser,
    read: usize,
    limit: usize,
}

impl Scan {
    /// A scan of an answer framed as `framing`, with no bound on what it reads.
    pub(crate) fn new(framing: Framing) -> Self {
        Scan {
            framing,
            json: Vec::new(),
            sse: SseParser::default(),
            read: 0,
            limit: usize::MAX,
        }
    }

    /// Reads at most `limit` bytes: past it, what is left is not read (a JSON body not at all).
    pub(crate) fn with_limit(mut self, limit: usize) -> Self {
        self.limit = limit;
        self
    }

    /// Reads one chunk; an SSE event it completes goes to `listener` at once.
    pub(crate) fn feed(&mut self, chunk: &[u8], listener: &mut impl Listener) {
        if !listener.wants() {
            return;
        }
        self.read = self.read.saturating_add(chunk.len());
        if self.read > self.limit {
            self.json = Vec::new();
            return;
        }
        match self.framing {
            Framing::Json => self.json.extend_from_slice(chunk),
            Framing::Sse => self.sse.feed(chunk, |event| deliver(event, listener)),
        }
    }

    /// The body ended: a JSON body's messages go to `listener`, then its end.
    pub(crate) fn finish(&mut self, listener: &mut impl Listener) {
        let json = std::mem::take(&mut self.json);
        let text = json.trim_ascii();
        match text.first() {
            Some(b'[') => {
                if let Ok(items) = serde_json::from_slice::<Vec<&RawValue>>(text) {
                    for item in items {
                        deliver(item.get().as_bytes(), listener);
                    }
                }
            }
            _ => deliver(text, listener),
        }
        listener.end();
    }
}

fn deliver(text: &[u8], listener: &mut impl Listener) {
    if listener.wants()
        && let Some(message) = Message::parse(text)
    {
        listener.message(&message);
    }
}

/// Whether `frame`, just polled from a body, is the body's last: its end, an error, or a
/// frame after which the body says it has ended (`end_stream`: a sized body such as hyper's
/// `Incoming` with a Content-Length, or a `Full`). A server stops polling a body that says it
/// has ended, so whatever waits for the end must not wait for a `None` that never comes. The
/// one rule of every body wrapper that settles something at the end of an answer.
pub(crate) fn is_last<D, E>(frame: &Option<Result<Frame<D>, E>>, end_stream: bool) -> bool {
    !matches!(frame, Some(Ok(_))) || end_stream
}

pin_project! {
    /// A response body passed on unchanged, frame by frame, and scanned for `L` as it goes.
    pub(crate) struct AnswerBody<B, L> {
        #[pin]
        inner: B,
        scan: Scan,
        listener: L,
        ended: bool,
    }
}

impl<B, L> AnswerBody<B, L> {
    /// Scans `inner` with `scan` for `listener`.
    pub(crate) fn new(inner: B, scan: Scan, listener: L) -> Self {
        AnswerBody {
            inner,
            scan,
            listener,
            ended: false,
        }
    }
}

impl<B, L> Body for AnswerBody<B, L>
where
    B: Body<Data = Bytes>,
    L: Listener,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let mut this = self.project();
        let frame = ready!(this.inner.as_mut().poll_frame(cx));
        if !*this.ended {
            if let Some(Ok(f)) = &frame
                && let Some(data) = f.data_ref()
            {
                this.scan.feed(data, this.listener);
            }
            if is_last(&frame, this.inner.is_end_stream()) {
                *this.ended = true;
                if matches!(frame, Some(Err(_))) {
                    this.listener.end();
                } else {
                    this.scan.finish(this.listener);
                }
            }
        }
        Poll::Ready(frame)
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
    use http_body_util::{BodyExt, StreamBody};
    use proptest::prelude::*;

    /// What a listener saw: each message as (id, member, len), and how many ends.
    #[derive(Debug, Default, Clone, PartialEq, Eq)]
    struct Seen {
        messages: Vec<(Option<String>, &'static str, usize)>,
        ends: usize,
    }

    impl Listener for Seen {
        fn message(&mut self, m: &Message<'_>) {
            let member = match (m.result, m.error) {
                (Some(_), _) => "result",
                (None, Some(_)) => "error",
                (None, None) => "none",
            };
            self.messages
                .push((m.id().map(str::to_owned), member, m.len));
        }

        fn end(&mut self) {
            self.ends += 1;
        }
    }

    fn scan(framing: Framing, chunks: &[&[u8]]) -> Seen {
        let mut seen = Seen::default();
        let mut scan = Scan::new(framing);
        for c in chunks {
            scan.feed(c, &mut seen);
        }
        scan.finish(&mut seen);
        seen
    }

    const ONE: &str = r#"{"jsonrpc":"2.0","id":1,"result":{"content":[]}}"#;
    const TWO: &str = r#"{"jsonrpc":"2.0","id":"b","error":{"code":-32601,"message":"x"}}"#;

    #[test]
    fn a_json_answer_is_one_message_read_at_its_end() {
        let body = format!("  {ONE}\n");
        let (a, b) = body.as_bytes().split_at(10);
        let seen = scan(Framing::Json, &[a, b]);
        assert_eq!(seen.messages, [(Some("1".into()), "result", ONE.len())]);
        assert_eq!(seen.ends, 1);
    }

    #[test]
    fn a_json_batch_is_one_message_an_element() {
        let body = format!("[{ONE}, {TWO}, 5, {{\"id\":null,\"result\":null}}]");
        let seen = scan(Framing::Json, &[body.as_bytes()]);
        assert_eq!(
            seen.messages,
            [
                (Some("1".into()), "result", ONE.len()),
                (Some("\"b\"".into()), "error", TWO.len()),
                (None, "none", r#"{"id":null,"result":null}"#.len()),
            ]
        );
    }

    #[test]
    fn an_answer_that_is_not_json_or_empty_has_no_message_but_ends() {
        for body in [&b"not json"[..], b"", b"  ", b"[1,", b"{\"id\":1"] {
            for framing in [Framing::Json, Framing::Sse] {
                let seen = scan(framing, &[body]);
                assert_eq!(seen.messages, [], "{body:?} {framing:?}");
                assert_eq!(seen.ends, 1);
            }
        }
        let seen = scan(Framing::Sse, &[b"data: not json\n\ndata: \n\n"]);
        assert_eq!(seen.messages, []);
    }

    #[test]
    fn sse_events_are_messages_as_they_complete() {
        let mut seen = Seen::default();
        let mut scan = Scan::new(Framing::Sse);
        scan.feed(
            format!("event: message\ndata: {ONE}\n\nda").as_bytes(),
            &mut seen,
        );
        assert_eq!(
            seen.messages.len(),
            1,
            "the first event, before the body ends"
        );
        scan.feed(format!("ta: {TWO}\n\n").as_bytes(), &mut seen);
        assert_eq!(seen.messages.len(), 2);
        scan.finish(&mut seen);
        assert_eq!(seen.ends, 1);
    }

    #[test]
    fn past_its_limit_a_scan_reads_no_more() {
        let body = format!("data: {ONE}\n\ndata: {TWO}\n\n");
        let mut seen = Seen::default();
        let mut scan = Scan::new(Framing::Sse).with_limit(body.len() - 1);
        let (a, b) = body.as_bytes().split_at(ONE.len() + 8);
        scan.feed(a, &mut seen);
        scan.feed(b, &mut seen);
        assert_eq!(seen.messages.len(), 1);
        let mut seen = Seen::default();
        let mut scan = Scan::new(Framing::Json).with_limit(ONE.len() - 1);
        scan.feed(ONE.as_bytes(), &mut seen);
        scan.finish(&mut seen);
        assert_eq!(seen.messages, []);
    }

    /// Stops wanting after its first message.
    struct First(Seen);

    impl Listener for First {
        fn wants(&self) -> bool {
            self.0.messages.is_empty()
        }
        fn message(&mut self, m: &Message<'_>) {
            self.0.message(m);
        }
    }

    #[test]
    fn a_listener_that_wants_no_more_gets_no_more() {
        let body = format!("data: {ONE}\n\ndata: {TWO}\n\n");
        let mut first = First(Seen::default());
        let mut scan = Scan::new(Framing::Sse);
        scan.feed(body.as_bytes(), &mut first);
        assert_eq!(first.0.messages.len(), 1);
    }

    fn body_of(chunks: Vec<Vec<u8>>) -> impl Body<Data = Bytes, Error = std::convert::Infallible> {
        StreamBody::new(futures::stream::iter(chunks.into_iter().map(|c| {
            Ok::<_, std::convert::Infallible>(Frame::data(Bytes::from(c)))
        })))
    }

    /// A listener whose record outlives the body that owns it.
    #[derive(Clone, Default)]
    struct Shared(std::sync::Arc<std::sync::Mutex<Seen>>);

    impl Listener for Shared {
        fn message(&mut self, m: &Message<'_>) {
            self.0.lock().unwrap().message(m);
        }
        fn end(&mut self) {
            self.0.lock().unwrap().end();
        }
    }

    #[tokio::test]
    async fn each_wrapper_passes_the_bytes_on_and_sees_each_message_once() {
        let body = format!(": ping\n\nevent: message\ndata: {ONE}\n\ndata: {TWO}\n\n");
        let chunks: Vec<Vec<u8>> = body.as_bytes().chunks(7).map(<[u8]>::to_vec).collect();
        let (inner, outer) = (Shared::default(), Shared::default());
        // Two layers' wrappers, one inside the other, as a stack has them.
        let wrapped = AnswerBody::new(
            AnswerBody::new(body_of(chunks), Scan::new(Framing::Sse), inner.clone()),
            Scan::new(Framing::Sse),
            outer.clone(),
        );
        let passed = wrapped.collect().await.unwrap().to_bytes();
        assert_eq!(passed, body.as_bytes(), "unchanged");
        let expected = scan(Framing::Sse, &[body.as_bytes()]);
        assert_eq!(expected.messages.len(), 2);
        for seen in [inner, outer] {
            assert_eq!(*seen.0.lock().unwrap(), expected);
        }
    }

    #[test]
    fn content_types_give_the_framing() {
        let mut h = HeaderMap::new();
        assert_eq!(Framing::of(&h), None);
        assert_eq!(Framing::or_json(&h), Framing::Json);
        h.insert(header::CONTENT_TYPE, "text/event-stream".parse().unwrap());
        assert_eq!(Framing::of(&h), Some(Framing::Sse));
        h.insert(
            header::CONTENT_TYPE,
            "application/json; charset=utf-8".parse().unwrap(),
        );
        assert_eq!(Framing::of(&h), Some(Framing::Json));
        h.insert(header::CONTENT_TYPE, "text/plain".parse().unwrap());
        assert_eq!(Framing::of(&h), None);
        assert_eq!(Framing::or_json(&h), Framing::Json);
    }

    fn message_json() -> impl Strategy<Value = String> {
        (
            prop_oneof![
                Just("1".to_owned()),
                "[a-z]{1,6}".prop_map(|s| format!("\"{s}\"")),
                Just("null".to_owned())
            ],
            prop_oneof![
                Just(r#""result":{"content":[{"type":"text","text":"a\nb"}]}"#),
                Just(r#""error":{"code":-32001,"message":"t"}"#),
                Just(r#""method":"notifications/progress","params":{}"#),
            ],
        )
            .prop_map(|(id, member)| format!(r#"{{"jsonrpc":"2.0","id":{id},{member}}}"#))
    }

    proptest! {
        /// However the body is cut into chunks, the messages are those of the whole body.
        #[test]
        fn chunk_boundaries_do_not_matter(
            messages in prop::collection::vec(message_json(), 0..6),
            crlf in any::<bool>(),
            cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..12),
        ) {
            let eol = if crlf { "\r\n" } else { "\n" };
            let sse: String = messages
                .iter()
                .map(|m| format!(": keep-alive{eol}event: message{eol}id: 7{eol}data: {m}{eol}{eol}"))
                .collect();
            let json = format!("[{}]", messages.join(","));
            for (framing, body) in [(Framing::Sse, sse), (Framing::Json, json)] {
                let bytes = body.as_bytes();
                let mut at: Vec<usize> = cuts.iter().map(|i| i.index(bytes.len() + 1)).collect();
                at.sort_unstable();
                let mut chunks = Vec::new();
                let mut from = 0;
                for to in at {
                    chunks.push(&bytes[from..to]);
                    from = to;
                }
                chunks.push(&bytes[from..]);
                let whole = scan(framing, &[bytes]);
                prop_assert_eq!(whole.messages.len(), messages.len());
                prop_assert_eq!(scan(framing, &chunks), whole);
            }
        }
    }
}
