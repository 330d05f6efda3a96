//! Outcome observation: JSON answers, SSE streams (split events, several events, keep-alive
//! comments), 5xx, isError, timeouts, and a client that goes away mid-stream.

mod common;

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::BodyExt;
use stormgate::classify::ClassifyLayer;
use stormgate::outcome::{Observation, Observer, Outcome, OutcomeLayer};
use tower::{Layer, ServiceExt};

/// Records `(id, outcome, service time)` of every observation.
#[derive(Default)]
struct Log(Mutex<Vec<(String, Outcome, Duration)>>);

impl Observer for Log {
    fn observe(&self, o: &Observation<'_>) {
        let id = o
            .call
            .id
            .as_ref()
            .map(|i| i.as_json().to_owned())
            .unwrap_or_default();
        self.0.lock().unwrap().push((id, o.outcome, o.service_time));
    }
}

impl Log {
    fn outcomes(&self) -> Vec<(String, Outcome)> {
        let mut v: Vec<_> = self
            .0
            .lock()
            .unwrap()
            .iter()
            .map(|(i, o, _)| (i.clone(), *o))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }
}

/// A body that yields its chunks one per poll, after `delay` each (paused time).
struct Chunks {
    chunks: VecDeque<Bytes>,
    delay: Duration,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl http_body::Body for Chunks {
    type Data = Bytes;
    type Error = std::convert::Infallible;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if self.chunks.is_empty() {
            return Poll::Ready(None);
        }
        let delay = self.delay;
        let sleep = self
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(delay)));
        if sleep.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        self.sleep = None;
        Poll::Ready(self.chunks.pop_front().map(|c| Ok(Frame::data(c))))
    }
}

fn answer(
    status: StatusCode,
    content_type: &str,
    chunks: &[&str],
    delay: Duration,
) -> Response<Body> {
    let body = Chunks {
        chunks: chunks.iter().map(|c| Bytes::from(c.to_string())).collect(),
        delay,
        sleep: None,
    };
    let mut res = Response::new(Body::new(body));
    *res.status_mut() = status;
    res.headers_mut()
        .insert("content-type", content_type.parse().unwrap());
    res
}

/// Sends `body` through classify + outcome to an inner service answering `res`, reads the
/// whole answer, and returns what was observed.
async fn observe(
    body: &str,
    res: impl Fn() -> Response<Body> + Clone + Send + 'static,
) -> (Arc<Log>, Bytes) {
    let log = Arc::new(Log::default());
    let inner = tower::service_fn(move |_req: Request<Body>| {
        let res = res.clone();
        async move { Ok::<_, std::convert::Infallible>(res()) }
    });
    let svc = ClassifyLayer::new()
        .layer(OutcomeLayer::new([log.clone() as Arc<dyn Observer>]).layer(inner));
    let out = svc
        .oneshot(
            Request::post("/mcp")
                .body(Body::from(body.to_owned()))
                .unwrap(),
        )
        .await
        .unwrap();
    let bytes = out.into_body().collect().await.unwrap().to_bytes();
    (log, bytes)
}

fn call(id: &str) -> String {
    format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"t"}}}}"#)
}

#[tokio::test(start_paused = true)]
async fn json_answers_ok_error_is_error_and_timeout() {
    for (reply, expected) in [
        (
            r#"{"jsonrpc":"2.0","id":1,"result":{"content":[],"isError":false}}"#,
            Outcome::Ok,
        ),
        (
            r#"{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"x"}],"isError":true}}"#,
            Outcome::Error,
        ),
        (
            r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32603,"message":"boom"}}"#,
            Outcome::Error,
        ),
        (
            r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32001,"message":"Request timed out"}}"#,
            Outcome::Timeout,
        ),
    ] {
        let (log, body) = observe(&call("1"), move || {
            answer(
                StatusCode::OK,
                "application/json",
                &[reply],
                Duration::from_millis(30),
            )
        })
        .await;
        assert_eq!(body, reply, "the answer passes unchanged");
        assert_eq!(log.outcomes(), [("1".to_owned(), expected)], "{reply}");
        assert_eq!(log.0.lock().unwrap()[0].2, Duration::from_millis(30));
    }
}

