//! Classification of every envelope form, identity, headers, and the body limit.

mod common;

use axum::body::Body;
use std::time::Duration;

use bytes::Bytes;
use common::{Recorder, ok_json, post, post_body};
use futures::StreamExt;
use http::{HeaderName, Request, StatusCode};
use proptest::prelude::*;
use serde_json::Value;
use stormgate::call::{DefaultIdentity, Unclassified};
use stormgate::classify::ClassifyLayer;
use stormgate::mcp::ProtocolVersion;
use stormgate::{CallKind, Tenant};
use tower::{Layer, ServiceExt};

async fn classify(
    layer: &ClassifyLayer,
    req: Request<Body>,
) -> (common::Seen, http::Response<Body>) {
    let rec = Recorder::default();
    let res = layer
        .layer(rec.service(ok_json))
        .oneshot(req)
        .await
        .unwrap();
    (rec.last(), res)
}

async fn classify_body(body: &'static str) -> common::Seen {
    classify(&ClassifyLayer::new(), post_body(body)).await.0
}

#[tokio::test]
async fn single_request_with_number_id() {
    let body = r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"sql_scan","arguments":{"table":"t"}}}"#;
    let seen = classify_body(body).await;
    assert_eq!(seen.body, body.as_bytes());
    let calls = seen.calls.unwrap();
    let call = calls.single().unwrap();
    assert_eq!(call.kind, CallKind::Request);
    assert_eq!(call.id.as_ref().unwrap().as_json(), "7");
    assert_eq!(call.method.as_deref(), Some("tools/call"));
    assert_eq!(call.tool.as_deref(), Some("sql_scan"));
    assert_eq!(
        call.arguments(),
        Some(r#"{"table":"t"}"#),
        "exact bytes of the arguments"
    );
    assert_eq!(call.resource, None);
    assert_eq!(call.tenant.as_str(), "anonymous");
    assert_eq!(call.session.as_str(), "anonymous");
    assert_eq!(call.cost(), 1);
    assert!(call.is_chargeable());
}

