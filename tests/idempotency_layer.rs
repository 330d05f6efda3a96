//! The idempotency layer's release paths, one by one, around tower-test's mock service (paused
//! time: exact): a key's first call dropped while it runs keeps nothing, so its retry runs; a
//! duplicate dropped while it waits for the first leaves the first's answer kept for later
//! duplicates; the first dropped while a duplicate waits lets the duplicate run in its place;
//! a service error keeps nothing; an answer dropped mid-stream is kept only if its message
//! passed.

mod common;

use axum::body::Body;
use common::{body_json, reached, request};
use http::{Request, Response};
use serde_json::json;
use stormgate::classify::ClassifyLayer;
use stormgate::idempotency::{IdempotencyConfig, IdempotencyLayer};
use tower::util::BoxCloneService;
use tower::{BoxError, ServiceBuilder, ServiceExt};
use tower_test::mock;

type Stack = BoxCloneService<Request<Body>, Response<Body>, BoxError>;
type Handle = mock::Handle<Request<Body>, Response<Body>>;
type Answer = tokio::task::JoinHandle<Result<Response<Body>, BoxError>>;

/// Classification and the idempotency layer (`create_order` listed) around the mock.
fn stack() -> (Stack, Handle) {
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    let mut config = IdempotencyConfig::default();
    config.tools = ["create_order".to_owned()].into();
    let stack = ServiceBuilder::new()
        .layer(ClassifyLayer::new())
        .layer(IdempotencyLayer::new(config).unwrap())
        .service(service);
    (BoxCloneService::new(stack), handle)
}

/// Sends call `id` of `create_order` with idempotency key `k1` through `stack` on its own
/// task.
fn order(stack: &Stack, id: u64) -> Answer {
    let req = request(
        Some("s"),
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
               "params": {"name": "create_order", "arguments": {"item": "a"},
                          "_meta": {"idempotency_key": "k1"}}}),
    );
    tokio::spawn(stack.clone().oneshot(req))
}

