//! Whole-round deadlines through the example stack (in process, paused time): refused at once
//! when the queue cannot make it, cut when running past it, and handed to the tool code; and
//! the deadline layer alone.

mod common;

#[path = "../examples/mcp_server/app.rs"]
mod app;

use std::num::NonZeroUsize;
use std::time::Duration;
use stormgate::valid::NonZeroDuration;

use axum::body::Body;
use common::{message, session, tool_call};
use http::Request;
use serde_json::json;
use stormgate::classify::ClassifyLayer;
use stormgate::classify::DeadlineConfig;
use stormgate::control::Config;
use stormgate::deadline::{Deadline, DeadlineLayer};
use stormgate::fifo::{FifoLimitLayer, ResourceLimiter, ResourceLimits};
use tokio::time::Instant;
use tower::{Layer, ServiceExt};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[tokio::test(start_paused = true)]
async fn refused_at_once_when_the_queue_cannot_make_it_and_cut_when_running_past_it() {
    let mut config = Config::default();
    config.fifo.tools.insert("sql_scan".into(), "db".into());
    config.fifo.keys.insert(
        "db".into(),
        ResourceLimits::default().max_concurrent(NonZeroUsize::MIN),
    );
    config.deadlines.tools.insert(
        "sql_scan".into(),
        NonZeroDuration::from_millis(300).unwrap(),
    );
    config.costs.tools.insert(
        "sql_scan".into(),
        stormgate::cost::Weight::fixed(1).unwrap(),
    );
    let (router, control) = app::protected(app::Backend::new(), config).unwrap();
    let sid = session(&router).await;
    let scan = |i| tool_call(&sid, i, "sql_scan", json!({"table": "t"}));

    // One scan to learn how long a scan holds its place (200 ms).
    let (warm, _) = message(router.clone().oneshot(scan(1)).await.unwrap()).await;
    assert_eq!(warm["result"]["isError"], false);

    let start = Instant::now();
    let spawn = |req| {
        let r = router.clone();
        tokio::spawn(async move {
            let msg = message(r.oneshot(req).await.unwrap()).await.0;
            (msg, start.elapsed())
        })
    };
    let a = spawn(scan(2)); // runs 0..200 ms
    tokio::task::yield_now().await;
    let b = spawn(scan(3)); // waits 200 ms, runs from 200 ms, deadline 300 ms: cut
    tokio::task::yield_now().await;
    let c = spawn(scan(4)); // two scans ahead: 400 ms > 300 ms, refused at once

    let (c, c_at) = c.await.unwrap();
    assert_eq!(c["error"]["data"]["reason"], "deadline_exceeded");
    assert_eq!(c["error"]["data"]["scope"], "tool");
    assert_eq!(c_at, Duration::ZERO, "refused at once, not at its deadline");

    let (b, b_at) = b.await.unwrap();
    assert_eq!(b["error"]["data"]["reason"], "deadline_exceeded", "{b}");
    assert_eq!(b["error"]["data"]["queue_wait_ms"], 200);
    assert_eq!(b_at, ms(300), "cut at its deadline");
    assert_eq!(
        control.limiter().in_flight("db"),
        0,
        "its place is free at once"
    );

    let (a, _) = a.await.unwrap();
    assert_eq!(a["result"]["isError"], false, "{a}");
}

#[tokio::test(start_paused = true)]
async fn the_deadline_reaches_the_tool_code() {
    let layer = ClassifyLayer::new().deadlines({
        let mut built = DeadlineConfig::default();
        built.default = Some(NonZeroDuration::new(ms(2000)).unwrap());
        built
    });
    let inner = tower::service_fn(|req: Request<Body>| async move {
        let remaining = req.extensions().get::<Deadline>().map(Deadline::remaining);
        Ok::<_, std::convert::Infallible>(http::Response::new(Body::from(format!("{remaining:?}"))))
    });
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x"}}"#;
    let res = layer
        .layer(inner)
        .oneshot(Request::post("/mcp").body(Body::from(body)).unwrap())
        .await
        .unwrap();
    let text = common::body_bytes(res).await;
    assert_eq!(text, "Some(2s)");
}

/// The deadline layer alone, behind a classifier giving every call `deadline`.
fn alone<S>(
    deadline: Duration,
    inner: S,
) -> impl tower::Service<
    Request<Body>,
    Response = http::Response<Body>,
    Error = std::convert::Infallible,
    Future: Send,
> + Clone
where
    S: tower::Service<
            Request<Body>,
            Response = http::Response<Body>,
            Error = std::convert::Infallible,
        > + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    let deadlines = {
        let mut built = DeadlineConfig::default();
        built.default = Some(NonZeroDuration::new(deadline).unwrap());
        built
    };
    ClassifyLayer::new()
        .deadlines(deadlines)
        .layer(DeadlineLayer::new().layer(inner))
}

const CALL: &str = r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"x"}}"#;

