//! Idempotency keys through the example's whole stack (in process, paused time).

mod common;

#[path = "../examples/mcp_server/app.rs"]
mod app;

use axum::Router;
use axum::body::Body;
use common::message;
use http::Request;
use serde_json::{Value, json};
use stormgate::control::{Config, Control, IdentityConfig, Mode};
use stormgate::idempotency::Missing;
use stormgate::valid::Positive;
use tower::ServiceExt;

fn config() -> Config {
    let mut config = {
        let mut built = Config::default();
        built.identity = {
            let mut built = IdentityConfig::default();
            built.tenant_header = Some("x-tenant".into());
            built.session_meta_key = None;
            built
        };
        built.fixed.session_rate = Some(Positive::new(0.001).unwrap());
        built
    };
    config.idempotency.tools.insert("create_order".into());
    config.sessions.base_budget = Positive::new(1000.0).unwrap();
    config.sessions.burst = Positive::new(1000.0).unwrap();
    config
}

async fn open(router: &Router, tenant: &str) -> String {
    crate::common::session_as(router, Some(tenant)).await
}

fn post(tenant: &str, session: Option<&str>, body: Value) -> Request<Body> {
    crate::common::request_as(Some(tenant), session, body)
}

fn order(id: u64, key: Option<&str>) -> Value {
    let mut params = json!({"name": "create_order", "arguments": {"item": "gpu", "quantity": 1}});
    if let Some(k) = key {
        params["_meta"] = json!({"idempotency_key": k});
    }
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params})
}

async fn send(router: &Router, tenant: &str, session: &str, body: Value) -> Value {
    message(
        router
            .clone()
            .oneshot(post(tenant, Some(session), body))
            .await
            .unwrap(),
    )
    .await
    .0
}

