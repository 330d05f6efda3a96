//! An answer costs the stack a constant, whatever its size: a 256 MiB JSON answer, a 256 MiB
//! SSE event and a 256 MiB SSE line that never ends pass through the whole stack (every stage
//! that reads answers: outcome, deadline, idempotency, the tool-list learning) while the
//! process's peak resident memory grows by a few MiB at most. One test in its own binary, so
//! nothing else runs beside it while the peak is measured.

mod common;

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use http::{StatusCode, header};
use http_body::Frame;
use http_body_util::BodyExt;
use stormgate::control::{Config, Control};
use tower::ServiceExt;

const SIZE: usize = 256 << 20;
const CHUNK: usize = 64 << 10;

/// A body of `head`, `SIZE` bytes of `a`, then `tail`, in 64 KiB chunks that share one
/// buffer (the producer costs nothing).
fn huge(head: &'static str, tail: &'static str) -> Body {
    let filler = Bytes::from(vec![b'a'; CHUNK]);
    let chunks = std::iter::once(Bytes::from_static(head.as_bytes()))
        .chain((0..SIZE / CHUNK).map(move |_| filler.clone()))
        .chain(std::iter::once(Bytes::from_static(tail.as_bytes())))
        .map(|b| Ok::<_, std::convert::Infallible>(Frame::data(b)));
    Body::new(http_body_util::StreamBody::new(futures::stream::iter(
        chunks,
    )))
}

/// The MCP server: a session on `initialize`, and a huge answer to each tool (named for its
/// framing).
async fn server(body: Bytes) -> Response {
    let text = String::from_utf8_lossy(&body);
    let answer = |content_type: &str, body: Body| {
        Response::builder()
            .header(header::CONTENT_TYPE, content_type)
            .body(body)
            .unwrap()
    };
    if text.contains("\"initialize\"") {
        let init = r#"{"jsonrpc":"2.0","id":0,"result":{"protocolVersion":"2025-11-25","capabilities":{"tools":{}},"serverInfo":{"name":"huge","version":"1"}}}"#;
        let mut res = answer("application/json", Body::from(init));
        res.headers_mut()
            .insert("mcp-session-id", "s-1".parse().unwrap());
        return res;
    }
    if !text.contains("tools/call") {
        return Response::builder()
            .status(StatusCode::ACCEPTED)
            .body(Body::empty())
            .unwrap();
    }
    if text.contains("\"json\"") {
        answer(
            "application/json",
            huge(
                r#"{"jsonrpc":"2.0","result":{"content":[{"type":"text","text":""#,
                r#""}]},"id":1}"#,
            ),
        )
    } else if text.contains("\"sse\"") {
        answer(
            "text/event-stream",
            huge(
                "event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"content\":[{\"type\":\"text\",\"text\":\"",
                "\"}]}}\n\n",
            ),
        )
    } else {
        // An SSE line that never ends.
        answer(
            "text/event-stream",
            huge(
                "event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":\"",
                "",
            ),
        )
    }
}

/// A figure of `/proc/self/status`, in KiB.
fn status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with(field)).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[tokio::test]
async fn a_256_mib_answer_costs_the_stack_a_few_mib() {
    let config: Config = toml::from_str(
        r#"
        [idempotency]
        tools = ["json", "sse", "endless"]
        [deadlines]
        default_ms = 600000
        "#,
    )
    .unwrap();
    let control = Control::new(config).unwrap();
    let router = control.wrap(axum::Router::new().route("/mcp", axum::routing::post(server)));
    let session = common::session(&router).await;

    for (i, tool) in ["json", "sse", "endless"].into_iter().enumerate() {
        let mut call = common::tool_call(&session, 1, tool, serde_json::json!({}));
        call.headers_mut()
            .insert("idempotency-key", format!("k{i}").parse().unwrap());
        // The peak from here on (clear_refs 5 resets the high-water mark).
        std::fs::write("/proc/self/clear_refs", "5").unwrap();
        let before = status_kib("VmRSS:");
        let res = router.clone().oneshot(call).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK, "{tool}");
        let mut body = res.into_body();
        let mut passed = 0usize;
        while let Some(frame) = body.frame().await {
            passed += frame.unwrap().data_ref().map_or(0, Bytes::len);
        }
        assert!(
            passed > SIZE,
            "{tool}: the whole answer passed ({passed} bytes)"
        );
        let grew = status_kib("VmHWM:").saturating_sub(before);
        eprintln!("{tool}: peak resident memory +{grew} KiB");
        assert!(
            grew < 8 * 1024,
            "{tool}: the peak grew by {grew} KiB for a {} MiB answer",
            SIZE >> 20
        );
    }
}
