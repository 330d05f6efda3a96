//! The one answer scanner: how stormgate reads the MCP server's answers as they pass.
//!
//! An answer is `application/json` (one message, or a batch array) or `text/event-stream` (one
//! message an event). [`Scan`] reads it as it passes, in constant memory whatever its size:
//! the SSE framing line by line without keeping a line, and the JSON of each message with the
//! streaming [`json::Reader`], which keeps only what the listeners read (the id, `result` or
//! `error` and its code, `isError` and the start of the first content text, a `tools/list`
//! entry's name). Each message goes to a [`Listener`] as a [`Message`] the moment its closing
//! brace passes; nothing is held back or delayed. [`AnswerBody`] is the one body wrapper
//! ([`Watched`]) with a scan for its watch: it forwards every frame unchanged and scans it on
//! the way. The listeners are small:
//!
//! * the outcome layer's pending calls (`outcome::body`): each call's [`Outcome`] from the
//!   message that carries its id, the others failed at the end or cancelled on drop;
//! * the idempotency layer's capture: the first call's `result` or `error`, to replay (the one
//!   listener that keeps a message's bytes, up to a bound it sets);
//! * the classifier's tool-list learning (`schemas`): which tools declare an
//!   `outputSchema`, from each entry of a `tools/list` answer;
//! * the deadline's unanswered calls (`deadline`): which ids the stream already answered, so a
//!   cut answers only the others. It keeps its own body (it cuts and appends), around a
//!   [`Scan`].
//!
//! # Memory
//!
//! A scan is a fixed-size value (under a kilobyte: the id up to [`json::ID_MAX`] bytes, a text
//! prefix of [`json::TEXT_MAX`], a tool name of [`MAX_NAME`](crate::mcp::MAX_NAME)); a
//! gigabyte answer, a gigabyte SSE line or an event that never ends costs the same. Only a
//! listener that asks to keep messages ([`Listener::keep`]) holds bytes, and no more than it
//! asked.
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
//! once, by the outcome layer.
//!
//! [`Outcome`]: crate::outcome::Outcome

pub(crate) mod json;

use crate::sse::{Events, SseParser};
use crate::watched::{Watch, Watched};
use bytes::Bytes;
use http::{HeaderMap, header};

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

/// What the scan read of one JSON-RPC message of an answer, borrowed from it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Message<'a> {
    /// The id (`None`: absent or `null`).
    pub(crate) id: Option<json::Id<'a>>,
    /// A `result` member that is not `null`.
    pub(crate) result: bool,
    /// An `error` member that is not `null`.
    pub(crate) error: bool,
    /// The error's `code`, if it is an integer.
    pub(crate) code: Option<i64>,
    /// `result.isError` is `true`.
    pub(crate) is_error: bool,
    /// The start of `result.content[0].text`, decoded: at most [`json::TEXT_MAX`] bytes.
    pub(crate) text: &'a [u8],
    /// The message's own bytes, for a listener that keeps them and if they fitted.
    pub(crate) raw: Option<&'a [u8]>,
    /// Bytes of the message: the batch element, the event's data, or the whole JSON body.
    pub(crate) len: usize,
}

impl Message<'_> {
    /// Whether this message carries the id whose JSON text is `id`.
    pub(crate) fn answers(&self, id: &str) -> bool {
        self.id.is_some_and(|i| i.is(id.as_bytes()))
    }
}

/// What a layer learns from an answer, one message at a time.
pub(crate) trait Listener {
    /// Whether it still wants messages: once it does not, the answer passes unread.
    fn wants(&self) -> bool {
        true
    }

    /// Bytes of a message it keeps whole ([`Message::raw`]), at most; 0 (the default) keeps
    /// none. Asked as each message starts.
    fn keep(&self) -> usize {
        0
    }

    /// One entry of a `result.tools` list, as the entry closes: its name, and whether it
    /// declares an `outputSchema` (not `null`).
    fn tool(&mut self, _name: &str, _declares_output_schema: bool) {}