#[tokio::test(start_paused = true)]
async fn sse_events_split_across_chunks_with_keep_alives() {
    let chunks = [
        "data: \nid: 0\nretry: 3000\n\n",
        ": keep-alive\n\n",
        "data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{}}\n\n",
        "data: {\"jsonrpc\":\"2.0\",\"id\":\"a\",\"res",
        "ult\":{\"content\":[],\"isError\":false}}\n\n",
        "data: {\"jsonrpc\":\"2.0\",\"id\":2,\"result\":{\"isError\":true}}\n\n",
    ];
    let body = format!("[{},{}]", call(r#""a""#), call("2"));
    let (log, bytes) = observe(&body, move || {
        answer(
            StatusCode::OK,
            "text/event-stream",
            &chunks,
            Duration::from_millis(10),
        )
    })
    .await;
    assert_eq!(bytes, chunks.concat(), "nothing held back or changed");
    assert_eq!(
        log.outcomes(),
        [
            ("\"a\"".to_owned(), Outcome::Ok),
            ("2".to_owned(), Outcome::Error)
        ]
    );
    // Each call is settled when its own event passes: "a" by the 5th chunk, 2 by the 6th.
    let times: Vec<Duration> = log.0.lock().unwrap().iter().map(|e| e.2).collect();
    assert_eq!(
        times,
        [Duration::from_millis(50), Duration::from_millis(60)]
    );
}

#[tokio::test(start_paused = true)]
async fn server_errors_and_client_errors() {
    let (log, _) = observe(&call("1"), || {
        answer(
            StatusCode::BAD_GATEWAY,
            "text/plain",
            &["x"],
            Duration::ZERO,
        )
    })
    .await;
    assert_eq!(log.outcomes(), [("1".to_owned(), Outcome::Error)]);
    let (log, _) = observe(&call("1"), || {
        answer(
            StatusCode::NOT_FOUND,
            "text/plain",
            &["no session"],
            Duration::ZERO,
        )
    })
    .await;
    assert_eq!(log.outcomes(), [("1".to_owned(), Outcome::ClientError)]);
    assert!(!Outcome::ClientError.is_failure());
}

#[tokio::test(start_paused = true)]
async fn a_stream_that_ends_without_the_answer_is_an_error() {
    let (log, _) = observe(&call("1"), || {
        answer(
            StatusCode::OK,
            "text/event-stream",
            &[": only a comment\n\n"],
            Duration::ZERO,
        )
    })
    .await;
    assert_eq!(log.outcomes(), [("1".to_owned(), Outcome::Error)]);
}

#[tokio::test(start_paused = true)]
async fn a_client_that_disconnects_mid_stream_is_cancelled() {
    let log = Arc::new(Log::default());
    let inner = tower::service_fn(|_req: Request<Body>| async {
        Ok::<_, std::convert::Infallible>(answer(
            StatusCode::OK,
            "text/event-stream",
            &[
                "data: \n\n",
                "data: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n\n",
            ],
            Duration::from_millis(100),
        ))
    });
    let svc = ClassifyLayer::new()
        .layer(OutcomeLayer::new([log.clone() as Arc<dyn Observer>]).layer(inner));
    let res = svc
        .oneshot(Request::post("/mcp").body(Body::from(call("1"))).unwrap())
        .await
        .unwrap();
    let mut body = res.into_body();
    let first = body.frame().await.unwrap().unwrap();
    assert_eq!(first.into_data().unwrap(), "data: \n\n");
    assert!(log.outcomes().is_empty(), "not settled yet");
    drop(body); // the client goes away before the answer
    assert_eq!(log.outcomes(), [("1".to_owned(), Outcome::Cancelled)]);
}

#[tokio::test(start_paused = true)]
async fn notifications_are_not_observed() {
    let (log, _) = observe(
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        || {
            let mut r = Response::new(Body::empty());
            *r.status_mut() = StatusCode::ACCEPTED;
            r
        },
    )
    .await;
    assert!(log.outcomes().is_empty());
}

/// A sized answer (a `Full`, or hyper's `Incoming` with a Content-Length) says it has ended
/// after its last frame, and a server (hyper) stops polling it there, never asking for the
/// final `None`: the answer's outcome must be learned at that last frame all the same.
#[tokio::test(start_paused = true)]
async fn a_sized_answer_read_as_a_server_reads_it_is_observed() {
    let reply = r#"{"jsonrpc":"2.0","id":1,"result":{"content":[]}}"#;
    let log = Arc::new(Log::default());
    let inner = tower::service_fn(move |_req: Request<Body>| async move {
        let mut res = Response::new(Body::from(reply));
        res.headers_mut()
            .insert("content-type", "application/json".parse().unwrap());
        Ok::<_, std::convert::Infallible>(res)
    });
    let svc = ClassifyLayer::new()
        .layer(OutcomeLayer::new([log.clone() as Arc<dyn Observer>]).layer(inner));
    let out = svc
        .oneshot(Request::post("/mcp").body(Body::from(call("1"))).unwrap())
        .await
        .unwrap();
    let mut body = out.into_body();
    let mut read = Vec::new();
    // As hyper's server does: frames until the body says it has ended, then drop it.
    while !http_body::Body::is_end_stream(&body) {
        match body.frame().await {
            Some(frame) => read.extend_from_slice(&frame.unwrap().into_data().unwrap()),
            None => break,
        }
    }
    drop(body);
    assert_eq!(read, reply.as_bytes());
    assert_eq!(log.outcomes(), [("1".to_owned(), Outcome::Ok)]);
}

/// An outcome layer with no `ClassifyLayer` outside it sees no call, so its observers learn
/// nothing; the misplaced stack says so, once, in the log.
#[tokio::test(flavor = "current_thread")]
async fn an_outcome_layer_without_classification_says_so_once() {
    let (logs, _guard) = common::Logs::capture();
    let log = Arc::new(Log::default());
    let inner = tower::service_fn(|_req: Request<Body>| async {
        Ok::<_, std::convert::Infallible>(answer(
            StatusCode::OK,
            "application/json",
            &[r#"{"jsonrpc":"2.0","id":1,"result":{"content":[]}}"#],
            Duration::ZERO,
        ))
    });
    let svc = OutcomeLayer::new([log.clone() as Arc<dyn Observer>]).layer(inner);
    for _ in 0..2 {
        let req = Request::post("/mcp")
            .header("content-type", "application/json")
            .body(Body::from(
                r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t"}}"#,
            ))
            .unwrap();
        let res = svc.clone().oneshot(req).await.unwrap();
        res.into_body().collect().await.unwrap();
    }
    assert!(log.outcomes().is_empty());
    let text = logs.text();
    assert_eq!(text.matches("no ClassifyLayer read").count(), 1, "{text}");
    assert!(text.contains("OutcomeLayer"), "{text}");
}
