//! The deadline layer's release paths, one by one, inside the FIFO limiter and around
//! tower-test's mock service (paused time: exact). Every call has a 5 s deadline and the
//! resource one place and one more waiting; whatever way a call ends, the next one runs the
//! moment it does: answered in time, cut at its deadline before its answer (the layer answers
//! itself), cut mid-stream (the layer ends the stream with the refusal), or dropped by its
//! caller while the layer waits.

mod common;

use std::num::NonZeroUsize;
use std::time::Duration;
use stormgate::valid::NonZeroDuration;

use axum::body::Body;
use bytes::Bytes;
use common::{MockAnswer, MockHandle, MockStack, answer, body_bytes, body_json, reached, scan};
use http::{Request, Response};
use stormgate::classify::{ClassifyLayer, DeadlineConfig};
use stormgate::deadline::DeadlineLayer;
use stormgate::fifo::{FifoLimitLayer, ResourceLimiter, ResourceLimits};
use tokio::time::Instant;
use tower::util::BoxCloneService;
use tower::{BoxError, ServiceBuilder};
use tower_test::mock;

const DEADLINE: Duration = Duration::from_secs(5);

/// Classification (every call's deadline 5 s), the FIFO (`sql_scan` on `db`: one place, one
/// waiting) and the deadline layer around the mock, in the order the whole stack has them.
fn stack() -> (MockStack, MockHandle) {
    let deadlines = {
        let mut d = DeadlineConfig::default();
        d.default = Some(NonZeroDuration::new(DEADLINE).unwrap());
        d
    };
    let limiter = ResourceLimiter::builder()
        .key(
            "db",
            ResourceLimits::default()
                .max_concurrent(NonZeroUsize::MIN)
                .max_queue_depth(1),
        )
        .build();
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    let stack = ServiceBuilder::new()
        .layer(ClassifyLayer::new().deadlines(deadlines))
        .layer(FifoLimitLayer::new(limiter).tool_key("sql_scan", "db"))
        .layer(DeadlineLayer::new())
        .service(service);
    (BoxCloneService::new(stack), handle)
}

/// What `answer` gives, failing the test (not hanging it) if that takes a minute: the longest
/// any call here may run is its deadline.
async fn within_a_minute(answer: MockAnswer) -> Response<Body> {
    tokio::time::timeout(Duration::from_secs(60), answer)
        .await
        .expect("answered within a minute")
        .unwrap()
        .unwrap()
}

/// The first scan running on the one place (from 0 s) and the second waiting for it (sent at
/// 3 s, so its own deadline, 8 s, is after the first's). The clock is at 4 s on return: one
/// second went on seeing the second wait.
async fn one_running_one_waiting(
    stack: &MockStack,
    handle: &mut MockHandle,
) -> (MockAnswer, mock::SendResponse<Response<Body>>, MockAnswer) {
    let first = scan(stack, 1);
    let (id, send) = reached(handle).await.expect("the first runs");
    assert_eq!(id, 1);
    tokio::time::advance(Duration::from_secs(3)).await;
    let second = scan(stack, 2);
    assert!(reached(handle).await.is_none(), "the second waits");
    (first, send, second)
}

/// The second scan reaches the service now, is answered, and its answer passes whole.
async fn the_second_runs_now(handle: &mut MockHandle, second: MockAnswer) {
    let (id, send) = reached(handle).await.expect("the second runs now");
    assert_eq!(id, 2);
    send.send_response(answer(2));
    let done = body_json(within_a_minute(second).await).await;
    assert_eq!(done["id"], 2);
    assert!(done.get("error").is_none(), "{done}");
}

#[tokio::test(start_paused = true)]
async fn a_call_answered_in_time_passes_untouched_and_its_place_goes_to_the_next() {
    let start = Instant::now();
    let (stack, mut handle) = stack();
    let (first, send, second) = one_running_one_waiting(&stack, &mut handle).await;
    send.send_response(answer(1));
    let done = body_bytes(within_a_minute(first).await).await;
    assert_eq!(done, body_bytes(answer(1)).await, "byte for byte");
    the_second_runs_now(&mut handle, second).await;
    assert_eq!(
        start.elapsed(),
        Duration::from_secs(4),
        "before any deadline"
    );
}

#[tokio::test(start_paused = true)]
async fn a_call_cut_before_its_answer_gives_its_place_to_the_next_at_its_deadline() {
    let start = Instant::now();
    let (stack, mut handle) = stack();
    let (first, _send, second) = one_running_one_waiting(&stack, &mut handle).await;
    // The mock never answers the first: the layer answers for it at its deadline.
    let cut = body_json(within_a_minute(first).await).await;
    assert_eq!(
        start.elapsed(),
        DEADLINE,
        "answered at exactly its deadline"
    );
    assert_eq!(cut["id"], 1);
    assert_eq!(cut["error"]["data"]["reason"], "deadline_exceeded", "{cut}");
    the_second_runs_now(&mut handle, second).await;
    assert_eq!(
        start.elapsed(),
        DEADLINE,
        "the second ran at the first's deadline"
    );
}

#[tokio::test(start_paused = true)]
async fn a_stream_cut_at_its_deadline_gives_its_place_to_the_next() {
    let start = Instant::now();
    let (stack, mut handle) = stack();
    let (first, send, second) = one_running_one_waiting(&stack, &mut handle).await;
    // The first's answer begins (a progress event) and never ends.
    let event = Bytes::from_static(
        b"data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{}}\n\n",
    );
    let stream = futures::StreamExt::chain(
        futures::stream::iter([Ok::<_, BoxError>(event)]),
        futures::stream::pending(),
    );
    send.send_response(
        Response::builder()
            .header("content-type", "text/event-stream")
            .body(Body::from_stream(stream))
            .unwrap(),
    );
    let text = tokio::time::timeout(
        Duration::from_secs(60),
        body_bytes(within_a_minute(first).await),
    )
    .await
    .expect("the stream ends within a minute");
    assert_eq!(start.elapsed(), DEADLINE, "cut at exactly its deadline");
    let text = String::from_utf8(text.to_vec()).unwrap();
    let events: Vec<&str> = text.split("\n\n").filter(|e| !e.is_empty()).collect();
    assert_eq!(events.len(), 2, "{text}");
    assert!(events[0].contains("notifications/progress"), "{text}");
    assert!(
        events[1].contains("\"id\":1") && events[1].contains("deadline_exceeded"),
        "the stream ends with the refusal: {text}"
    );
    the_second_runs_now(&mut handle, second).await;
    assert_eq!(
        start.elapsed(),
        DEADLINE,
        "the second ran at the first's deadline"
    );
}

#[tokio::test(start_paused = true)]
async fn a_call_dropped_while_the_layer_waits_gives_its_place_to_the_next_at_once() {
    let start = Instant::now();
    let (stack, mut handle) = stack();
    let (first, _send, second) = one_running_one_waiting(&stack, &mut handle).await;
    // Its caller gives up before the deadline: its place is free then, not at the deadline.
    first.abort();
    assert!(first.await.unwrap_err().is_cancelled());
    the_second_runs_now(&mut handle, second).await;
    assert_eq!(
        start.elapsed(),
        Duration::from_secs(4),
        "at once, not at 5 s"
    );
}
