//! The admission layer's release paths around tower-test's mock service: an admitted call
//! reaches the service and keeps its charge; a refused one never reaches it and is answered;
//! a call a later stage refuses gets back what every earlier stage charged it; a batch is
//! charged, refused and given back per call; a call dropped while it waits for the service is
//! never charged, and one dropped after it reached the service, or mid-answer, keeps its charge.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::body::Body;
use common::{body_json, request};
use http::{Request, Response};
use serde_json::{Value, json};
use stormgate::admit::{Admission, AdmitLayer};
use stormgate::classify::ClassifyLayer;
use stormgate::{Call, Reason, Rejection, Scope};
use tower::util::BoxCloneService;
use tower::{BoxError, ServiceBuilder, ServiceExt};
use tower_test::mock;

type Stack = BoxCloneService<Request<Body>, Response<Body>, BoxError>;
type Handle = mock::Handle<Request<Body>, Response<Body>>;

/// A bucket of `units` calls: each admitted call takes one, a refund gives it back.
#[derive(Clone)]
struct Units(Arc<AtomicU64>);

impl Units {
    fn left(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

impl Admission for Units {
    type Permit = ();

    fn admit(&self, _: &Call) -> Result<(), Rejection> {
        self.0
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .map(drop)
            .map_err(|_| {
                Rejection::new(
                    Reason::SessionBudgetExceeded,
                    Scope::AgentSession,
                    Duration::from_secs(1),
                )
            })
    }

    fn refund(&self, (): ()) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// Classification, then `first` and `second` as admission layers, around the mock.
fn stack(first: &Units, second: &Units) -> (Stack, Handle) {
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    let stack = ServiceBuilder::new()
        .layer(ClassifyLayer::new())
        .layer(AdmitLayer::new(first.clone()))
        .layer(AdmitLayer::new(second.clone()))
        .service(service);
    (BoxCloneService::new(stack), handle)
}

fn units(n: u64) -> Units {
    Units(Arc::new(AtomicU64::new(n)))
}

fn call(id: u64) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
           "params": {"name": "search", "arguments": {"q": id}}})
}

/// Answers the next request the mock receives with a result for each of `ids`.
async fn answer(handle: &mut Handle, ids: &[u64]) {
    let (_, send) = handle
        .next_request()
        .await
        .expect("a request reached the service");
    let results: Vec<Value> = ids
        .iter()
        .map(|id| json!({"jsonrpc": "2.0", "id": id, "result": {"content": []}}))
        .collect();
    let body = if results.len() == 1 {
        results[0].clone()
    } else {
        Value::Array(results)
    };
    let response = Response::builder()
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap();
    send.send_response(response);
}