fn text(msg: &Value) -> String {
    msg["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

fn stack() -> (Router, Control, std::sync::Arc<app::Backend>) {
    let backend = app::Backend::new();
    let (router, control) = app::protected(backend.clone(), config()).unwrap();
    (router, control, backend)
}

#[tokio::test(start_paused = true)]
async fn fifty_concurrent_duplicates_run_the_write_once() {
    let (router, _control, backend) = stack();
    let sid = open(&router, "acme").await;
    let calls: Vec<_> = (1..=50)
        .map(|i| {
            let r = router.clone();
            let s = sid.clone();
            tokio::spawn(async move { send(&r, "acme", &s, order(i, Some("order-7"))).await })
        })
        .collect();
    let mut answers = Vec::new();
    for (i, c) in calls.into_iter().enumerate() {
        let msg = c.await.unwrap();
        assert_eq!(
            msg["id"],
            i as u64 + 1,
            "each duplicate gets its own id back"
        );
        answers.push(text(&msg));
    }
    assert_eq!(backend.orders(), 1, "the tool ran once");
    assert!(
        answers.iter().all(|a| a == "order 1: 1 x gpu"),
        "{answers:?}"
    );

    // A retry after completion gets the kept answer without running again.
    let again = send(&router, "acme", &sid, order(99, Some("order-7"))).await;
    assert_eq!(
        (again["id"].clone(), text(&again)),
        (json!(99), "order 1: 1 x gpu".to_owned())
    );
    assert_eq!(backend.orders(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_refused_call_never_ran_so_its_retry_runs() {
    let (router, control, backend) = stack();
    let sid = open(&router, "acme").await;
    control.set_mode(Mode::Fixed); // one call per 1000 s per session
    let first = send(&router, "acme", &sid, order(1, Some("a"))).await;
    assert_eq!(text(&first), "order 1: 1 x gpu");
    let refused = send(&router, "acme", &sid, order(2, Some("b"))).await;
    assert_eq!(refused["error"]["data"]["reason"], "fixed_limit_exceeded");
    assert_eq!(backend.orders(), 1);
    control.set_mode(Mode::Adaptive);
    // The session's bucket refills (fixed mode had emptied it).
    tokio::time::advance(std::time::Duration::from_millis(10)).await;
    let retry = send(&router, "acme", &sid, order(3, Some("b"))).await;
    assert_eq!(text(&retry), "order 2: 1 x gpu", "the retry ran");
    assert_eq!(backend.orders(), 2);
}

#[tokio::test(start_paused = true)]
async fn tenants_do_not_share_keys_and_missing_keys_follow_the_setting() {
    let (router, control, backend) = stack();
    let a = open(&router, "tenant-a").await;
    let b = open(&router, "tenant-b").await;
    send(&router, "tenant-a", &a, order(1, Some("same"))).await;
    send(&router, "tenant-b", &b, order(2, Some("same"))).await;
    assert_eq!(backend.orders(), 2, "one key, two tenants: two writes");

    // Without a key: allowed by default, runs each time.
    send(&router, "tenant-a", &a, order(3, None)).await;
    assert_eq!(backend.orders(), 3);
    // Refused with a clear error when configured.
    let mut strict = control.config().as_ref().clone();
    strict.idempotency.missing = Missing::Reject;
    control.reload(strict).unwrap();
    let msg = send(&router, "tenant-a", &a, order(4, None)).await;
    assert_eq!(msg["id"], 4);
    assert_eq!(msg["error"]["code"], -32602);
    assert!(
        msg["error"]["message"]
            .as_str()
            .unwrap()
            .contains("idempotency_key"),
        "{msg}"
    );
    assert_eq!(backend.orders(), 3);
}

fn order_of(id: u64, item: &str, key: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
        "name": "create_order", "arguments": {"item": item, "quantity": 7},
        "_meta": {"idempotency_key": key}}})
}

#[tokio::test(start_paused = true)]
async fn keys_are_scoped_to_the_session_and_bound_to_the_arguments() {
    let (router, control, backend) = stack();
    let a = open(&router, "acme").await;
    let b = open(&router, "acme").await;
    let first = send(&router, "acme", &a, order_of(1, "secret-item-of-A", "k1")).await;
    assert_eq!(text(&first), "order 1: 7 x secret-item-of-A");
    // Another client of the same tenant, same key, its own order: it runs, and it never sees
    // A's answer (before: it got "order 1: 7 x secret-item-of-A" and its order never ran).
    let other = send(&router, "acme", &b, order_of(2, "pen", "k1")).await;
    assert_eq!(text(&other), "order 2: 7 x pen", "{other}");
    assert_eq!(backend.orders(), 2);
    // The same session reusing its key with other arguments: refused, nothing runs.
    let reused = send(&router, "acme", &a, order_of(3, "pen", "k1")).await;
    assert_eq!(reused["error"]["code"], -32602, "{reused}");
    assert_eq!(
        reused["error"]["message"],
        "idempotency key reused with different arguments"
    );
    assert_eq!(reused["id"], 3);
    assert_eq!(backend.orders(), 2, "nothing ran");
    // A true replay still gets its own answer.
    let replay = send(&router, "acme", &a, order_of(4, "secret-item-of-A", "k1")).await;
    assert_eq!(text(&replay), "order 1: 7 x secret-item-of-A");
    assert_eq!(backend.orders(), 2);

    // With scope = "tenant", a retry on a new session replays the tenant's answer.
    let mut config = Config::clone(&control.config());
    config.idempotency.scope = stormgate::idempotency::KeyScope::Tenant;
    control.reload(config).unwrap();
    let c = open(&router, "acme").await;
    send(&router, "acme", &a, order_of(5, "ink", "k2")).await;
    let retried = send(&router, "acme", &c, order_of(6, "ink", "k2")).await;
    assert_eq!(text(&retried), "order 3: 7 x ink");
    assert_eq!(backend.orders(), 3);
}

/// A keyed write whose answer is past what the layer keeps (1 MiB): its client gets the whole
/// answer, a duplicate is told the call already ran, and the write never runs twice.
#[tokio::test(start_paused = true)]
async fn an_answer_too_large_to_keep_is_not_replayed_and_never_run_twice() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let server = move |body: bytes::Bytes| {
        let runs = counted.clone();
        async move {
            let text = String::from_utf8_lossy(&body).into_owned();
            let json = |body: String| {
                http::Response::builder()
                    .header("content-type", "application/json")
                    .header("mcp-session-id", "s-1")
                    .body(Body::from(body))
                    .unwrap()
            };
            if text.contains("\"initialize\"") {
                return json(
                    r#"{"jsonrpc":"2.0","id":0,"result":{"protocolVersion":"2025-11-25","capabilities":{},"serverInfo":{"name":"x","version":"1"}}}"#
                        .into(),
                );
            }
            if !text.contains("tools/call") {
                return http::Response::builder()
                    .status(202)
                    .body(Body::empty())
                    .unwrap();
            }
            runs.fetch_add(1, Ordering::SeqCst);
            let id: Value = serde_json::from_str::<Value>(&text).unwrap()["id"].clone();
            let big = "x".repeat(2 << 20);
            json(
                json!({"jsonrpc":"2.0","id":id,"result":{"content":[{"type":"text","text":big}]}})
                    .to_string(),
            )
        }
    };
    let mut config = config();
    config.idempotency.tools.insert("export".into());
    let control = Control::new(config).unwrap();
    let router = control.wrap(Router::new().route("/mcp", axum::routing::post(server)));
    let sid = open(&router, "acme").await;
    let call = |id: u64| {
        json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":{"name":"export",
            "arguments":{},"_meta":{"idempotency_key":"k"}}})
    };
    let first = send(&router, "acme", &sid, call(1)).await;
    assert_eq!(
        text(&first).len(),
        2 << 20,
        "the first client gets its whole answer"
    );
    let duplicate = send(&router, "acme", &sid, call(2)).await;
    assert_eq!(duplicate["id"], 2);
    assert_eq!(duplicate["error"]["code"], -32603, "{duplicate}");
    assert!(
        duplicate["error"]["message"]
            .as_str()
            .unwrap()
            .contains("already ran"),
        "{duplicate}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the write ran once");
}

