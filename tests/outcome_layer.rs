//! The outcome layer's release paths around tower-test's mock service: a call answered is
//! settled once with its outcome; one whose response future is dropped while it waits, or
//! whose answer is dropped before it ended, is settled cancelled; one the service fails is
//! settled as an error; in a batch, each call by its own answer.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use common::{body_json, request};
use futures::StreamExt;
use http::{Request, Response};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use stormgate::classify::ClassifyLayer;
use stormgate::outcome::{Observation, Observer, Outcome, OutcomeLayer};
use tower::util::BoxCloneService;
use tower::{BoxError, ServiceBuilder, ServiceExt};
use tower_test::mock;

type Stack = BoxCloneService<Request<Body>, Response<Body>, BoxError>;
type Handle = mock::Handle<Request<Body>, Response<Body>>;

/// Every call settled, as (id, outcome).
#[derive(Default)]
struct Settled(Mutex<Vec<(String, Outcome)>>);

impl Settled {
    fn all(&self) -> Vec<(String, Outcome)> {
        self.0.lock().unwrap().clone()
    }
}

impl Observer for Settled {
    fn observe(&self, o: &Observation<'_>) {
        let id = o
            .call
            .id
            .as_ref()
            .map_or("none", |i| i.as_json())
            .to_owned();
        self.0.lock().unwrap().push((id, o.outcome));
    }
}

/// Classification and the outcome layer around the mock; what it settled.
fn stack() -> (Stack, Handle, Arc<Settled>) {
    let settled = Arc::new(Settled::default());
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    let stack = ServiceBuilder::new()
        .layer(ClassifyLayer::new())
        .layer(OutcomeLayer::new([settled.clone() as Arc<dyn Observer>]))
        .service(service);
    (BoxCloneService::new(stack), handle, settled)
}

fn call(id: u64) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
           "params": {"name": "search", "arguments": {"q": id}}})
}

fn result(id: u64) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": {"content": []}})
}

fn json_response(body: Value) -> Response<Body> {
    Response::builder()
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap()
}

#[tokio::test]
async fn an_answered_call_is_settled_once_when_its_answer_passes() {
    let (stack, mut handle, settled) = stack();
    let sent = tokio::spawn(stack.oneshot(request(Some("s"), call(1))));
    let (_, send) = handle.next_request().await.expect("reached the service");
    send.send_response(json_response(result(1)));
    let response = sent.await.unwrap().unwrap();
    assert_eq!(settled.all(), [], "settled by the answer, not by its head");
    assert_eq!(body_json(response).await["id"], 1);
    assert_eq!(settled.all(), [("1".to_owned(), Outcome::Ok)]);
}

#[tokio::test]
async fn a_call_dropped_while_it_waits_is_settled_cancelled() {
    let (stack, mut handle, settled) = stack();
    let sent = tokio::spawn(stack.oneshot(request(Some("s"), call(1))));
    let (_, _send) = handle.next_request().await.expect("reached the service");
    sent.abort();
    let _ = sent.await;
    assert_eq!(settled.all(), [("1".to_owned(), Outcome::Cancelled)]);
}

#[tokio::test]
async fn a_call_whose_answer_is_dropped_before_it_ended_is_settled_cancelled() {
    let (stack, mut handle, settled) = stack();
    let sent = tokio::spawn(stack.oneshot(request(Some("s"), call(1))));
    let (_, send) = handle.next_request().await.expect("reached the service");
    // An SSE answer whose priming event came and whose result never does.
    let events = futures::stream::iter([Ok::<_, std::convert::Infallible>(Bytes::from_static(
        b"id: 0\ndata: \n\n",
    ))])
    .chain(futures::stream::pending());
    send.send_response(
        Response::builder()
            .header("content-type", "text/event-stream")
            .body(Body::from_stream(events))
            .unwrap(),
    );
    let mut body = sent.await.unwrap().unwrap().into_body();
    let first = body.frame().await.unwrap().unwrap();
    assert!(first.is_data());
    assert!(
        tokio::time::timeout(Duration::from_millis(20), body.frame())
            .await
            .is_err(),
        "the result never comes"
    );
    assert_eq!(settled.all(), []);
    drop(body);
    assert_eq!(settled.all(), [("1".to_owned(), Outcome::Cancelled)]);
}

#[tokio::test]
async fn a_call_the_service_fails_is_settled_as_an_error() {
    let (stack, mut handle, settled) = stack();
    let sent = tokio::spawn(stack.oneshot(request(Some("s"), call(1))));
    let (_, send) = handle.next_request().await.expect("reached the service");
    send.send_error(std::io::Error::other("upstream gone"));
    assert!(sent.await.unwrap().is_err());
    assert_eq!(settled.all(), [("1".to_owned(), Outcome::Error)]);
}

/// In a batch each call is settled by its own answer; one the answer left out is settled as an
/// error at its end; a notification is never settled.
#[tokio::test]
async fn a_batch_is_settled_call_by_call() {
    let (stack, mut handle, settled) = stack();
    let notification = json!({"jsonrpc": "2.0", "method": "notifications/progress"});
    let mut req = request(
        Some("s"),
        Value::Array(vec![call(1), notification, call(2), call(3)]),
    );
    req.headers_mut()
        .insert("mcp-protocol-version", "2025-03-26".parse().unwrap());
    let sent = tokio::spawn(stack.oneshot(req));
    let (_, send) = handle.next_request().await.expect("reached the service");
    let failed = json!({"jsonrpc": "2.0", "id": 3, "error": {"code": -32603, "message": "x"}});
    send.send_response(json_response(Value::Array(vec![failed, result(1)])));
    body_json(sent.await.unwrap().unwrap()).await;
    let mut all = settled.all();
    all.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        all,
        [
            ("1".to_owned(), Outcome::Ok),
            ("2".to_owned(), Outcome::Error),
            ("3".to_owned(), Outcome::Error),
        ]
    );
}