    /// One message of the answer.
    fn message(&mut self, message: &Message<'_>);

    /// The answer ended, whole or failed; called once, after its last message. A listener
    /// dropped without it was cut off (the client went away, or a deadline passed).
    fn end(&mut self) {}
}

/// The scanning state of one answer: bytes in, each message to a [`Listener`] once. Its size
/// is fixed (see the module docs).
#[derive(Debug)]
pub(crate) struct Scan {
    framing: Framing,
    json: json::Reader,
    sse: SseParser,
}

impl Scan {
    /// A scan of an answer framed as `framing`.
    pub(crate) fn new(framing: Framing) -> Self {
        Scan {
            framing,
            json: json::Reader::default(),
            sse: SseParser::default(),
        }
    }

    /// Reads one chunk; a message it completes goes to `listener` at once.
    pub(crate) fn feed(&mut self, chunk: &[u8], listener: &mut impl Listener) {
        if !listener.wants() {
            return;
        }
        match self.framing {
            Framing::Json => self.json.feed(chunk, listener),
            Framing::Sse => self.sse.feed(
                chunk,
                &mut EventData {
                    json: &mut self.json,
                    listener,
                },
            ),
        }
    }

    /// The body ended.
    pub(crate) fn finish(&mut self, listener: &mut impl Listener) {
        listener.end();
    }
}

/// Each SSE event's data, read as one JSON text.
struct EventData<'a, L> {
    json: &'a mut json::Reader,
    listener: &'a mut L,
}

impl<L: Listener> Events for EventData<'_, L> {
    fn data(&mut self, bytes: &[u8]) {
        self.json.feed(bytes, self.listener);
    }

    fn event(&mut self) {
        self.json.reset();
    }
}

/// A response body passed on unchanged, frame by frame, and scanned for `L` as it goes.
pub(crate) type AnswerBody<B, L> = Watched<B, Scanned<L>>;

/// The watch of an [`AnswerBody`]: an answer's [`Scan`] and the [`Listener`] it reads for.
#[derive(Debug)]
pub(crate) struct Scanned<L> {
    scan: Scan,
    /// The listener.
    pub(crate) listener: L,
}

impl<L> Scanned<L> {
    /// Scans with `scan` for `listener`.
    pub(crate) fn new(scan: Scan, listener: L) -> Self {
        Scanned { scan, listener }
    }
}

impl<L: Listener> Watch<Bytes> for Scanned<L> {
    fn data(&mut self, data: &Bytes) {
        self.scan.feed(data, &mut self.listener);
    }

    fn end(&mut self, failed: bool) {
        if failed {
            self.listener.end();
        } else {
            self.scan.finish(&mut self.listener);
        }
    }
}

