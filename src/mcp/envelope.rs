//! A JSON-RPC body read in one pass: a single message or a batch array, each message's
//! fields borrowed from the body, and a call's arguments' canonical key computed as they are
//! read ([`crate::canonical`]).

use std::borrow::Cow;
use std::ops::Range;

use crate::call::{CallKind, Unclassified};
use crate::canonical;
use crate::scan::{Bad, Scanner, Str};

/// One message of a body, borrowed from it.
#[derive(Debug)]
pub(crate) struct Message<'a> {
    pub(crate) kind: CallKind,
    /// The id's JSON text.
    pub(crate) id: Option<&'a str>,
    pub(crate) method: Option<Cow<'a, str>>,
    /// `params.name` (tools/call, prompts/get).
    pub(crate) name: Option<Cow<'a, str>>,
    /// `params.uri` (resources/read).
    pub(crate) uri: Option<Cow<'a, str>>,
    /// `params._meta`'s JSON text.
    pub(crate) meta: Option<&'a str>,
    /// `params.arguments` (tools/call), borrowed from the body.
    pub(crate) arguments: Option<Arguments<'a>>,
    pub(crate) span: Range<usize>,
}

/// A message's `params.arguments`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Arguments<'a> {
    /// The JSON text, as sent.
    pub(crate) text: &'a str,
    /// Their canonical key ([`canonical::arguments`]), when the body was read keyed.
    pub(crate) key: Option<u64>,
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
    id: Option<&'a str>,
    method: Option<Cow<'a, str>>,
    params: Params<'a>,
    result: bool,
    error: bool,
}

/// The fields of `params` read (when it is an object; otherwise none), last value winning.
#[derive(Default)]
struct Params<'a> {
    name: Option<Cow<'a, str>>,
    uri: Option<Cow<'a, str>>,
    meta: Option<&'a str>,
    arguments: Option<Arguments<'a>>,
}

/// Why a message could not be read.
enum Stop {
    /// The text is not JSON.
    Bad,
    /// JSON, but not a message's text: a key or a `params` string naming an unpaired
    /// surrogate, or a `params` number out of `f64`'s range (serde_json refuses them where it
    /// reads them, and so the message).
    Refused,
}

impl From<Bad> for Stop {
    fn from(Bad: Bad) -> Self {
        Stop::Bad
    }
}

/// A key of a message or of its `params`, as one of the fields read: compared unescaped.
#[derive(Clone, Copy)]
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

impl Field {
    fn of(key: Str<'_>) -> Result<Field, Stop> {
        if !key.escaped() {
            return Ok(Field::named(key.raw()));
        }
        // Decoded into a few bytes: a longer key is none of the fields (but is checked whole).
        let mut buf = [0u8; 10];
        let mut len = 0;
        key.decode(|piece| {
            if let Some(dst) = buf.get_mut(len..len + piece.len()) {
                dst.copy_from_slice(piece.as_bytes());
            }
            len += piece.len();
        })
        .map_err(|_| Stop::Refused)?;
        Ok(buf
            .get(..len)
            .and_then(|k| std::str::from_utf8(k).ok())
            .map_or(Field::Other, Field::named))
    }

    fn named(key: &str) -> Field {
        match key {
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
        }
    }
}

/// A value's text, when it is a JSON string with one; else (another value, or a string of an
/// unpaired surrogate) `None`. The value is read whole either way.
fn text<'a>(scan: &mut Scanner<'a>) -> Result<Option<Cow<'a, str>>, Bad> {
    if scan.peek() == Some(b'"') {
        Ok(scan.string()?.text().ok())
    } else {
        scan.skip()?;
        Ok(None)
    }
}

/// Reads a message (an object, next in `scan`). `keyed`: its arguments' canonical key is
/// computed.
fn wire<'a>(scan: &mut Scanner<'a>, keyed: bool) -> Result<Wire<'a>, Stop> {
    let mut wire = Wire::default();
    scan.object(|scan, key| -> Result<(), Stop> {
        match Field::of(key)? {
            Field::Jsonrpc => wire.jsonrpc = text(scan)?,
            Field::Id => wire.id = Some(scan.value()?),
            Field::Method => wire.method = text(scan)?,
            Field::Params => wire.params = params(scan, keyed)?,
            Field::Result => wire.result = scan.skip().map(|_| true)?,
            Field::Error => wire.error = scan.skip().map(|_| true)?,
            _ => {
                scan.skip()?;
            }
        }
        Ok(())
    })?;
    Ok(wire)
}