#[tokio::test]
async fn an_admitted_call_keeps_its_charge_and_a_refused_one_never_runs() {
    let (first, second) = (units(1), units(10));
    let (stack, mut handle) = stack(&first, &second);
    let admitted = tokio::spawn(stack.clone().oneshot(request(Some("s"), call(1))));
    answer(&mut handle, &[1]).await;
    assert_eq!(body_json(admitted.await.unwrap().unwrap()).await["id"], 1);
    assert_eq!(
        (first.left(), second.left()),
        (0, 9),
        "both charged; it ran"
    );

    // The first stage is spent: refused there, answered at once, never sent on.
    let refused = body_json(
        stack
            .clone()
            .oneshot(request(Some("s"), call(2)))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(
        refused["error"]["data"]["reason"], "session_budget_exceeded",
        "{refused}"
    );
    handle.allow(0);
    assert!(
        tokio::time::timeout(Duration::from_millis(50), handle.next_request())
            .await
            .is_err(),
        "the refused call reached the service"
    );
    assert_eq!((first.left(), second.left()), (0, 9), "nothing charged");
}

#[tokio::test]
async fn a_call_a_later_stage_refuses_gets_back_what_the_earlier_charged() {
    let (first, second) = (units(5), units(0));
    let (stack, _handle) = stack(&first, &second);
    let refused = body_json(stack.oneshot(request(Some("s"), call(1))).await.unwrap()).await;
    assert_eq!(
        refused["error"]["data"]["reason"],
        "session_budget_exceeded"
    );
    assert_eq!(first.left(), 5, "the first stage's charge was given back");
}

#[tokio::test]
async fn a_batch_is_charged_refused_and_given_back_per_call() {
    // The first stage admits all three; the second only two: the third is refused there,
    // its charge at the first given back, and the two others run.
    let (first, second) = (units(3), units(2));
    let (stack, mut handle) = stack(&first, &second);
    let batch = Value::Array(vec![call(1), call(2), call(3)]);
    let mut req = request(Some("s"), batch);
    // Batches exist in MCP 2025-03-26.
    req.headers_mut()
        .insert("mcp-protocol-version", "2025-03-26".parse().unwrap());
    let answered = tokio::spawn(stack.oneshot(req));
    answer(&mut handle, &[1, 2]).await;
    let answers = body_json(answered.await.unwrap().unwrap()).await;
    let answers = answers.as_array().expect("a batch answer");
    assert_eq!(answers.len(), 3, "{answers:?}");
    let refused: Vec<&Value> = answers
        .iter()
        .filter(|a| a.get("error").is_some())
        .collect();
    assert_eq!(refused.len(), 1, "{answers:?}");
    assert_eq!(refused[0]["id"], 3);
    assert_eq!(
        (first.left(), second.left()),
        (1, 0),
        "two ran; the third's charge came back"
    );
}

/// An admission layer with no `ClassifyLayer` outside it cannot see a call: the POST is let
/// through unchecked and nothing is charged, and the misplaced stack says so, once, in the log.
/// Behind a classify layer, neither a POST that is not JSON-RPC nor a GET is taken for one.
#[tokio::test(flavor = "current_thread")]
async fn an_admission_layer_without_classification_says_so_once() {
    let (logs, _guard) = common::Logs::capture();
    let warning = "no ClassifyLayer read";
    let unseen = units(5);
    let (service, mut handle) = mock::pair::<Request<Body>, Response<Body>>();
    let bare: Stack = BoxCloneService::new(
        ServiceBuilder::new()
            .layer(AdmitLayer::new(unseen.clone()))
            .service(service),
    );
    for id in 1..=2 {
        let sent = tokio::spawn(bare.clone().oneshot(request(Some("s"), call(id))));
        answer(&mut handle, &[id]).await;
        assert_eq!(body_json(sent.await.unwrap().unwrap()).await["id"], id);
    }
    assert_eq!(unseen.left(), 5, "nothing charged: no call was seen");
    assert_eq!(logs.text().matches(warning).count(), 1, "{}", logs.text());

    let (first, second) = (units(5), units(5));
    let (classified, mut handle) = stack(&first, &second);
    let not_rpc = Request::post("/mcp")
        .header("content-type", "application/json")
        .body(Body::from("not json"))
        .unwrap();
    let get = Request::get("/mcp").body(Body::empty()).unwrap();
    for req in [not_rpc, get] {
        let sent = tokio::spawn(classified.clone().oneshot(req));
        let (_, send) = handle.next_request().await.expect("passed on");
        send.send_response(Response::new(Body::empty()));
        sent.await.unwrap().unwrap();
    }
    assert_eq!(logs.text().matches(warning).count(), 1, "{}", logs.text());
}

/// Two admissions as one stage (a tuple): a call the second refuses gets its unit at the first
/// back at once, and a call that ran keeps both charges; a batch the same, per call.
#[tokio::test]
async fn a_tuple_of_admissions_is_one_stage_charging_all_or_none() {
    let (first, second) = (units(3), units(2));
    let (service, mut handle) = mock::pair::<Request<Body>, Response<Body>>();
    let stack: Stack = BoxCloneService::new(
        ServiceBuilder::new()
            .layer(ClassifyLayer::new())
            .layer(AdmitLayer::new((first.clone(), second.clone())))
            .service(service),
    );
    let batch = Value::Array(vec![call(1), call(2), call(3)]);
    let mut req = request(Some("s"), batch);
    req.headers_mut()
        .insert("mcp-protocol-version", "2025-03-26".parse().unwrap());
    let answered = tokio::spawn(stack.clone().oneshot(req));
    answer(&mut handle, &[1, 2]).await;
    let answers = body_json(answered.await.unwrap().unwrap()).await;
    let refused: Vec<&Value> = answers
        .as_array()
        .expect("a batch answer")
        .iter()
        .filter(|a| a.get("error").is_some())
        .collect();
    assert_eq!(refused.len(), 1, "{answers}");
    assert_eq!(refused[0]["id"], 3);
    assert_eq!(
        refused[0]["error"]["data"]["reason"],
        "session_budget_exceeded"
    );
    assert_eq!(
        (first.left(), second.left()),
        (1, 0),
        "two ran, charged by both; the third's unit at the first came back"
    );
    let refused = body_json(stack.oneshot(request(Some("s"), call(4))).await.unwrap()).await;
    assert!(refused.get("error").is_some(), "{refused}");
    assert_eq!(
        (first.left(), second.left()),
        (1, 0),
        "refused by the second: the first's charge given back at once"
    );
}

/// A call dropped while the service behind is not ready was never admitted: nothing charged,
/// nothing sent, and the next call runs once the service is ready. A call dropped after it
/// reached the service keeps its charge (the work was started), and so does one whose answer
/// is dropped while it streams.
#[tokio::test]
async fn a_call_dropped_while_waiting_is_never_charged_and_one_dropped_running_keeps_its_charge() {
    let (first, second) = (units(5), units(5));
    let (stack, mut handle) = stack(&first, &second);

    handle.allow(0);
    let waiting = tokio::spawn(stack.clone().oneshot(request(Some("s"), call(1))));
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert!(!waiting.is_finished(), "it waits for the service");
    assert_eq!((first.left(), second.left()), (5, 5), "nothing charged yet");
    waiting.abort();
    assert!(waiting.await.unwrap_err().is_cancelled());
    assert_eq!((first.left(), second.left()), (5, 5), "nothing charged");

    handle.allow(2);
    let running = tokio::spawn(stack.clone().oneshot(request(Some("s"), call(2))));
    let (seen, _send) = handle.next_request().await.expect("it reached the service");
    let seen = http_body_util::BodyExt::collect(seen.into_body())
        .await
        .unwrap()
        .to_bytes();
    let seen: Value = serde_json::from_slice(&seen).unwrap();
    assert_eq!(seen["id"], 2, "the dropped call never reached the service");
    running.abort();
    assert!(running.await.unwrap_err().is_cancelled());
    assert_eq!((first.left(), second.left()), (4, 4), "it ran: charged");

    let streaming = tokio::spawn(stack.oneshot(request(Some("s"), call(3))));
    let (_, send) = handle.next_request().await.expect("it reached the service");
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<bytes::Bytes, BoxError>>(1);
    let stream = futures::stream::unfold(rx, |mut rx| async { rx.recv().await.map(|c| (c, rx)) });
    send.send_response(
        Response::builder()
            .header("content-type", "application/json")
            .body(Body::from_stream(stream))
            .unwrap(),
    );
    let response = streaming.await.unwrap().unwrap();
    tx.send(Ok(bytes::Bytes::from_static(b"{\"jsonrpc\":\"2.0\",")))
        .await
        .unwrap();
    drop(response);
    assert!(tx.is_closed(), "the answer was dropped mid-stream");
    assert_eq!((first.left(), second.left()), (3, 3), "it ran: charged");
}