/// A whole JSON-RPC answer to `id`, its result naming the order.
fn answer(id: u64) -> Response<Body> {
    let body = json!({"jsonrpc": "2.0", "id": id,
                      "result": {"content": [{"type": "text", "text": "order 7"}], "isError": false}});
    Response::builder()
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn an_answered_call_is_kept_and_a_duplicate_never_runs() {
    let (stack, mut handle) = stack();
    let first = order(&stack, 1);
    let (id, send) = reached(&mut handle).await.expect("the first runs");
    assert_eq!(id, 1);
    send.send_response(answer(1));
    assert_eq!(body_json(first.await.unwrap().unwrap()).await["id"], 1);
    let again = body_json(order(&stack, 2).await.unwrap().unwrap()).await;
    assert_eq!(again["id"], 2, "replayed with its own id");
    assert_eq!(again["result"]["content"][0]["text"], "order 7", "{again}");
    assert!(
        reached(&mut handle).await.is_none(),
        "the duplicate never ran"
    );
}

#[tokio::test(start_paused = true)]
async fn a_first_call_dropped_while_it_runs_keeps_nothing_and_its_retry_runs() {
    let (stack, mut handle) = stack();
    let first = order(&stack, 1);
    let (_, send) = reached(&mut handle).await.expect("the first runs");
    first.abort();
    assert!(first.await.unwrap_err().is_cancelled());
    drop(send);
    let retry = order(&stack, 2);
    let (id, send) = reached(&mut handle).await.expect("the retry runs");
    assert_eq!(id, 2);
    send.send_response(answer(2));
    assert_eq!(body_json(retry.await.unwrap().unwrap()).await["id"], 2);
}

#[tokio::test(start_paused = true)]
async fn a_duplicate_dropped_while_it_waits_leaves_the_first_answer_kept() {
    let (stack, mut handle) = stack();
    let first = order(&stack, 1);
    let (_, send) = reached(&mut handle).await.expect("the first runs");
    let waiting = order(&stack, 2);
    assert!(reached(&mut handle).await.is_none(), "the duplicate waits");
    waiting.abort();
    assert!(waiting.await.unwrap_err().is_cancelled());
    send.send_response(answer(1));
    assert_eq!(body_json(first.await.unwrap().unwrap()).await["id"], 1);
    let later = body_json(order(&stack, 3).await.unwrap().unwrap()).await;
    assert_eq!(later["id"], 3);
    assert_eq!(later["result"]["content"][0]["text"], "order 7", "{later}");
    assert!(reached(&mut handle).await.is_none(), "nothing ran twice");
}

#[tokio::test(start_paused = true)]
async fn a_first_call_dropped_while_a_duplicate_waits_lets_the_duplicate_run() {
    let (stack, mut handle) = stack();
    let first = order(&stack, 1);
    let (_, send) = reached(&mut handle).await.expect("the first runs");
    let waiting = order(&stack, 2);
    assert!(reached(&mut handle).await.is_none(), "the duplicate waits");
    first.abort();
    assert!(first.await.unwrap_err().is_cancelled());
    drop(send);
    let (id, send) = reached(&mut handle)
        .await
        .expect("the duplicate runs in its place");
    assert_eq!(id, 2);
    send.send_response(answer(2));
    assert_eq!(body_json(waiting.await.unwrap().unwrap()).await["id"], 2);
}

#[tokio::test(start_paused = true)]
async fn a_service_error_keeps_nothing_and_the_retry_runs() {
    let (stack, mut handle) = stack();
    let first = order(&stack, 1);
    let (_, send) = reached(&mut handle).await.expect("the first runs");
    send.send_error("the service failed");
    assert!(first.await.unwrap().is_err(), "the error is the caller's");
    let retry = order(&stack, 2);
    let (id, send) = reached(&mut handle).await.expect("the retry runs");
    assert_eq!(id, 2);
    send.send_response(answer(2));
    assert_eq!(body_json(retry.await.unwrap().unwrap()).await["id"], 2);
}

/// An answer streamed as rmcp streams it (SSE), fed one chunk at a time by the test.
fn streamed() -> (
    tokio::sync::mpsc::Sender<Result<bytes::Bytes, BoxError>>,
    Response<Body>,
) {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<bytes::Bytes, BoxError>>(4);
    let stream = futures::stream::unfold(rx, |mut rx| async { rx.recv().await.map(|c| (c, rx)) });
    let response = Response::builder()
        .header("content-type", "text/event-stream")
        .body(Body::from_stream(stream))
        .unwrap();
    (tx, response)
}

/// The first call's answer dropped mid-stream, before its message passed: nothing whole was
/// kept, so the key is free and the retry runs. Dropped after its message passed (the stream
/// still open): the answer is kept, and a duplicate is replayed without running.
#[tokio::test(start_paused = true)]
async fn an_answer_dropped_mid_stream_is_kept_only_if_its_message_passed() {
    let (stack, mut handle) = stack();
    let first = order(&stack, 1);
    let (_, send) = reached(&mut handle).await.expect("the first runs");
    let (tx, response) = streamed();
    send.send_response(response);
    let response = first.await.unwrap().unwrap();
    tx.send(Ok(bytes::Bytes::from_static(
        b"data: {\"jsonrpc\":\"2.0\",\"id\":1,",
    )))
    .await
    .unwrap();
    drop(response);
    assert!(tx.is_closed(), "the answer was dropped mid-stream");
    let retry = order(&stack, 2);
    let (id, send) = reached(&mut handle)
        .await
        .expect("nothing kept: the retry runs");
    assert_eq!(id, 2);

    let (tx, response) = streamed();
    send.send_response(response);
    let response = retry.await.unwrap().unwrap();
    let message = json!({"jsonrpc": "2.0", "id": 2,
                         "result": {"content": [{"type": "text", "text": "order 8"}]}});
    tx.send(Ok(format!("data: {message}\n\n").into()))
        .await
        .unwrap();
    let mut body = response.into_body();
    let frame = http_body_util::BodyExt::frame(&mut body).await;
    assert!(frame.is_some_and(|f| f.is_ok()), "the message passed");
    drop(body);
    let again = body_json(order(&stack, 3).await.unwrap().unwrap()).await;
    assert_eq!(again["id"], 3, "replayed with its own id");
    assert_eq!(again["result"]["content"][0]["text"], "order 8", "{again}");
    assert!(
        reached(&mut handle).await.is_none(),
        "the duplicate never ran"
    );
}
