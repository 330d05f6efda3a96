//! Borrowed parsing of a JSON-RPC body: a single message or a batch array.

use std::borrow::Cow;
use std::ops::Range;

use serde::de::{IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;

use crate::call::{CallKind, Unclassified};

/// One message of a body, borrowed from it.
#[derive(Debug)]
pub(crate) struct Message<'a> {
    pub(crate) kind: CallKind,
    pub(crate) id: Option<&'a RawValue>,
    pub(crate) method: Option<Cow<'a, str>>,
    /// `params.name` (tools/call, prompts/get).
    pub(crate) name: Option<Cow<'a, str>>,
    /// `params.uri` (resources/read).
    pub(crate) uri: Option<Cow<'a, str>>,
    pub(crate) meta: Option<&'a RawValue>,
    /// `params.arguments` (tools/call), borrowed from the body.
    pub(crate) arguments: Option<&'a RawValue>,
    pub(crate) span: Range<usize>,
}

/// A parsed body.
#[derive(Debug)]
pub(crate) struct Parsed<'a> {
    messages: Messages<'a>,
    pub(crate) batch: bool,
}

/// A body's messages: one held inline (no allocation for the common single message), or a
/// batch's.
#[derive(Debug)]
enum Messages<'a> {
    One(Message<'a>),
    Batch(Vec<Message<'a>>),
}

impl<'a> Parsed<'a> {
    /// The messages, in body order.
    #[cfg(test)]
    pub(crate) fn messages(&self) -> &[Message<'a>] {
        match &self.messages {
            Messages::One(m) => std::slice::from_ref(m),
            Messages::Batch(all) => all,
        }
    }

    /// The messages, in body order, owned: an iterator of exact length, so collecting it
    /// into a shared slice allocates once.
    pub(crate) fn into_messages(
        self,
    ) -> std::iter::Chain<std::option::IntoIter<Message<'a>>, std::vec::IntoIter<Message<'a>>> {
        match self.messages {
            Messages::One(m) => Some(m).into_iter().chain(Vec::new()),
            Messages::Batch(all) => None.into_iter().chain(all),
        }
    }
}

/// One JSON-RPC message's fields, read in one pass. Read as the servers that run it read it
/// (JSON.parse, Python's `json`, serde_json's `Value`): a key sent twice keeps its last value,
/// keys are compared unescaped, and a field of an unexpected type is absent rather than an
/// error. So no spelling of a call a server would run is unclassified here.
#[derive(Default)]
struct Wire<'a> {
    jsonrpc: Option<Cow<'a, str>>,
    /// `Some` for any present value, `null` included.
    id: Option<&'a RawValue>,
    method: Option<Cow<'a, str>>,
    params: Params<'a>,
    result: Option<&'a RawValue>,
    error: Option<&'a RawValue>,
}

/// The fields of `params` read (when it is an object; otherwise none), last value winning.
#[derive(Default)]
struct Params<'a> {
    name: Option<Cow<'a, str>>,
    uri: Option<Cow<'a, str>>,
    meta: Option<&'a RawValue>,
    arguments: Option<&'a RawValue>,
}

/// A JSON string's text, borrowed when it has no escapes; `None` for any other value.
fn text(raw: &RawValue) -> Option<Cow<'_, str>> {
    let json = raw.get();
    let inner = json.strip_prefix('"')?.strip_suffix('"')?;
    if inner.contains('\\') {
        serde_json::from_str::<String>(json).ok().map(Cow::Owned)
    } else {
        Some(Cow::Borrowed(inner))
    }
}

/// A key of a message or of its `params`, as one of the fields read: compared unescaped,
/// without keeping it.
enum Field {
    Jsonrpc,
    Id,
    Method,
    Params,
    Result,
    Error,
    Name,
    Uri,
    Meta,
    Arguments,
    Other,
}