/// Reads `text` as one JSON answer, calling `each` with every message (for other modules'
/// tests).
#[cfg(test)]
pub(crate) fn read_each(text: &[u8], each: impl FnMut(&Message<'_>)) {
    struct Each<F>(F);
    impl<F: FnMut(&Message<'_>)> Listener for Each<F> {
        fn message(&mut self, message: &Message<'_>) {
            (self.0)(message);
        }
    }
    let mut each = Each(each);
    let mut scan = Scan::new(Framing::Json);
    scan.feed(text, &mut each);
    scan.finish(&mut each);
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body::{Body, Frame};
    use http_body_util::{BodyExt, StreamBody};
    use proptest::prelude::*;

    /// What a listener saw: each message as (id, member, len), and how many ends.
    #[derive(Debug, Default, Clone, PartialEq, Eq)]
    struct Seen {
        messages: Vec<(Option<String>, &'static str, usize)>,
        ends: usize,
    }

    /// An id as text, for the tests' records.
    fn id_text(id: Option<json::Id<'_>>) -> Option<String> {
        id.map(|i| match i {
            json::Id::Text(t) => String::from_utf8(t.to_vec()).unwrap(),
            json::Id::Long(len, _) => format!("<{len} bytes>"),
        })
    }

    impl Listener for Seen {
        fn message(&mut self, m: &Message<'_>) {
            let member = match (m.result, m.error) {
                (true, _) => "result",
                (false, true) => "error",
                (false, false) => "none",
            };
            self.messages.push((id_text(m.id), member, m.len));
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
    fn a_json_answer_is_one_message() {
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
            AnswerBody::new(
                body_of(chunks),
                Scanned::new(Scan::new(Framing::Sse), inner.clone()),
            ),
            Scanned::new(Scan::new(Framing::Sse), outer.clone()),
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

    /// Everything a listener can read of an answer, for comparing with a reference.
    #[derive(Debug, Default, Clone, PartialEq)]
    struct Read {
        messages: Vec<Summary>,
        tools: Vec<(String, bool)>,
    }

    #[derive(Debug, Clone, PartialEq)]
    struct Summary {
        id: Option<String>,
        result: bool,
        error: bool,
        code: Option<i64>,
        is_error: bool,
        text: Vec<u8>,
        len: usize,
        raw: Option<Vec<u8>>,
    }

    /// Keeps messages of up to `keep` bytes.
    struct Reads {
        keep: usize,
        read: Read,
    }

    impl Listener for Reads {
        fn keep(&self) -> usize {
            self.keep
        }
        fn tool(&mut self, name: &str, declares: bool) {
            self.read.tools.push((name.to_owned(), declares));
        }
        fn message(&mut self, m: &Message<'_>) {
            self.read.messages.push(Summary {
                id: id_text(m.id),
                result: m.result,
                error: m.error,
                code: m.code,
                is_error: m.is_error,
                text: m.text.to_vec(),
                len: m.len,
                raw: m.raw.map(<[u8]>::to_vec),
            });
        }
    }

    fn read(framing: Framing, chunks: &[&[u8]], keep: usize) -> Read {
        let mut reads = Reads {
            keep,
            read: Read::default(),
        };
        let mut scan = Scan::new(framing);
        for c in chunks {
            scan.feed(c, &mut reads);
        }
        scan.finish(&mut reads);
        reads.read
    }

    /// What serde_json reads of one message `text` whose id was written as `id`: the
    /// reference for the streaming reader.
    fn reference(text: &str, id: &str, keep: usize, read: &mut Read) {
        let v: serde_json::Value = serde_json::from_str(text).unwrap();
        let present = |k: &str| v.get(k).is_some_and(|m| !m.is_null());
        let result = v.get("result");
        let error = v.get("error");
        let mut first_text = result
            .and_then(|r| r.get("content"))
            .and_then(|c| c.get(0))
            .and_then(|b| b.get("text"))
            .and_then(|t| t.as_str())
            .unwrap_or("")
            .as_bytes()
            .to_vec();
        first_text.truncate(json::TEXT_MAX);
        let id = match v.get("id") {
            Some(serde_json::Value::String(_) | serde_json::Value::Number(_)) => {
                Some(if id.len() > json::ID_MAX {
                    format!("<{} bytes>", id.len())
                } else {
                    id.to_owned()
                })
            }
            _ => None,
        };
        if let Some(tools) = result
            .and_then(|r| r.get("tools"))
            .and_then(|t| t.as_array())
        {
            for tool in tools {
                if let Some(name) = tool.get("name").and_then(|n| n.as_str())
                    && name.len() <= crate::mcp::MAX_NAME
                {
                    let declares = tool.get("outputSchema").is_some_and(|s| !s.is_null());
                    read.tools.push((name.to_owned(), declares));
                }
            }
        }
        read.messages.push(Summary {
            id,
            result: present("result"),
            error: present("error"),
            code: error.and_then(|e| e.get("code")).and_then(|c| c.as_i64()),
            is_error: result.and_then(|r| r.get("isError")) == Some(&serde_json::Value::Bool(true)),
            text: first_text,
            len: text.len(),
            raw: (text.len() <= keep).then(|| text.as_bytes().to_vec()),
        });
    }

    /// A JSON string literal as a server may write it: escaped by serde_json, or with some
    /// characters as `\u` escapes (surrogate pairs included).
    fn string_literal() -> impl Strategy<Value = String> {
        prop_oneof![
            "[a-zA-Z \"\\\\/\n\t{}\\[\\]:,é😀]{0,80}"
                .prop_map(|s| serde_json::to_string(&s).unwrap()),
            Just(r#""Input \u0076alidation error: \"x\"""#.to_owned()),
            Just(r#""MCP error -32602: bad \ud83d\ude00 \u00e9""#.to_owned()),
            Just(r#""failed to deserialize parameters: \\ \/ \b\f\n\r\t""#.to_owned()),
        ]
    }

    /// Values the reader must skip without losing its place.
    fn junk() -> impl Strategy<Value = String> {
        let leaf = prop_oneof![
            Just("null".to_owned()),
            Just("true".to_owned()),
            Just("-12.5e3".to_owned()),
            Just("1".to_owned()),
            string_literal(),
        ];
        leaf.prop_recursive(4, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4)
                    .prop_map(|v| format!("[{}]", v.join(","))),
                prop::collection::vec(
                    (
                        prop_oneof![
                            Just("id"),
                            Just("result"),
                            Just("error"),
                            Just("text"),
                            Just("x")
                        ],
                        inner
                    ),
                    0..4
                )
                .prop_map(|v| {
                    let members: Vec<String> = v
                        .iter()
                        .enumerate()
                        .map(|(i, (k, v))| format!("\"{k}{i}\":{v}"))
                        .collect();
                    format!("{{{}}}", members.join(","))
                }),
            ]
        })
    }

    fn id_json() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("1".to_owned()),
            Just("-7".to_owned()),
            Just("null".to_owned()),
            Just(r#"{"nested":1}"#.to_owned()),
            "[a-z]{0,8}".prop_map(|s| format!("\"{s}\"")),
            Just(r#""a\"b\\c""#.to_owned()),
            (250usize..300).prop_map(|n| format!("\"{}\"", "i".repeat(n))),
        ]
    }

    fn result_json() -> impl Strategy<Value = String> {
        let tool = (
            prop_oneof![
                "[a-z_]{1,10}".prop_map(|s| format!("\"{s}\"")),
                Just(format!("\"{}\"", "n".repeat(crate::mcp::MAX_NAME))),
                Just(format!("\"{}\"", "n".repeat(crate::mcp::MAX_NAME + 1))),
                Just(r#""t\u00e9""#.to_owned()),
                Just("7".to_owned()),
            ],
            prop_oneof![
                Just(None),
                Just(Some("null".to_owned())),
                Just(Some(
                    r#"{"type":"object","properties":{"name":{"type":"string"}}}"#.to_owned()
                )),
            ],
            junk(),
        )
            .prop_map(|(name, schema, other)| match schema {
                Some(s) => format!(r#"{{"inputSchema":{other},"outputSchema":{s},"name":{name}}}"#),
                None => format!(r#"{{"name":{name},"description":{other}}}"#),
            });
        prop_oneof![
            Just("null".to_owned()),
            Just("[1,{\"isError\":true}]".to_owned()),
            junk(),
            (
                prop::collection::vec(string_literal(), 0..3),
                prop_oneof![Just("true"), Just("false"), Just("null"), Just("\"true\"")],
                junk(),
                any::<bool>(),
            )
                .prop_map(|(texts, is_error, other, error_first)| {
                    let blocks: Vec<String> = texts
                        .iter()
                        .map(|t| format!(r#"{{"type":"text","text":{t},"annotations":{other}}}"#))
                        .collect();
                    let content = format!(r#""content":[{}]"#, blocks.join(","));
                    let flag = format!(r#""isError":{is_error}"#);
                    let (a, b) = if error_first {
                        (flag, content)
                    } else {
                        (content, flag)
                    };
                    format!(r#"{{{a},"structuredContent":{other},{b}}}"#)
                }),
            prop::collection::vec(tool, 0..4)
                .prop_map(|t| format!(r#"{{"tools":[{}],"nextCursor":"c"}}"#, t.join(","))),
        ]
    }

    fn error_json() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("null".to_owned()),
            prop_oneof![
                Just("-32602"),
                Just("-32001"),
                Just("-32603"),
                Just("5"),
                Just("1.5"),
                Just("\"x\""),
                Just("99999999999999999999"),
            ]
            .prop_map(|c| format!(r#"{{"message":"m","code":{c},"data":{{"code":1}}}}"#)),
        ]
    }

    /// One message: its members in any order, with room between tokens; and how its id was
    /// written.
    fn message() -> impl Strategy<Value = (String, String)> {
        (
            id_json(),
            prop::option::of(result_json()),
            prop::option::of(error_json()),
            junk(),
            any::<u64>(),
            prop_oneof![Just(""), Just(" "), Just("\n  ")],
        )
            .prop_map(|(id, result, error, other, order, space)| {
                let mut members = vec![
                    format!(r#""jsonrpc":"2.0""#),
                    format!(r#""id"{space}:{space}{id}"#),
                    format!(r#""extra":{{"id":"not this","result":{other}}}"#),
                ];
                members.extend(result.map(|r| format!(r#""result":{r}"#)));
                members.extend(error.map(|e| format!(r#""error":{space}{e}"#)));
                let n = members.len();
                for i in (1..n).rev() {
                    members.swap(i, (order >> (i * 3)) as usize % (i + 1));
                }
                (
                    format!("{{{space}{}{space}}}", members.join(&format!(",{space}"))),
                    id,
                )
            })
    }

    fn cut<'a>(bytes: &'a [u8], at: &[prop::sample::Index]) -> Vec<&'a [u8]> {
        let mut at: Vec<usize> = at.iter().map(|i| i.index(bytes.len() + 1)).collect();
        at.sort_unstable();
        let mut chunks = Vec::new();
        let mut from = 0;
        for to in at {
            chunks.push(&bytes[from..to]);
            from = to;
        }
        chunks.push(&bytes[from..]);
        chunks
    }

    proptest! {
        /// However the answer is cut into chunks, the streaming reader reads what serde_json
        /// reads of each message: one message or a batch as JSON, one message an event as
        /// SSE (data split over lines too).
        #[test]
        fn the_streaming_reader_reads_what_serde_reads(
            messages in prop::collection::vec(message(), 0..5),
            keep in prop_oneof![Just(0usize), Just(200), Just(usize::MAX)],
            batch in any::<bool>(),
            crlf in any::<bool>(),
            cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..16),
        ) {
            let mut expected = Read::default();
            for (text, id) in &messages {
                reference(text, id, keep, &mut expected);
            }
            let eol = if crlf { "\r\n" } else { "\n" };
            let sse: String = messages
                .iter()
                .map(|(m, _)| {
                    let data: String =
                        m.split('\n').map(|line| format!("data: {line}{eol}")).collect();
                    format!(": keep-alive{eol}event: message{eol}id: 7{eol}{data}{eol}")
                })
                .collect();
            let texts: Vec<&str> = messages.iter().map(|(m, _)| m.as_str()).collect();
            let json = if batch || texts.len() != 1 {
                format!("[{}]", texts.join(" ,"))
            } else {
                texts[0].to_owned()
            };
            for (framing, body) in [(Framing::Sse, sse), (Framing::Json, json)] {
                let got = read(framing, &cut(body.as_bytes(), &cuts), keep);
                prop_assert_eq!(&got, &expected, "{:?} {}", framing, body);
            }
        }
    }

    #[test]
    fn a_long_id_is_known_by_its_length_and_hash() {
        let long = format!("\"{}\"", "x".repeat(json::ID_MAX + 40));
        let other = format!("\"{}y\"", "x".repeat(json::ID_MAX + 39));
        let body = format!(r#"{{"id":{long},"result":{{}}}}"#);
        let mut matched = (false, false);
        for split in [1, 10, json::ID_MAX, json::ID_MAX + 7, body.len() - 3] {
            let (a, b) = body.as_bytes().split_at(split);
            struct Ids<'a>(&'a str, &'a str, &'a mut (bool, bool));
            impl Listener for Ids<'_> {
                fn message(&mut self, m: &Message<'_>) {
                    *self.2 = (m.answers(self.0), m.answers(self.1));
                }
            }
            let mut ids = Ids(&long, &other, &mut matched);
            let mut scan = Scan::new(Framing::Json);
            scan.feed(a, &mut ids);
            scan.feed(b, &mut ids);
            assert_eq!(matched, (true, false), "split at {split}");
        }
    }

    /// A listener that counts what it is told and keeps nothing.
    #[derive(Default)]
    struct Count {
        messages: usize,
        lens: usize,
        ok: usize,
    }

    impl Listener for Count {
        fn message(&mut self, m: &Message<'_>) {
            self.messages += 1;
            self.lens += m.len;
            self.ok += usize::from(m.result && m.answers("1"));
        }
    }

    /// A 64 MiB answer (JSON, an SSE event, an SSE line that never ends) is read in a scan of
    /// fixed size that holds no bytes, and the message at its end is still read.
    #[test]
    fn a_huge_answer_costs_a_scan_nothing() {
        const SIZE: usize = 64 << 20;
        let filler = vec![b'a'; 1 << 20];
        assert!(
            std::mem::size_of::<Scan>() < 1024,
            "{}",
            std::mem::size_of::<Scan>()
        );
        for (framing, head, tail) in [
            (
                Framing::Json,
                &br#"{"result":{"content":[{"type":"text","text":""#[..],
                &br#""}]},"id":1}"#[..],
            ),
            (
                Framing::Sse,
                b"data: {\"result\":{\"content\":[{\"text\":\"",
                b"\"}]},\"id\":1}\n\n",
            ),
            (
                Framing::Sse,
                b"data: {\"result\":{\"content\":[{\"text\":\"",
                b"",
            ),
        ] {
            let mut count = Count::default();
            let mut scan = Scan::new(framing);
            scan.feed(head, &mut count);
            for _ in 0..SIZE / filler.len() {
                scan.feed(&filler, &mut count);
            }
            scan.feed(tail, &mut count);
            assert_eq!(scan.json.kept_capacity(), 0, "nothing kept");
            scan.finish(&mut count);
            if tail.is_empty() {
                assert_eq!(count.messages, 0, "an event that never ends has no message");
            } else {
                assert_eq!((count.messages, count.ok), (1, 1), "{framing:?}");
                let data_len = head.len() - framing_prefix(framing) + SIZE + tail.len()
                    - if framing == Framing::Sse { 2 } else { 0 };
                assert_eq!(count.lens, data_len);
            }
        }
    }

    fn framing_prefix(framing: Framing) -> usize {
        match framing {
            Framing::Json => 0,
            Framing::Sse => "data: ".len(),
        }
    }

    #[test]
    fn a_listener_keeps_a_message_only_up_to_what_it_asked() {
        let small = r#"{"id":1,"result":{"content":[]}}"#;
        let big = format!(
            r#"{{"id":2,"result":{{"content":[{{"text":"{}"}}]}}}}"#,
            "b".repeat(500)
        );
        let body = format!("[{small},{big}]");
        let got = read(Framing::Json, &[body.as_bytes()], 100);
        assert_eq!(got.messages[0].raw.as_deref(), Some(small.as_bytes()));
        assert_eq!(got.messages[1].raw, None, "too long: read, not kept");
        assert!(got.messages[1].result);
    }

    #[test]
    fn a_structure_it_cannot_follow_stops_the_reading_until_the_next_event() {
        let seen = scan(Framing::Json, &[br#"{"id":1,"result":{]}"#]);
        assert_eq!(seen.messages, []);
        let body = "data: {\"id\":1,\"result\":}}\n\ndata: {\"id\":2,\"result\":{}}\n\n";
        let seen = scan(Framing::Sse, &[body.as_bytes()]);
        assert_eq!(
            seen.messages.len(),
            2,
            "the first is malformed but closes; the second reads"
        );
        let seen = scan(
            Framing::Sse,
            &[b"data: }{\"id\":1,\"result\":{}}\n\ndata: {\"id\":2,\"result\":{}}\n\n"],
        );
        let two = r#"{"id":2,"result":{}}"#;
        assert_eq!(seen.messages, [(Some("2".into()), "result", two.len())]);
    }
}