/// An idempotency layer with no `ClassifyLayer` outside it sees no call: the same order with
/// the same key runs twice, and the misplaced stack says so, once, in the log.
#[tokio::test(flavor = "current_thread")]
async fn an_idempotency_layer_without_classification_says_so_once() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use stormgate::idempotency::{IdempotencyConfig, IdempotencyLayer};
    use tower::Layer;

    let (logs, _guard) = common::Logs::capture();
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let inner = tower::service_fn(move |_req: Request<Body>| {
        counted.fetch_add(1, Ordering::SeqCst);
        async {
            Ok::<_, std::convert::Infallible>(
                http::Response::builder()
                    .header("content-type", "application/json")
                    .body(Body::from(
                        r#"{"jsonrpc":"2.0","id":1,"result":{"content":[]}}"#,
                    ))
                    .unwrap(),
            )
        }
    });
    let mut config = IdempotencyConfig::default();
    config.tools.insert("create_order".into());
    let svc = IdempotencyLayer::new(config).unwrap().layer(inner);
    for _ in 0..2 {
        let req = Request::post("/mcp")
            .header("content-type", "application/json")
            .header("idempotency-key", "k1")
            .body(Body::from(order(1, Some("k1")).to_string()))
            .unwrap();
        svc.clone().oneshot(req).await.unwrap();
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "not deduplicated: no call was seen"
    );
    let text = logs.text();
    assert_eq!(text.matches("no ClassifyLayer read").count(), 1, "{text}");
    assert!(text.contains("IdempotencyLayer"), "{text}");
}