/// Reads `params`: its fields when it is an object, none when it is any other value.
fn params<'a>(scan: &mut Scanner<'a>, keyed: bool) -> Result<Params<'a>, Stop> {
    let mut params = Params::default();
    match scan.peek() {
        Some(b'{') => scan.object(|scan, key| -> Result<(), Stop> {
            match Field::of(key)? {
                Field::Name => params.name = text(scan)?,
                Field::Uri => params.uri = text(scan)?,
                Field::Meta => params.meta = Some(scan.value()?),
                Field::Arguments => {
                    params.arguments = Some(if keyed {
                        let (span, key) = canonical::arguments(scan)?;
                        Arguments {
                            text: scan.slice(span),
                            key: Some(key),
                        }
                    } else {
                        Arguments {
                            text: scan.value()?,
                            key: None,
                        }
                    });
                }
                _ => {
                    scan.skip()?;
                }
            }
            Ok(())
        })?,
        // serde_json reads a scalar `params` as what it is: its text, its number.
        Some(b'"') => {
            scan.string()?.text().map_err(|_| Stop::Refused)?;
        }
        Some(b'-' | b'0'..=b'9') => {
            let n = scan.number()?;
            serde_json::from_str::<serde_json::Number>(n).map_err(|_| Stop::Refused)?;
        }
        _ => {
            scan.skip()?;
        }
    }
    Ok(params)
}