#[tokio::test(start_paused = true)]
async fn the_deadline_layer_alone_answers_a_call_with_no_answer_by_its_deadline() {
    let inner = tower::service_fn(|_: Request<Body>| async {
        std::future::pending::<()>().await;
        Ok::<_, std::convert::Infallible>(http::Response::new(Body::empty()))
    });
    let start = Instant::now();
    let res = alone(ms(300), inner)
        .oneshot(common::post_body(CALL))
        .await
        .unwrap();
    assert_eq!(start.elapsed(), ms(300), "answered at its deadline");
    let v: serde_json::Value = serde_json::from_slice(&common::body_bytes(res).await).unwrap();
    assert_eq!(v["id"], 7);
    assert_eq!(v["error"]["data"]["reason"], "deadline_exceeded", "{v}");
    assert_eq!(v["error"]["data"]["scope"], "tool");
}

#[tokio::test(start_paused = true)]
async fn the_deadline_layer_alone_cuts_a_stream_and_ends_it_with_the_refusal() {
    let inner = tower::service_fn(|_: Request<Body>| async {
        let first: Result<http_body::Frame<bytes::Bytes>, std::io::Error> =
            Ok(http_body::Frame::data(bytes::Bytes::from_static(
                b"data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\"}\n\n",
            )));
        let stream =
            futures::StreamExt::chain(futures::stream::iter([first]), futures::stream::pending());
        let body = Body::new(http_body_util::StreamBody::new(stream));
        let res = http::Response::builder()
            .header(http::header::CONTENT_TYPE, "text/event-stream")
            .body(body)
            .unwrap();
        Ok::<_, std::convert::Infallible>(res)
    });
    let start = Instant::now();
    let res = alone(ms(300), inner)
        .oneshot(common::post_body(CALL))
        .await
        .unwrap();
    assert_eq!(start.elapsed(), Duration::ZERO, "the head passes at once");
    let mut body = res.into_body();
    let mut text = String::new();
    while !http_body::Body::is_end_stream(&body) {
        let Some(frame) = http_body_util::BodyExt::frame(&mut body).await else {
            break;
        };
        let data = frame.unwrap().into_data().unwrap();
        text.push_str(std::str::from_utf8(&data).unwrap());
    }
    assert_eq!(start.elapsed(), ms(300), "cut at its deadline");
    // It says it has ended with the cut: a server need not poll it again to learn so.
    assert!(http_body::Body::is_end_stream(&body));
    let events: Vec<&str> = text.split("\n\n").filter(|e| !e.is_empty()).collect();
    assert_eq!(events.len(), 2, "{text}");
    assert!(events[0].contains("notifications/progress"));
    assert!(
        events[1].contains("\"id\":7") && events[1].contains("deadline_exceeded"),
        "{text}"
    );
}

#[tokio::test(start_paused = true)]
async fn the_deadline_layer_alone_passes_a_call_answered_in_time_untouched() {
    let inner = tower::service_fn(|_: Request<Body>| async {
        tokio::time::sleep(ms(100)).await;
        Ok::<_, std::convert::Infallible>(http::Response::new(Body::from(
            r#"{"jsonrpc":"2.0","id":7,"result":{}}"#,
        )))
    });
    let res = alone(ms(300), inner)
        .oneshot(common::post_body(CALL))
        .await
        .unwrap();
    let body = common::body_bytes(res).await;
    assert_eq!(body, r#"{"jsonrpc":"2.0","id":7,"result":{}}"#);
}

#[tokio::test(start_paused = true)]
async fn a_batch_cut_before_its_answer_keeps_the_refusals_the_fifo_gave_the_others() {
    // The database's one place is taken and nothing may wait: a scan is refused at once.
    let limits = ResourceLimits::default()
        .max_concurrent(NonZeroUsize::MIN)
        .max_queue_depth(0);
    let limiter = ResourceLimiter::builder().key("db", limits).build();
    let _held = limiter.acquire("db", None).await.unwrap();
    let inner = tower::service_fn(|_: Request<Body>| async {
        std::future::pending::<()>().await;
        Ok::<_, std::convert::Infallible>(http::Response::new(Body::empty()))
    });
    let deadlines = {
        let mut built = DeadlineConfig::default();
        built.tools.insert(
            "read_doc".into(),
            NonZeroDuration::from_millis(300).unwrap(),
        );
        built
    };
    let stack = ClassifyLayer::new().deadlines(deadlines).layer(
        FifoLimitLayer::new(limiter.clone())
            .tool_key("sql_scan", "db")
            .layer(DeadlineLayer::new().layer(inner)),
    );
    let batch = r#"[{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"sql_scan"}},{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"read_doc"}}]"#;
    let start = Instant::now();
    let res = stack.oneshot(common::post_body(batch)).await.unwrap();
    assert_eq!(start.elapsed(), ms(300), "answered at the read's deadline");
    let v: serde_json::Value = serde_json::from_slice(&common::body_bytes(res).await).unwrap();
    let answers = v
        .as_array()
        .unwrap_or_else(|| panic!("a batch answer: {v}"));
    let reason = |id: u64| {
        let found: Vec<_> = answers.iter().filter(|a| a["id"] == id).collect();
        assert_eq!(found.len(), 1, "one answer for id {id}: {v}");
        found[0]["error"]["data"]["reason"].clone()
    };
    assert_eq!(reason(1), "queue_full", "{v}");
    assert_eq!(reason(2), "deadline_exceeded", "{v}");
}