#[tokio::test]
async fn string_id_resource_and_prompt() {
    let seen = classify_body(
        r#"{"jsonrpc":"2.0","id":"req-1","method":"resources/read","params":{"uri":"db://orders/42"}}"#,
    )
    .await;
    let calls = seen.calls.unwrap();
    let call = calls.single().unwrap();
    assert_eq!(call.id.as_ref().unwrap().as_json(), r#""req-1""#);
    assert_eq!(call.resource.as_deref(), Some("db://orders/42"));
    assert_eq!(call.target(), Some("db://orders/42"));
    assert_eq!(call.tool, None);

    let seen = classify_body(
        r#"{"jsonrpc":"2.0","id":3.5,"method":"prompts/get","params":{"name":"summarize"}}"#,
    )
    .await;
    let calls = seen.calls.unwrap();
    let call = calls.single().unwrap();
    assert_eq!(call.id.as_ref().unwrap().as_json(), "3.5");
    assert_eq!(call.prompt.as_deref(), Some("summarize"));
    assert_eq!(call.tool, None);
}

#[tokio::test]
async fn notification_has_no_id_and_is_not_chargeable() {
    let seen = classify_body(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#).await;
    let calls = seen.calls.unwrap();
    let call = calls.single().unwrap();
    assert_eq!(call.kind, CallKind::Notification);
    assert!(call.id.is_none());
    assert!(!call.is_chargeable());
}

#[tokio::test]
async fn client_response_is_classified_as_response() {
    for body in [
        r#"{"jsonrpc":"2.0","id":5,"result":{"roots":[]}}"#,
        r#"{"jsonrpc":"2.0","id":"s-1","error":{"code":-1,"message":"no"}}"#,
    ] {
        let seen = classify_body(body).await;
        let calls = seen.calls.unwrap();
        let call = calls.single().unwrap();
        assert_eq!(call.kind, CallKind::Response);
        assert!(call.method.is_none());
        assert!(!call.is_chargeable());
    }
}

#[tokio::test]
async fn batch_with_every_id_type() {
    let body = r#"[{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"cache_get"}},
 {"jsonrpc":"2.0","id":"b","method":"tools/call","params":{"name":"sql_scan"}},
 {"jsonrpc":"2.0","id":null,"method":"ping"},
 {"jsonrpc":"2.0","method":"notifications/progress"},
 {"jsonrpc":"2.0","id":9,"result":{}},
 "junk"]"#;
    let seen = classify_body(body).await;
    assert_eq!(seen.body, body.as_bytes());
    let calls = seen.calls.unwrap();
    assert!(calls.is_batch());
    assert!(calls.single().is_none());
    let got: Vec<(CallKind, Option<String>, Option<String>)> = calls
        .iter()
        .map(|c| {
            (
                c.kind,
                c.id.as_ref().map(|i| i.as_json().to_owned()),
                c.tool.as_deref().map(str::to_owned),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            (
                CallKind::Request,
                Some("1".into()),
                Some("cache_get".into())
            ),
            (
                CallKind::Request,
                Some(r#""b""#.into()),
                Some("sql_scan".into())
            ),
            (CallKind::Request, Some("null".into()), None),
            (CallKind::Notification, None, None),
            (CallKind::Response, Some("9".into()), None),
            (CallKind::Invalid, None, None),
        ]
    );
}

#[tokio::test]
async fn malformed_bodies_are_forwarded_byte_for_byte_and_tagged() {
    let cases: [(&[u8], Unclassified); 5] = [
        (b"{\"jsonrpc\":\"2.0\",\"id\":1,", Unclassified::NotJson),
        (b"not json at all", Unclassified::NotJson),
        (&[0xff, 0x00, 0x7b], Unclassified::NotJson),
        (br#"{"hello":"world"}"#, Unclassified::NotJsonRpc),
        (b"[]", Unclassified::NotJsonRpc),
    ];
    for (body, tag) in cases {
        let (seen, res) =
            classify(&ClassifyLayer::new(), post_body(Bytes::from_static(body))).await;
        assert_eq!(seen.body, body, "exact bytes");
        assert!(seen.calls.is_none());
        assert_eq!(seen.unclassified, Some(tag));
        assert_eq!(
            res.status(),
            StatusCode::OK,
            "answered by the inner service"
        );
    }
}

#[tokio::test]
async fn get_and_delete_pass_through_unread() {
    for method in [http::Method::GET, http::Method::DELETE] {
        let req = Request::builder()
            .method(method.clone())
            .uri("/mcp")
            .body(Body::from("anything"))
            .unwrap();
        let (seen, _) = classify(&ClassifyLayer::new(), req).await;
        assert_eq!(seen.method, method);
        assert_eq!(seen.body, "anything");
        assert!(seen.calls.is_none());
        assert!(seen.unclassified.is_none());
    }
}

#[tokio::test]
async fn mcp_method_and_name_headers_are_checked_and_the_body_wins() {
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"sql_scan"}}"#;
    let matching = post()
        .header("mcp-method", "tools/call")
        .header("mcp-name", "sql_scan")
        .body(Body::from(body))
        .unwrap();
    let (seen, _) = classify(&ClassifyLayer::new(), matching).await;
    assert!(!seen.calls.unwrap().single().unwrap().header_mismatch);

    let lying = post()
        .header("mcp-method", "tools/call")
        .header("mcp-name", "cache_get")
        .body(Body::from(body))
        .unwrap();
    let (seen, _) = classify(&ClassifyLayer::new(), lying).await;
    let calls = seen.calls.unwrap();
    let call = calls.single().unwrap();
    assert!(call.header_mismatch);
    assert_eq!(call.tool.as_deref(), Some("sql_scan"), "the body wins");

    let wrong_method = post()
        .header("mcp-method", "ping")
        .body(Body::from(body))
        .unwrap();
    let (seen, _) = classify(&ClassifyLayer::new(), wrong_method).await;
    assert!(seen.calls.unwrap().single().unwrap().header_mismatch);
}

#[tokio::test]
async fn protocol_version_header_is_read() {
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;
    let req = post()
        .header("mcp-protocol-version", "2026-07-28")
        .body(Body::from(body))
        .unwrap();
    let (seen, _) = classify(&ClassifyLayer::new(), req).await;
    assert_eq!(
        seen.calls.unwrap().single().unwrap().protocol_version,
        Some(ProtocolVersion::V2026_07_28)
    );
    let req = post()
        .header("mcp-protocol-version", "garbage")
        .body(Body::from(body))
        .unwrap();
    let (seen, _) = classify(&ClassifyLayer::new(), req).await;
    assert_eq!(seen.calls.unwrap().single().unwrap().protocol_version, None);
}

#[tokio::test]
async fn tenant_comes_from_the_extension_then_a_configured_header() {
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;
    // A client-chosen header is ignored unless configured.
    let req = post()
        .header("x-tenant", "evil")
        .body(Body::from(body))
        .unwrap();
    let (seen, _) = classify(&ClassifyLayer::new(), req).await;
    assert_eq!(
        seen.calls.unwrap().single().unwrap().tenant.as_str(),
        "anonymous"
    );

    let configured = ClassifyLayer::new()
        .identity(DefaultIdentity::new().tenant_header(HeaderName::from_static("x-tenant")));
    let req = post()
        .header("x-tenant", "acme")
        .body(Body::from(body))
        .unwrap();
    let (seen, _) = classify(&configured, req).await;
    let calls = seen.calls.unwrap();
    let call = calls.single().unwrap();
    assert_eq!(call.tenant.as_str(), "acme");
    assert_eq!(call.session.as_str(), "acme", "no session: the tenant");

    // The auth layer's extension wins over the header.
    let mut req = post()
        .header("x-tenant", "acme")
        .body(Body::from(body))
        .unwrap();
    req.extensions_mut().insert(Tenant::new("verified"));
    let (seen, _) = classify(&configured, req).await;
    assert_eq!(
        seen.calls.unwrap().single().unwrap().tenant.as_str(),
        "verified"
    );
}

#[tokio::test]
async fn session_comes_from_the_header_then_a_meta_key_then_the_tenant() {
    let layer = ClassifyLayer::new().identity(DefaultIdentity::new().session_meta_key("agent_run"));
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","_meta":{"agent_run":"run-9","other":1}}}"#;
    let req = post()
        .header("mcp-session-id", "sess-1")
        .body(Body::from(body))
        .unwrap();
    let (seen, _) = classify(&layer, req).await;
    assert_eq!(
        seen.calls.unwrap().single().unwrap().session.as_str(),
        "sess-1"
    );

    let (seen, _) = classify(&layer, post_body(body)).await;
    assert_eq!(
        seen.calls.unwrap().single().unwrap().session.as_str(),
        "run-9"
    );

    let (seen, _) = classify(&ClassifyLayer::new(), post_body(body)).await;
    assert_eq!(
        seen.calls.unwrap().single().unwrap().session.as_str(),
        "anonymous",
        "meta key not configured: the tenant"
    );
}

#[tokio::test]
async fn client_chosen_identities_are_bounded_wherever_they_are_kept() {
    let layer = ClassifyLayer::new()
        .identity(DefaultIdentity::new().tenant_header(http::HeaderName::from_static("x-tenant")));
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x"}}"#;
    let session_of = |id: String, tenant: String| {
        let layer = layer.clone();
        async move {
            let req = post()
                .header("mcp-session-id", id)
                .header("x-tenant", tenant)
                .body(Body::from(body))
                .unwrap();
            let call = classify(&layer, req)
                .await
                .0
                .calls
                .unwrap()
                .single()
                .unwrap()
                .clone();
            (
                call.session.as_str().to_owned(),
                call.tenant.as_str().to_owned(),
            )
        }
    };
    // 64 KiB identities (a header can carry that much): stored as 17 bytes, still apart.
    let (a, ta) = session_of("a".repeat(64 * 1024), "t".repeat(64 * 1024)).await;
    let (b, _) = session_of("b".repeat(64 * 1024), "acme".into()).await;
    assert_eq!(a.len(), 17, "{a}");
    assert_eq!(ta.len(), 17, "{ta}");
    assert!(a.starts_with('~'));
    assert_ne!(a, b, "different long ids stay different sessions");
    let exact = "s".repeat(stormgate::call::MAX_ID_LEN);
    let (kept, t) = session_of(exact.clone(), "acme".into()).await;
    assert_eq!(
        (kept, t),
        (exact, "acme".into()),
        "ids up to the bound are kept as they are"
    );
}

/// A request whose body sends `first` bytes, then stalls for ever.
fn stalled(first: usize, content_length: Option<usize>) -> Request<Body> {
    let chunk = Bytes::from(vec![b' '; first]);
    let stream =
        futures::stream::iter([Ok::<_, std::io::Error>(chunk)]).chain(futures::stream::pending());
    let mut req = post();
    if let Some(n) = content_length {
        req = req.header("content-length", n);
    }
    req.body(Body::from_stream(stream)).unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_stalled_body_is_answered_408_at_exactly_the_body_timeout() {
    let layer = ClassifyLayer::new();
    let start = tokio::time::Instant::now();
    let (status, body) = {
        let rec = Recorder::default();
        let res = layer
            .layer(rec.service(ok_json))
            .oneshot(stalled(1 << 20, Some(4 << 20)))
            .await
            .unwrap();
        assert!(rec.seen().is_empty(), "nothing reached the inner service");
        (res.status(), common::body_json(res).await)
    };
    assert_eq!(
        start.elapsed(),
        Duration::from_secs(10),
        "the default body_timeout_ms"
    );
    assert_eq!(status, StatusCode::REQUEST_TIMEOUT);
    assert_eq!(body["error"]["code"], -32600);
    assert_eq!(body["id"], Value::Null);
    assert_eq!(layer.buffered_bytes(), 0, "its reservation given back");
}

#[tokio::test(start_paused = true)]
async fn bodies_being_read_at_once_are_capped_and_the_next_is_answered_503_unread() {
    let layer = ClassifyLayer::new().settings({
        let mut built = stormgate::classify::ClassifyConfig::default();
        built.max_buffered_bytes = std::num::NonZeroUsize::new(10 << 20).unwrap();
        built
    });
    let svc = || layer.clone().layer(Recorder::default().service(ok_json));
    // Two slow clients declaring 4 MiB each: 8 of the 10 MiB.
    let slow: Vec<_> = (0..2)
        .map(|_| tokio::spawn(svc().oneshot(stalled(1024, Some(4 << 20)))))
        .collect();
    while layer.buffered_bytes() < 8 << 20 {
        tokio::task::yield_now().await;
    }
    // A third would pass the cap: refused at once, before a byte of it is read.
    let res = svc().oneshot(stalled(0, Some(4 << 20))).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(res.headers()["retry-after"], "1");
    // A small one still fits.
    let res = svc()
        .oneshot(post_body(r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    for s in slow {
        assert_eq!(
            s.await.unwrap().unwrap().status(),
            StatusCode::REQUEST_TIMEOUT
        );
    }
    assert_eq!(layer.buffered_bytes(), 0);
    let res = svc().oneshot(stalled(0, Some(4 << 20)));
    let res = tokio::time::timeout(Duration::from_secs(11), res)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        res.status(),
        StatusCode::REQUEST_TIMEOUT,
        "admitted again once the others left"
    );
}

#[tokio::test]
async fn oversized_body_by_content_length_is_refused_before_reading() {
    let rec = Recorder::default();
    let svc = ClassifyLayer::new()
        .body_limit(64)
        .layer(rec.service(ok_json));
    let req = post()
        .header("content-length", "65")
        .body(Body::from(vec![b' '; 65]))
        .unwrap();
    let res = svc.oneshot(req).await.unwrap();
    assert_eq!(res.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(res.headers()["content-type"], "application/json");
    let body = common::body_json(res).await;
    assert_eq!(body["jsonrpc"], "2.0");
    assert_eq!(body["id"], serde_json::Value::Null);
    assert_eq!(body["error"]["code"], -32600);
    assert!(rec.seen().is_empty(), "nothing reaches the inner service");
}

#[tokio::test]
async fn oversized_body_without_length_is_refused_while_reading() {
    let rec = Recorder::default();
    let svc = ClassifyLayer::new()
        .body_limit(64)
        .layer(rec.service(ok_json));
    // No Content-Length header: the limit is enforced on the bytes as they arrive.
    let res = svc.oneshot(post_body(vec![b'x'; 1000])).await.unwrap();
    assert_eq!(res.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(common::body_json(res).await["error"]["code"], -32600);
    assert!(rec.seen().is_empty());

    // Exactly at the limit is fine.
    let rec = Recorder::default();
    let svc = ClassifyLayer::new()
        .body_limit(64)
        .layer(rec.service(ok_json));
    let res = svc.oneshot(post_body(vec![b' '; 64])).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(rec.last().body.len(), 64);
}

/// A body that fails after its first chunk, like a client that disconnects mid-upload.
struct Broken(bool);

impl http_body::Body for Broken {
    type Data = Bytes;
    type Error = std::io::Error;
    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, std::io::Error>>> {
        if self.0 {
            return std::task::Poll::Ready(Some(Err(std::io::Error::other("reset"))));
        }
        self.0 = true;
        std::task::Poll::Ready(Some(Ok(http_body::Frame::data(Bytes::from_static(
            b"{\"jsonrpc\"",
        )))))
    }
}

#[tokio::test]
async fn unreadable_body_gets_400_and_nothing_is_forwarded() {
    let rec = Recorder::default();
    let svc = ClassifyLayer::new().layer(rec.service(ok_json));
    let req = Request::post("/mcp").body(Broken(false)).unwrap();
    let res = svc.oneshot(req).await.unwrap();
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    assert_eq!(common::body_json(res).await["error"]["code"], -32600);
    assert!(rec.seen().is_empty());
}

fn jsonish() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..256),
        "[\\[\\]{}\",:0-9a-z \\\\.-]{0,200}".prop_map(String::into_bytes),
        (
            prop_oneof![Just("1"), Just("\"x\""), Just("null"), Just("[1]"), Just("{}")],
            "[a-z/]{0,12}",
            "[a-z_\\\\\"]{0,12}",
            any::<bool>(),
        )
            .prop_map(|(id, method, name, batch)| {
                let one = format!(
                    r#"{{"jsonrpc":"2.0","id":{id},"method":"{method}","params":{{"name":"{name}"}}}}"#
                );
                if batch { format!("[{one},{one}]") } else { one }.into_bytes()
            }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Whatever the bytes, classification never panics and the inner service receives exactly
    /// what the client sent.
    #[test]
    fn arbitrary_bodies_reach_the_inner_service_unchanged(body in jsonish()) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        let (seen, res) = rt.block_on(classify(&ClassifyLayer::new(), post_body(body.clone())));
        prop_assert_eq!(res.status(), StatusCode::OK);
        prop_assert_eq!(&seen.body[..], &body[..]);
        prop_assert!(seen.calls.is_some() != seen.unclassified.is_some());
        if let Some(calls) = seen.calls {
            for call in calls.iter() {
                prop_assert_eq!(call.kind == CallKind::Request, call.is_chargeable());
            }
        }
    }
}

/// The session ladder for session-less (2026-07-28) requests: clients that declare another
/// name or call from another address are other sessions; the same declaration from the same
/// address (any port) is one session; without either it is the tenant.
#[tokio::test]
async fn session_less_clients_are_told_apart_by_declared_info_and_address() {
    use axum::extract::ConnectInfo;
    use std::net::SocketAddr;
    let session_of = |name: &str, addr: Option<&str>| {
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"t","arguments":{{}},
            "_meta":{{"io.modelcontextprotocol/clientInfo":{{"name":"{name}","version":"1"}}}}}}}}"#
        );
        let mut req = post()
            .header("mcp-protocol-version", "2026-07-28")
            .body(Body::from(body))
            .unwrap();
        if let Some(a) = addr {
            req.extensions_mut()
                .insert(ConnectInfo(a.parse::<SocketAddr>().unwrap()));
        }
        async move {
            let (seen, _) = classify(&ClassifyLayer::new(), req).await;
            seen.calls.unwrap().single().unwrap().session.clone()
        }
    };
    let a = session_of("agent-a", Some("10.0.0.1:40000")).await;
    assert_eq!(
        a,
        session_of("agent-a", Some("10.0.0.1:40001")).await,
        "any port"
    );
    assert_ne!(
        a,
        session_of("agent-b", Some("10.0.0.1:40000")).await,
        "another name"
    );
    assert_ne!(
        a,
        session_of("agent-a", Some("10.0.0.2:40000")).await,
        "another host"
    );
    assert_ne!(a.as_str(), "anonymous");
    assert!(a.as_str().len() <= stormgate::call::MAX_ID_LEN);
}

/// Builder steps make a new layer: configuring a clone leaves the original, and the services
/// it already built, as they were.
#[tokio::test]
async fn configuring_a_clone_leaves_the_original_untouched() {
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;
    let original = ClassifyLayer::new();
    let built = original.layer(Recorder::default().service(ok_json));
    let narrow = original.clone().body_limit(8);
    let res = narrow
        .layer(Recorder::default().service(ok_json))
        .oneshot(post_body(body))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::PAYLOAD_TOO_LARGE);
    let (_, res) = classify(&original, post_body(body)).await;
    assert_eq!(res.status(), StatusCode::OK, "the original keeps its limit");
    let res = built.oneshot(post_body(body)).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK, "and so do its services");
}
