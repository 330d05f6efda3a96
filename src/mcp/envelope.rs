//! Borrowed parsing of a JSON-RPC body: a single message or a batch array.

use std::borrow::Cow;
use std::ops::Range;

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
    pub(crate) messages: Vec<Message<'a>>,
    pub(crate) batch: bool,
}

#[derive(Deserialize)]
struct Wire<'a> {
    #[serde(borrow, default)]
    jsonrpc: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "present")]
    id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    method: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    params: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    result: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    error: Option<&'a RawValue>,
}

#[derive(Deserialize, Default)]
struct Params<'a> {
    #[serde(borrow, default)]
    name: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    uri: Option<Cow<'a, str>>,
    #[serde(borrow, default, rename = "_meta")]
    meta: Option<&'a RawValue>,
    #[serde(borrow, default)]
    arguments: Option<&'a RawValue>,
}

/// `Some` for any present value, `null` included (a plain `Option` would read `null` as absent).
fn present<'de, D: Deserializer<'de>>(de: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&'de RawValue>::deserialize(de).map(Some)
}

fn first_byte(raw: &str) -> Option<u8> {
    raw.bytes().find(|b| !b.is_ascii_whitespace())
}

/// Parses a body. `Err` means it is not JSON-RPC and must be forwarded untouched.
pub(crate) fn parse(body: &[u8]) -> Result<Parsed<'_>, Unclassified> {
    match first_byte(std::str::from_utf8(body).map_err(|_| Unclassified::NotJson)?) {
        Some(b'{') => {
            let wire: Wire<'_> = serde_json::from_slice(body).map_err(|e| classify_err(&e))?;
            let message = message(wire, 0..body.len()).ok_or(Unclassified::NotJsonRpc)?;
            Ok(Parsed {
                messages: vec![message],
                batch: false,
            })
        }
        Some(b'[') => {
            let items: Vec<&RawValue> =
                serde_json::from_slice(body).map_err(|e| classify_err(&e))?;
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
                messages,
                batch: true,
            })
        }
        _ => {
            // Valid JSON of another shape is JSON but not JSON-RPC.
            serde_json::from_slice::<serde::de::IgnoredAny>(body)
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
    let params = wire
        .params
        .filter(|p| first_byte(p.get()) == Some(b'{'))
        .and_then(|p| serde_json::from_str::<Params<'_>>(p.get()).ok())
        .unwrap_or_default();
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

    #[test]
    fn single_request() {
        let body = br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"sql_scan","arguments":{"q":"x"}}}"#;
        let p = parse(body).unwrap();
        assert!(!p.batch);
        let m = &p.messages[0];
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
        assert_eq!(p.messages[0].method.as_deref(), Some("tools/call"));
        assert_eq!(p.messages[0].name.as_deref(), Some("sql"));
    }

    #[test]
    fn batch_spans_point_at_the_elements() {
        let body = br#"[ {"jsonrpc":"2.0","id":1,"method":"ping"} ,{"jsonrpc":"2.0","method":"notifications/initialized"}, 5 ]"#;
        let p = parse(body).unwrap();
        assert!(p.batch);
        let kinds: Vec<_> = p.messages.iter().map(|m| m.kind).collect();
        assert_eq!(
            kinds,
            [CallKind::Request, CallKind::Notification, CallKind::Invalid]
        );
        assert_eq!(
            &body[p.messages[0].span.clone()],
            br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#
        );
        assert_eq!(&body[p.messages[2].span.clone()], b"5");
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
