//! The FIFO layer's release paths, one by one, around tower-test's mock service (paused time:
//! exact): a call's place in its resource's limit is given back when the call is answered,
//! when the service fails, when its response future is dropped while it waits, and when its
//! answer's body is dropped before its end; a call refused at the queue never reaches the
//! service, and an answer still streaming keeps its place.

mod common;

use std::num::NonZeroUsize;

use axum::body::Body;
use bytes::Bytes;
use common::{MockHandle, MockStack, answer, body_json, reached, scan};
use http::{Request, Response};
use stormgate::classify::ClassifyLayer;
use stormgate::fifo::{FifoLimitLayer, ResourceLimiter, ResourceLimits};
use tower::util::BoxCloneService;
use tower::{BoxError, ServiceBuilder};
use tower_test::mock;

/// The FIFO layer: `sql_scan` on key `db`, one call at a time, one more waiting.
fn fifo() -> FifoLimitLayer {
    let limiter = ResourceLimiter::builder()
        .key(
            "db",
            ResourceLimits::default()
                .max_concurrent(NonZeroUsize::MIN)
                .max_queue_depth(1),
        )
        .build();
    FifoLimitLayer::new(limiter).tool_key("sql_scan", "db")
}

/// Classification and [`fifo`] around the mock.
fn stack() -> (MockStack, MockHandle) {
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    let stack = ServiceBuilder::new()
        .layer(ClassifyLayer::new())
        .layer(fifo())
        .service(service);
    (BoxCloneService::new(stack), handle)
}

#[tokio::test(start_paused = true)]
async fn an_answered_call_gives_its_place_to_the_next_and_a_refused_one_never_runs() {
    let (stack, mut handle) = stack();
    let first = scan(&stack, 1);
    let (id, send) = reached(&mut handle).await.expect("the first runs");
    assert_eq!(id, 1);
    let second = scan(&stack, 2);
    assert!(reached(&mut handle).await.is_none(), "the second waits");
    // The queue holds one: the third is refused at once and never reaches the service.
    let third = body_json(scan(&stack, 3).await.unwrap().unwrap()).await;
    assert_eq!(third["error"]["data"]["reason"], "queue_full", "{third}");
    assert!(reached(&mut handle).await.is_none());

    send.send_response(answer(1));
    let done = body_json(first.await.unwrap().unwrap()).await;
    assert_eq!(done["id"], 1);
    let (id, send) = reached(&mut handle).await.expect("the second runs now");
    assert_eq!(id, 2);
    send.send_response(answer(2));
    assert_eq!(body_json(second.await.unwrap().unwrap()).await["id"], 2);
}

#[tokio::test(start_paused = true)]
async fn a_failed_call_gives_its_place_back() {
    let (stack, mut handle) = stack();
    let first = scan(&stack, 1);
    let (_, send) = reached(&mut handle).await.unwrap();
    let second = scan(&stack, 2);
    assert!(reached(&mut handle).await.is_none());
    send.send_error("the service failed");
    assert!(first.await.unwrap().is_err(), "the error is the caller's");
    let (id, send) = reached(&mut handle).await.expect("the second runs now");
    assert_eq!(id, 2);
    send.send_response(answer(2));
    second.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_call_dropped_while_it_waits_frees_its_place_and_never_runs() {
    let (stack, mut handle) = stack();
    let first = scan(&stack, 1);
    let (_, send) = reached(&mut handle).await.unwrap();
    let second = scan(&stack, 2);
    assert!(reached(&mut handle).await.is_none());
    // Its caller gives up: its place in the queue is free at once, so a third may wait.
    second.abort();
    assert!(second.await.unwrap_err().is_cancelled());
    let third = scan(&stack, 3);
    assert!(
        reached(&mut handle).await.is_none(),
        "the third waits, not refused"
    );
    send.send_response(answer(1));
    first.await.unwrap().unwrap();
    // The slot goes to the third: the dropped second never reaches the service.
    let (id, send) = reached(&mut handle).await.expect("the third runs");
    assert_eq!(id, 3);
    send.send_response(answer(3));
    assert_eq!(body_json(third.await.unwrap().unwrap()).await["id"], 3);
    assert!(reached(&mut handle).await.is_none());
}

#[tokio::test(start_paused = true)]
async fn an_answer_holds_its_place_while_it_streams_and_frees_it_when_dropped() {
    let (stack, mut handle) = stack();
    let first = scan(&stack, 1);
    let (_, send) = reached(&mut handle).await.unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, BoxError>>(1);
    let stream = futures::stream::unfold(rx, |mut rx| async { rx.recv().await.map(|c| (c, rx)) });
    send.send_response(Response::new(Body::from_stream(stream)));
    let response = first.await.unwrap().unwrap();
    tx.send(Ok(Bytes::from_static(b"{\"jsonrpc\":\"2.0\",")))
        .await
        .unwrap();

    // Its answer has begun, not ended: the call still holds the resource.
    let second = scan(&stack, 2);
    assert!(
        reached(&mut handle).await.is_none(),
        "an answer streaming holds its place"
    );
    // Its client goes away mid-answer: the place is free.
    drop(response);
    let (id, send) = reached(&mut handle).await.expect("the second runs now");
    assert_eq!(id, 2);
    send.send_response(answer(2));
    second.await.unwrap().unwrap();
}

/// A FIFO layer with no `ClassifyLayer` outside it cannot see a tool call: two scans on a key
/// of one place both reach the service at once, unlimited, and the misplaced stack says so,
/// once, in the log.
#[tokio::test(start_paused = true, flavor = "current_thread")]
async fn a_fifo_layer_without_classification_says_so_once() {
    let (logs, _guard) = common::Logs::capture();
    let (service, mut handle) = mock::pair::<Request<Body>, Response<Body>>();
    let bare: MockStack =
        BoxCloneService::new(ServiceBuilder::new().layer(fifo()).service(service));
    let (first, second) = (scan(&bare, 1), scan(&bare, 2));
    let (a, send_a) = reached(&mut handle).await.expect("the first scan ran");
    let (b, send_b) = reached(&mut handle)
        .await
        .expect("so did the second, unlimited");
    send_a.send_response(answer(a));
    send_b.send_response(answer(b));
    for sent in [first, second] {
        body_json(sent.await.unwrap().unwrap()).await;
    }
    let warned = logs.text().matches("no ClassifyLayer read").count();
    assert_eq!(warned, 1, "{}", logs.text());
    assert!(logs.text().contains("FifoLimitLayer"), "{}", logs.text());
}