impl<'de> Deserialize<'de> for Field {
    fn deserialize<D: Deserializer<'de>>(de: D) -> Result<Self, D::Error> {
        struct Key;
        impl Visitor<'_> for Key {
            type Value = Field;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a key")
            }
            fn visit_str<E>(self, key: &str) -> Result<Field, E> {
                Ok(match key {
                    "jsonrpc" => Field::Jsonrpc,
                    "id" => Field::Id,
                    "method" => Field::Method,
                    "params" => Field::Params,
                    "result" => Field::Result,
                    "error" => Field::Error,
                    "name" => Field::Name,
                    "uri" => Field::Uri,
                    "_meta" => Field::Meta,
                    "arguments" => Field::Arguments,
                    _ => Field::Other,
                })
            }
        }
        de.deserialize_identifier(Key)
    }
}

impl<'de> Deserialize<'de> for Wire<'de> {
    fn deserialize<D: Deserializer<'de>>(de: D) -> Result<Self, D::Error> {
        struct Fields;
        impl<'de> Visitor<'de> for Fields {
            type Value = Wire<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON-RPC message")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Wire<'de>, A::Error> {
                let mut wire = Wire::default();
                while let Some(key) = map.next_key::<Field>()? {
                    match key {
                        Field::Jsonrpc => wire.jsonrpc = text(map.next_value()?),
                        Field::Id => wire.id = Some(map.next_value()?),
                        Field::Method => wire.method = text(map.next_value()?),
                        Field::Params => wire.params = map.next_value()?,
                        Field::Result => wire.result = Some(map.next_value()?),
                        Field::Error => wire.error = Some(map.next_value()?),
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(wire)
            }
        }
        de.deserialize_map(Fields)
    }
}

impl<'de> Deserialize<'de> for Params<'de> {
    fn deserialize<D: Deserializer<'de>>(de: D) -> Result<Self, D::Error> {
        struct Fields;
        impl<'de> Visitor<'de> for Fields {
            type Value = Params<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Params<'de>, A::Error> {
                let mut params = Params::default();
                while let Some(key) = map.next_key::<Field>()? {
                    match key {
                        Field::Name => params.name = text(map.next_value()?),
                        Field::Uri => params.uri = text(map.next_value()?),
                        Field::Meta => params.meta = Some(map.next_value()?),
                        Field::Arguments => params.arguments = Some(map.next_value()?),
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(params)
            }
            // Not an object: no fields.
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Params<'de>, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Params::default())
            }
            fn visit_bool<E>(self, _: bool) -> Result<Params<'de>, E> {
                Ok(Params::default())
            }
            fn visit_i64<E>(self, _: i64) -> Result<Params<'de>, E> {
                Ok(Params::default())
            }
            fn visit_u64<E>(self, _: u64) -> Result<Params<'de>, E> {
                Ok(Params::default())
            }
            fn visit_f64<E>(self, _: f64) -> Result<Params<'de>, E> {
                Ok(Params::default())
            }
            fn visit_str<E>(self, _: &str) -> Result<Params<'de>, E> {
                Ok(Params::default())
            }
            fn visit_unit<E>(self) -> Result<Params<'de>, E> {
                Ok(Params::default())
            }
        }
        de.deserialize_any(Fields)
    }
}

fn first_byte(raw: &str) -> Option<u8> {
    raw.bytes().find(|b| !b.is_ascii_whitespace())
}

/// Parses a body. `Err` means it is not JSON-RPC and must be forwarded untouched.
pub(crate) fn parse(body: &[u8]) -> Result<Parsed<'_>, Unclassified> {
    // Checked as UTF-8 once, whole: read as text, serde does not check each string again.
    let text = std::str::from_utf8(body).map_err(|_| Unclassified::NotJson)?;
    match first_byte(text) {
        Some(b'{') => {
            let wire: Wire<'_> = serde_json::from_str(text).map_err(|e| classify_err(&e))?;
            let message = message(wire, 0..body.len()).ok_or(Unclassified::NotJsonRpc)?;
            Ok(Parsed {
                messages: Messages::One(message),
                batch: false,
            })
        }
        Some(b'[') => {
            let items: Vec<&RawValue> = serde_json::from_str(text).map_err(|e| classify_err(&e))?;
            if items.is_empty() {
                return Err(Unclassified::NotJsonRpc);
            }
            let base = body.as_ptr() as usize;
            let messages = items
                .into_iter()
                .map(|raw| {
                    let start = raw.get().as_ptr() as usize - base;
                    let span = start..start + raw.get().len();
                    serde_json::from_str::<Wire<'_>>(raw.get())
                        .ok()
                        .and_then(|w| message(w, span.clone()))
                        .unwrap_or_else(|| invalid(span))
                })
                .collect();
            Ok(Parsed {
                messages: Messages::Batch(messages),
                batch: true,
            })
        }
        _ => {
            // Valid JSON of another shape is JSON but not JSON-RPC.
            serde_json::from_str::<serde::de::IgnoredAny>(text)
                .map_err(|_| Unclassified::NotJson)?;
            Err(Unclassified::NotJsonRpc)
        }
    }
}