/// Parses a body. `Err` means it is not JSON-RPC and must be forwarded untouched. `keyed`:
/// each message's arguments' canonical key is computed as they are read.
pub(crate) fn parse(body: &[u8], keyed: bool) -> Result<Parsed<'_>, Unclassified> {
    // Checked as UTF-8 once, whole: read as text, no string is checked again.
    let text = std::str::from_utf8(body).map_err(|_| Unclassified::NotJson)?;
    let mut scan = Scanner::new(text);
    match scan.peek() {
        Some(b'{') => {
            let wire = wire(&mut scan, keyed).map_err(|_| Unclassified::NotJson)?;
            scan.end().map_err(|Bad| Unclassified::NotJson)?;
            let message = message(wire, 0..body.len()).ok_or(Unclassified::NotJsonRpc)?;
            Ok(Parsed {
                messages: Messages::One(message),
                batch: false,
            })
        }
        Some(b'[') => {
            let mut messages = Vec::new();
            scan.array(|scan| {
                let first = scan.peek();
                let start = scan.pos();
                let read = match first {
                    Some(b'{') => match wire(scan, keyed) {
                        Ok(wire) => Some(wire),
                        Err(Stop::Bad) => return Err(Bad),
                        // Valid JSON but no message: read again as a value.
                        Err(Stop::Refused) => {
                            scan.seek(start);
                            scan.skip()?;
                            None
                        }
                    },
                    _ => {
                        scan.skip()?;
                        None
                    }
                };
                let span = start..scan.pos();
                messages.push(
                    read.and_then(|w| message(w, span.clone()))
                        .unwrap_or_else(|| invalid(span)),
                );
                Ok(())
            })
            .and_then(|()| scan.end())
            .map_err(|Bad| Unclassified::NotJson)?;
            if messages.is_empty() {
                return Err(Unclassified::NotJsonRpc);
            }
            Ok(Parsed {
                messages: Messages::Batch(messages),
                batch: true,
            })
        }
        _ => {
            // Valid JSON of another shape is JSON but not JSON-RPC.
            scan.skip()
                .and_then(|_| scan.end())
                .map_err(|Bad| Unclassified::NotJson)?;
            Err(Unclassified::NotJsonRpc)
        }
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
        (None, Some(_)) if wire.result || wire.error => CallKind::Response,
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

    /// A body read keyed.
    fn parse(body: &[u8]) -> Result<Parsed<'_>, Unclassified> {
        super::parse(body, true)
    }

    /// What the scanner reads of a body, as [`serde_reader`] gives it.
    fn read(body: &[u8]) -> Result<Vec<serde_reader::Read>, Unclassified> {
        let parsed = parse(body)?;
        Ok(parsed
            .messages()
            .iter()
            .map(|m| {
                (
                    m.kind,
                    m.id.map(str::to_owned),
                    m.method.as_deref().map(str::to_owned),
                    m.name.as_deref().map(str::to_owned),
                    m.uri.as_deref().map(str::to_owned),
                    m.meta.map(str::to_owned),
                    m.arguments.map(|a| a.text.to_owned()),
                    m.span.clone(),
                )
            })
            .collect())
    }

    /// A message's text, a batch of them, or either with a few bytes inserted, removed or
    /// replaced.
    fn near_body() -> impl Strategy<Value = String> {
        let one = message_text();
        let batch =
            proptest::collection::vec(prop_oneof![3 => message_text(), 1 => scalar()], 0..4)
                .prop_map(|items| format!(" [ {} ]", items.join(" ,")));
        // Past the scanner's own pieces: a number out of f64's range, a string and a key of
        // an unpaired surrogate (valid JSON that serde_json refuses where it reads it).
        crate::scan::tests::near(
            prop_oneof![3 => one, 1 => batch],
            &["1e400", "\"\\ud800\"", "\"\\ud800\":1,"],
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2048))]
        /// Whatever the body, valid or a few bytes off, it is read as the serde_json reader
        /// this scanner replaced reads it: the same answer (not JSON, not JSON-RPC, or the
        /// same messages with the same fields and spans), and each arguments' key is theirs.
        #[test]
        fn a_body_is_read_as_serde_json_read_it(body in near_body()) {
            prop_assert_eq!(read(body.as_bytes()), serde_reader::parse(body.as_bytes()), "{}", body);
            if let Ok(parsed) = parse(body.as_bytes()) {
                for m in parsed.messages() {
                    if let Some(a) = m.arguments {
                        prop_assert_eq!(a.key, Some(crate::canonical::digest(a.text.as_bytes())));
                    }
                }
            }
        }
    }

    /// The reference: the serde_json reader this scanner replaced (a `Deserialize` of the
    /// fields, borrowed `RawValue`s), its answer as (kind, id, method, name, uri, meta,
    /// arguments, span) per message.
    mod serde_reader {
        use std::borrow::Cow;
        use std::ops::Range;

        use serde::de::{IgnoredAny, MapAccess, SeqAccess, Visitor};
        use serde::{Deserialize, Deserializer};
        use serde_json::value::RawValue;

        use crate::call::{CallKind, Unclassified};

        pub(super) type Read = (
            CallKind,
            Option<String>,
            Option<String>,
            Option<String>,
            Option<String>,
            Option<String>,
            Option<String>,
            Range<usize>,
        );

        #[derive(Debug)]
        struct Message<'a> {
            kind: CallKind,
            id: Option<&'a RawValue>,
            method: Option<Cow<'a, str>>,
            name: Option<Cow<'a, str>>,
            uri: Option<Cow<'a, str>>,
            meta: Option<&'a RawValue>,
            arguments: Option<&'a RawValue>,
            span: Range<usize>,
        }

        fn read(m: Message<'_>) -> Read {
            let s = |r: Option<&RawValue>| r.map(|r| r.get().to_owned());
            (
                m.kind,
                s(m.id),
                m.method.map(Cow::into_owned),
                m.name.map(Cow::into_owned),
                m.uri.map(Cow::into_owned),
                s(m.meta),
                s(m.arguments),
                m.span,
            )
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

        pub(super) fn parse(body: &[u8]) -> Result<Vec<Read>, Unclassified> {
            let text = std::str::from_utf8(body).map_err(|_| Unclassified::NotJson)?;
            match text.bytes().find(|b| !b.is_ascii_whitespace()) {
                Some(b'{') => {
                    let wire: Wire<'_> =
                        serde_json::from_str(text).map_err(|e| classify_err(&e))?;
                    let message = message(wire, 0..body.len()).ok_or(Unclassified::NotJsonRpc)?;
                    Ok(vec![read(message)])
                }
                Some(b'[') => {
                    let items: Vec<&RawValue> =
                        serde_json::from_str(text).map_err(|e| classify_err(&e))?;
                    if items.is_empty() {
                        return Err(Unclassified::NotJsonRpc);
                    }
                    let base = body.as_ptr() as usize;
                    Ok(items
                        .into_iter()
                        .map(|raw| {
                            let start = raw.get().as_ptr() as usize - base;
                            let span = start..start + raw.get().len();
                            read(
                                serde_json::from_str::<Wire<'_>>(raw.get())
                                    .ok()
                                    .and_then(|w| message(w, span.clone()))
                                    .unwrap_or_else(|| invalid(span)),
                            )
                        })
                        .collect())
                }
                _ => {
                    serde_json::from_str::<IgnoredAny>(text).map_err(|_| Unclassified::NotJson)?;
                    Err(Unclassified::NotJsonRpc)
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
                    fn visit_map<A: MapAccess<'de>>(
                        self,
                        mut map: A,
                    ) -> Result<Wire<'de>, A::Error> {
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
                    fn visit_map<A: MapAccess<'de>>(
                        self,
                        mut map: A,
                    ) -> Result<Params<'de>, A::Error> {
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
                    fn visit_seq<A: SeqAccess<'de>>(
                        self,
                        mut seq: A,
                    ) -> Result<Params<'de>, A::Error> {
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

        fn classify_err(e: &serde_json::Error) -> Unclassified {
            if e.is_data() {
                Unclassified::NotJsonRpc
            } else {
                Unclassified::NotJson
            }
        }

        fn message(wire: Wire<'_>, span: Range<usize>) -> Option<Message<'_>> {
            if wire.jsonrpc.as_deref() != Some("2.0") {
                return None;
            }
            let kind = match (&wire.method, &wire.id) {
                (Some(_), Some(_)) => CallKind::Request,
                (Some(_), None) => CallKind::Notification,
                (None, Some(_)) if wire.result.is_some() || wire.error.is_some() => {
                    CallKind::Response
                }
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
    }

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
            Just(r#"{"q":"a\nb","k":[1,-0,2.5e3,{}],"\u0071":null}"#.to_owned()),
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
                    m.id.map(|i| serde_json::from_str::<Value>(i).unwrap()),
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
        assert_eq!(m.id.unwrap(), "2");
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
        assert_eq!(m.id.unwrap(), "7");
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