fn classify_err(e: &serde_json::Error) -> Unclassified {
    if e.is_data() {
        Unclassified::NotJsonRpc
    } else {
        Unclassified::NotJson
    }
}

fn invalid(span: Range<usize>) -> Message<'static> {
    Message {
        kind: CallKind::Invalid,
        id: None,
        method: None,
        name: None,
        uri: None,
        meta: None,
        arguments: None,
        span,
    }
}

fn message(wire: Wire<'_>, span: Range<usize>) -> Option<Message<'_>> {
    if wire.jsonrpc.as_deref() != Some("2.0") {
        return None;
    }
    let kind = match (&wire.method, &wire.id) {
        (Some(_), Some(_)) => CallKind::Request,
        (Some(_), None) => CallKind::Notification,
        (None, Some(_)) if wire.result.is_some() || wire.error.is_some() => CallKind::Response,
        _ => return None,
    };
    let params = wire.params;
    Some(Message {
        kind,
        id: wire.id,
        method: wire.method,
        name: params.name,
        uri: params.uri,
        meta: params.meta,
        arguments: params.arguments,
        span,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::Value;

    /// A JSON value as text, from a small vocabulary (strings with and without escapes).
    fn scalar() -> impl Strategy<Value = String> {
        prop_oneof![
            Just(r#""2.0""#.to_owned()),
            Just(r#""tools/call""#.to_owned()),
            Just(r#""tools\/call""#.to_owned()),
            Just(r#""ping""#.to_owned()),
            Just(r#""sql_scan""#.to_owned()),
            Just(r#""s\u0071l""#.to_owned()),
            Just("7".to_owned()),
            Just("null".to_owned()),
            Just("true".to_owned()),
            Just("[1,{\"a\":2}]".to_owned()),
            Just("{\"code\":-1}".to_owned()),
        ]
    }

    /// An object as text whose keys (spelled plainly or with an escape) may repeat.
    fn object(
        keys: &'static [&'static str],
        value: BoxedStrategy<String>,
    ) -> BoxedStrategy<String> {
        proptest::collection::vec((proptest::sample::select(keys), value), 0..7)
            .prop_map(|pairs| {
                let fields: Vec<String> =
                    pairs.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
                format!("{{{}}}", fields.join(","))
            })
            .boxed()
    }

    fn message_text() -> BoxedStrategy<String> {
        const PARAMS: &[&str] = &["name", "uri", "_meta", "arguments", "n\\u0061me", "x"];
        const TOP: &[&str] = &[
            "jsonrpc",
            "jsonrpc",
            "id",
            "method",
            "method",
            "m\\u0065thod",
            "params",
            "params",
            "result",
            "error",
            "x",
        ];
        let params = object(PARAMS, scalar().boxed());
        let value = prop_oneof![3 => scalar(), 2 => params].boxed();
        object(TOP, value)
    }

    /// What a message is read as: its kind, id, method and `params.name`.
    type Read = (CallKind, Option<Value>, Option<String>, Option<String>);

    /// The reference: the body as a `Value` (last value wins), its fields read from that.
    fn reference(body: &str) -> Option<Read> {
        let v: Value = serde_json::from_str(body).unwrap();
        if v.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
            return None;
        }
        let method = v.get("method").and_then(Value::as_str).map(str::to_owned);
        let id = v.get("id").cloned();
        let kind = match (&method, &id) {
            (Some(_), Some(_)) => CallKind::Request,
            (Some(_), None) => CallKind::Notification,
            (None, Some(_)) if v.get("result").is_some() || v.get("error").is_some() => {
                CallKind::Response
            }
            _ => return None,
        };
        let name = v
            .get("params")
            .and_then(|p| p.get("name"))
            .and_then(Value::as_str)
            .map(str::to_owned);
        Some((kind, id, method, name))
    }

    proptest! {
        /// Whatever keys repeat, however they are spelled and whatever their types, a message
        /// is read as a last-value-wins `Value` reads it.
        #[test]
        fn a_message_is_read_as_a_value_reads_it(body in message_text()) {
            let got = parse(body.as_bytes()).ok().map(|p| {
                let m = &p.messages()[0];
                (
                    m.kind,
                    m.id.map(|i| serde_json::from_str::<Value>(i.get()).unwrap()),
                    m.method.as_deref().map(str::to_owned),
                    m.name.as_deref().map(str::to_owned),
                )
            });
            prop_assert_eq!(got, reference(&body), "{}", body);
        }
    }

    #[test]
    fn a_key_sent_twice_keeps_its_last_value() {
        let body = br#"{"jsonrpc":"2.0","id":1,"id":2,"method":"ping","method":"tools/call","params":{"name":"a","name":5,"name":"sql_scan"}}"#;
        let p = parse(body).unwrap();
        let m = &p.messages()[0];
        assert_eq!(m.id.unwrap().get(), "2");
        assert_eq!(m.method.as_deref(), Some("tools/call"));
        assert_eq!(m.name.as_deref(), Some("sql_scan"));
        let body = br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a","arguments":{}},"params":[1]}"#;
        let p = parse(body).unwrap();
        let m = &p.messages()[0];
        assert_eq!(m.name, None, "the last params is not an object");
        assert!(m.arguments.is_none());
    }

    #[test]
    fn single_request() {
        let body = br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"sql_scan","arguments":{"q":"x"}}}"#;
        let p = parse(body).unwrap();
        assert!(!p.batch);
        let m = &p.messages()[0];
        assert_eq!(m.kind, CallKind::Request);
        assert_eq!(m.id.unwrap().get(), "7");
        assert_eq!(m.name.as_deref(), Some("sql_scan"));
        assert_eq!(m.span, 0..body.len());
    }

    #[test]
    fn escaped_names_are_decoded() {
        let body =
            br#"{"jsonrpc":"2.0","id":"a","method":"tools\/call","params":{"name":"s\u0071l"}}"#;
        let p = parse(body).unwrap();
        assert_eq!(p.messages()[0].method.as_deref(), Some("tools/call"));
        assert_eq!(p.messages()[0].name.as_deref(), Some("sql"));
    }

    #[test]
    fn batch_spans_point_at_the_elements() {
        let body = br#"[ {"jsonrpc":"2.0","id":1,"method":"ping"} ,{"jsonrpc":"2.0","method":"notifications/initialized"}, 5 ]"#;
        let p = parse(body).unwrap();
        assert!(p.batch);
        let kinds: Vec<_> = p.messages().iter().map(|m| m.kind).collect();
        assert_eq!(
            kinds,
            [CallKind::Request, CallKind::Notification, CallKind::Invalid]
        );
        assert_eq!(
            &body[p.messages()[0].span.clone()],
            br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#
        );
        assert_eq!(&body[p.messages()[2].span.clone()], b"5");
    }

    #[test]
    fn not_json_rpc() {
        assert_eq!(parse(b"hello").unwrap_err(), Unclassified::NotJson);
        assert_eq!(parse(b"{").unwrap_err(), Unclassified::NotJson);
        assert_eq!(parse(b"").unwrap_err(), Unclassified::NotJson);
        assert_eq!(parse(&[0xff, 0xfe]).unwrap_err(), Unclassified::NotJson);
        assert_eq!(parse(b"[]").unwrap_err(), Unclassified::NotJsonRpc);
        assert_eq!(parse(b"42").unwrap_err(), Unclassified::NotJsonRpc);
        assert_eq!(parse(br#"{"a":1}"#).unwrap_err(), Unclassified::NotJsonRpc);
        assert_eq!(
            parse(br#"{"jsonrpc":"1.0","id":1,"method":"x"}"#).unwrap_err(),
            Unclassified::NotJsonRpc
        );
        assert_eq!(
            parse(br#"{"jsonrpc":"2.0","id":1,"method":5}"#).unwrap_err(),
            Unclassified::NotJsonRpc
        );
    }
}
