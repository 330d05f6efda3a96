//! Hostile and clumsy clients, driven through the real example server: nothing one client does
//! costs another anything, and every client-chosen string is bounded where it is kept.

mod common;

#[path = "../examples/mcp_server/app.rs"]
mod app;

use axum::body::Body;
use common::{message, session, tool_call};
use http::Request;
use serde_json::{Value, json};
use stormgate::control::Config;
use stormgate::valid::{AtLeastOne, Positive};
use tower::ServiceExt;

/// A POST of `body` on `session` that declares no protocol version (so a batch is read as one).
fn raw_post(session: &str, body: &Value) -> Request<Body> {
    Request::post("/mcp")
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("host", "localhost")
        .header("mcp-session-id", session)
        .body(Body::from(body.to_string()))
        .unwrap()
}

fn cache_get(id: usize) -> Value {
    json!({"jsonrpc":"2.0","id":id,"method":"tools/call",
        "params":{"name":"cache_get","arguments":{"key":"k"}}})
}

/// Whether an answer is a stormgate refusal (-32029, or 429 from 2026-07-28 on).
fn refused(msg: &Value) -> bool {
    msg["error"]["data"]["notProcessed"] == true
}

/// Sends `req` without waiting for its answer.
fn spawn_call(router: &axum::Router, req: Request<Body>) -> tokio::task::JoinHandle<Value> {
    let r = router.clone();
    tokio::spawn(async move { message(r.oneshot(req).await.unwrap()).await.0 })
}

/// How many of these calls were not refused.
async fn admitted(calls: Vec<tokio::task::JoinHandle<Value>>) -> usize {
    let mut admitted = 0;
    for c in calls {
        admitted += usize::from(!refused(&c.await.unwrap()));
    }
    admitted
}

/// Calls the server rejects without running them (a batch it does not take, calls on a session
/// it never issued) are given back every charge: afterwards a real session still has the whole
/// global budget and its own budget.
#[tokio::test(start_paused = true)]
async fn calls_the_server_rejects_unrun_leave_every_bucket_full() {
    let mut c = Config::default();
    // The global budget and the session's own hold 10 each; a tenant share holds 100 ms of
    // its rate, too little to count a burst with.
    c.features.tenant_budgets = false;
    c.budget.stable_budget = Positive::new(10.0).unwrap();
    c.budget.burst = Some(AtLeastOne::new(10.0).unwrap());
    c.sessions.base_budget = Positive::new(10.0).unwrap();
    c.sessions.burst = Positive::new(10.0).unwrap();
    let (router, _control) = app::protected(app::Backend::new(), c).unwrap();
    let sid = session(&router).await;
    // Off probation first (five healthy calls, paced), then every bucket full again.
    for i in 0..5 {
        let req = tool_call(&sid, 200 + i, "cache_get", json!({"key": "k"}));
        let (msg, _) = message(router.clone().oneshot(req).await.unwrap()).await;
        assert_eq!(msg["result"]["isError"], false, "{msg}");
        tokio::time::advance(std::time::Duration::from_millis(200)).await;
    }
    tokio::time::advance(std::time::Duration::from_secs(5)).await;
    let batch = Value::Array((0..100).map(cache_get).collect());
    for _ in 0..10 {
        let res = router
            .clone()
            .oneshot(raw_post(&sid, &batch))
            .await
            .unwrap();
        assert!(res.status().is_client_error(), "{}", res.status());
    }
    for i in 0..20 {
        let req = tool_call(&format!("bogus-{i}"), i, "cache_get", json!({"key": "k"}));
        let res = router.clone().oneshot(req).await.unwrap();
        assert_eq!(res.status(), 404);
    }
    // The whole bucket (10) is still there for the real session.
    for i in 0..10 {
        let req = tool_call(&sid, 100 + i, "cache_get", json!({"key": "k"}));
        let (msg, _) = message(router.clone().oneshot(req).await.unwrap()).await;
        assert!(!refused(&msg), "call {i}: {msg}");
        assert_eq!(msg["result"]["isError"], false, "{msg}");
    }
}

/// A runaway firing `sql_scan`s of ever-new tables and filters (cold, so 12x slower than the
/// warm queries the tool is known for) at 20 calls/s for 30 s, on one session or on a fresh
/// session per call (it re-initializes before every call). Returns the calls admitted, with
/// the example configuration as shipped.
async fn runaway(fresh_session_per_call: bool) -> usize {
    let config = Config::from_toml(include_str!("../examples/stormgate.toml")).unwrap();
    let backend = app::Backend::with_cache(
        std::time::Duration::from_millis(20),
        std::time::Duration::from_millis(240),
    );
    let (router, _control) = app::protected(backend, config).unwrap();
    // The tool's healthy time is learned first: a minute of warm scans of one table on
    // another session (the first scan of it is cold).
    let warm = session(&router).await;
    for i in 0..600 {
        let req = tool_call(&warm, i, "sql_scan", json!({"table": "orders"}));
        message(router.clone().oneshot(req).await.unwrap()).await;
        tokio::time::advance(std::time::Duration::from_millis(100)).await;
    }
    let mut sid = session(&router).await;
    let mut calls = Vec::new();
    for i in 0..600 {
        if fresh_session_per_call {
            sid = session(&router).await;
        }
        let args = json!({"table": format!("t{}", i % 97), "filter": format!("id > {i}")});
        calls.push(spawn_call(
            &router,
            tool_call(&sid, 1000 + i, "sql_scan", args),
        ));
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    admitted(calls).await
}

/// Re-initializing before every call buys a runaway nothing: a new session's first calls are
/// on probation and its tenant starts new sessions at a bounded rate.
#[tokio::test(start_paused = true)]
async fn a_fresh_session_per_call_is_no_escape_from_the_session_guard() {
    let one = runaway(false).await;
    let fresh = runaway(true).await;
    eprintln!("fresh session per call: {fresh} admitted; one session: {one}");
    assert!(
        fresh <= 2 * one,
        "fresh session per call: {fresh} admitted; one session: {one}"
    );
    assert!(one < 600, "the single-session runaway is cut: {one}");
}

/// Four real sessions, each calling at half its budget (every 200 ms) 40 times: how many of
/// their calls are refused, and how many the audit recorded.
async fn four_real_sessions(
    router: &axum::Router,
    control: &stormgate::control::Control,
) -> (usize, usize) {
    let mut sids = Vec::new();
    for _ in 0..4 {
        sids.push(session(router).await);
    }
    let mut refusals = 0;
    for round in 0..40 {
        for sid in &sids {
            let req = tool_call(sid, round, "cache_get", json!({"key": "k"}));
            let (msg, _) = message(router.clone().oneshot(req).await.unwrap()).await;
            refusals += usize::from(refused(&msg));
        }
        tokio::time::advance(std::time::Duration::from_millis(200)).await;
    }
    let audited = sids
        .iter()
        .map(|s| {
            control
                .audit()
                .invocations(&stormgate::SessionId::new(s.clone()))
                .len()
        })
        .filter(|&n| n > 0)
        .count();
    (refusals, audited)
}

/// A flood of calls on made-up session ids (the server answers 404) takes no session place and
/// no audit place: real sessions that start after it are treated as before it.
#[tokio::test(start_paused = true)]
async fn a_flood_of_made_up_session_ids_changes_nothing_for_real_sessions() {
    let mut c = Config::default();
    c.features.tenant_budgets = false;
    c.sessions.base_budget = Positive::new(10.0).unwrap();
    c.sessions.burst = Positive::new(10.0).unwrap();
    // A small table, so the flood is 20x what it holds (and twice the audit's places).
    c.sessions.max_sessions = std::num::NonZeroUsize::new(1000).unwrap();
    let (router, control) = app::protected(app::Backend::new(), c.clone()).unwrap();
    let before = four_real_sessions(&router, &control).await;
    assert_eq!(before, (0, 4));

    let (router, control) = app::protected(app::Backend::new(), c).unwrap();
    for i in 0..20_000u64 {
        let id = format!("{:032x}", i.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let req = tool_call(&id, 1, "cache_get", json!({"key": "k"}));
        let res = router.clone().oneshot(req).await.unwrap();
        assert_eq!(res.status(), 404);
    }
    assert_eq!(control.sessions().len(), 0, "no made-up id is tracked");
    assert_eq!(control.audit().len(), 0, "nor audited");
    let after = four_real_sessions(&router, &control).await;
    assert_eq!(
        after, before,
        "(refusals, sessions audited) after the flood"
    );
}

/// Forty new tenants, each offering far more than its share, admit no more than the global
/// budget and its burst in their first second: the guaranteed minimum is part of the budget.
#[tokio::test(start_paused = true)]
async fn new_tenants_do_not_overrun_the_global_budget() {
    use stormgate::admit::Admission;
    use stormgate::budget::Budget;
    // The example's budget (1000/s), tenants (a minimum of 20/s each) and tool weights.
    let c = Config::from_toml(include_str!("../examples/stormgate.toml")).unwrap();
    assert_eq!(c.budget.stable_budget, Positive::new(1000.0).unwrap());
    let budget = Budget::builder(c.budget)
        .tenants(c.tenants)
        .costs(c.costs)
        .build();
    let _ticker = budget.spawn_ticker();
    let calls: Vec<stormgate::Call> = (0..40)
        .map(|t| {
            stormgate::Call::request("tools/call")
                .with_tool("cache_get")
                .with_tenant(stormgate::Tenant::new(format!("tenant-{t}")))
        })
        .collect();
    let mut admitted = 0u64;
    // Every millisecond, each tenant tries five calls: 200 000 offered per second.
    for _ in 0..1000 {
        for c in &calls {
            for _ in 0..5 {
                admitted += u64::from(budget.admit(c).is_ok());
            }
        }
        tokio::time::advance(std::time::Duration::from_millis(1)).await;
    }
    // The budget (1000/s) and its burst (one second of it), whatever the number of tenants.
    eprintln!("{admitted} admitted in the first second");
    assert!(admitted <= 2000, "{admitted} admitted in the first second");
}

/// A thousand calls with 256 KiB tool names, half on a real session and half on made-up ids,
/// store nothing per name: no FIFO key, no session, no tool baseline; the audit keeps each
/// name as at most 128 bytes.
#[tokio::test(start_paused = true)]
async fn long_tool_names_are_not_stored() {
    let config = Config::from_toml(include_str!("../examples/stormgate.toml")).unwrap();
    let (router, control) = app::protected(app::Backend::new(), config).unwrap();
    let sid = session(&router).await;
    let keys = control.limiter().key_count();
    for i in 0..1000usize {
        let name = format!("{i}{}", "n".repeat(256 * 1024));
        let on = if i.is_multiple_of(2) {
            sid.clone()
        } else {
            format!("made-up-{i}")
        };
        let res = router
            .clone()
            .oneshot(tool_call(&on, i, &name, json!({})))
            .await
            .unwrap();
        common::body_bytes(res).await;
    }
    assert_eq!(control.limiter().key_count(), keys, "no FIFO key per name");
    assert_eq!(control.sessions().len(), 1, "only the real session");
    assert!(control.sessions().pools() <= 1);
    assert_eq!(control.audit().len(), 1);
    let log = control
        .audit()
        .invocations(&stormgate::SessionId::new(sid.clone()));
    assert!(!log.is_empty());
    assert!(
        log.iter()
            .all(|e| e.target.as_ref().is_some_and(|t| t.len() <= 128)),
        "names kept bounded"
    );
}

/// The same runaway on the session-less protocol, identified by a `_meta` key it chooses (or,
/// `by_token`, by the bearer token it presents): one run id for all its calls, or a fresh one
/// per call. Returns the calls admitted.
async fn session_less_runaway(fresh_id_per_call: bool, by_token: bool) -> usize {
    let mut config = Config::from_toml(include_str!("../examples/stormgate.toml")).unwrap();
    config.identity.session_meta_key = Some("agent_run".into());
    let backend = app::Backend::with_cache(
        std::time::Duration::from_millis(20),
        std::time::Duration::from_millis(240),
    );
    let (router, _control) = app::protected(backend, config).unwrap();
    let post = |run: String, id: usize, table: String, filter: String| {
        let mut meta = json!({
            "io.modelcontextprotocol/protocolVersion":"2026-07-28",
            "io.modelcontextprotocol/clientInfo":{"name":"runaway","version":"1"},
            "io.modelcontextprotocol/clientCapabilities":{}});
        if !by_token {
            meta["agent_run"] = json!(run);
        }
        let body = json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":{
            "name":"sql_scan","arguments":{"table": table, "filter": filter},
            "_meta": meta}});
        let token = format!("Bearer {run}");
        let request = Request::post("/mcp");
        let request = if by_token {
            request.header("authorization", token)
        } else {
            request
        };
        request
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("host", "localhost")
            .header("mcp-protocol-version", "2026-07-28")
            .header("mcp-method", "tools/call")
            .header("mcp-name", "sql_scan")
            .body(Body::from(body.to_string()))
            .unwrap()
    };
    // A minute of warm scans first, within the session budget (200/s, a scan costs 50).
    for i in 0..200 {
        let req = post("warm".into(), i, "orders".into(), "true".into());
        let (msg, _) = message(router.clone().oneshot(req).await.unwrap()).await;
        assert!(msg.get("result").is_some(), "{msg}");
        tokio::time::advance(std::time::Duration::from_millis(300)).await;
    }
    let mut calls = Vec::new();
    for i in 0..600 {
        let run = if fresh_id_per_call {
            format!("run-{i}")
        } else {
            "run".into()
        };
        let req = post(run, 1000 + i, format!("t{}", i % 97), format!("id > {i}"));
        calls.push(spawn_call(&router, req));
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    admitted(calls).await
}

/// [`session_less_runaway`] with a fresh identity per call and with one: the fresh one is
/// admitted at most twice as often, and the one is cut.
async fn no_escape(by_token: bool, what: &str) {
    let one = session_less_runaway(false, by_token).await;
    let fresh = session_less_runaway(true, by_token).await;
    eprintln!("fresh {what} per call: {fresh} admitted; one {what}: {one}");
    assert!(
        fresh <= 2 * one,
        "fresh {what} per call: {fresh} admitted; one {what}: {one}"
    );
    assert!(one < 600, "the runaway is cut: {one}");
}

/// A bearer token varied per call (minted tokens) is no better off than one kept: an unknown
/// token earns its own budget only once the server answered it, as a session id does.
#[tokio::test(start_paused = true)]
async fn a_fresh_token_per_call_is_no_escape() {
    no_escape(true, "token").await;
}

/// A self-declared identity varied per call is no better off than one kept.
#[tokio::test(start_paused = true)]
async fn a_fresh_self_declared_identity_per_call_is_no_escape() {
    no_escape(false, "id").await;
}

/// A body with a key twice is read as the servers that will run it read it: JSON.parse,
/// Python's json and serde_json's `Value` keep the last value. A duplicate `method` (or a
/// `params.name` twice, or a key spelled with an escape) is classified and charged like any
/// call, not forwarded unclassified past every stage to a server that runs it.
#[tokio::test(start_paused = true)]
async fn a_key_sent_twice_is_no_way_past_the_stack() {
    let mut c = Config::default();
    c.features.tenant_budgets = false;
    c.budget.stable_budget = Positive::new(1.0).unwrap();
    c.budget.burst = Some(AtLeastOne::new(1.0).unwrap());
    let control = stormgate::control::Control::new(c).unwrap();
    // A server that reads bodies as JSON.parse does (last value wins) and runs every call.
    let ran = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let server = {
        let ran = ran.clone();
        tower::service_fn(move |req: Request<Body>| {
            let ran = ran.clone();
            async move {
                let body = axum::body::to_bytes(req.into_body(), usize::MAX)
                    .await
                    .unwrap();
                let msg: Value = serde_json::from_slice(&body).unwrap();
                ran.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let answer = json!({"jsonrpc":"2.0","id":msg["id"],"result":{"content":[]}});
                Ok::<_, std::convert::Infallible>(
                    http::Response::builder()
                        .header("content-type", "application/json")
                        .body(Body::from(answer.to_string()))
                        .unwrap(),
                )
            }
        })
    };
    let svc = tower::Layer::layer(&control.layer(), server);
    let bodies = [
        r#"{"jsonrpc":"2.0","id":1,"method":"ping","method":"tools/call","params":{"name":"cache_get"}}"#,
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"cache_get","name":"sql_scan"}}"#,
        r#"{"jsonrpc":"2.0","id":3,"id":4,"method":"tools/call","params":{"name":"cache_get"}}"#,
        r#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"cache_get"},"params":{"name":"sql_scan"}}"#,
        r#"{"jsonrpc":"2.0","id":6,"\u006dethod":"tools/call","params":{"name":"cache_get"}}"#,
        r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"cache_get","arguments":{"k":1,"k":2}}}"#,
    ];
    let mut refusals = 0;
    for body in bodies {
        let req = Request::post("/mcp")
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(Body::from(body))
            .unwrap();
        let res = svc.clone().oneshot(req).await.unwrap();
        let (msg, _) = message(res).await;
        refusals += usize::from(refused(&msg));
    }
    // A bucket of one: the first call runs, every other is refused before the server.
    assert_eq!(ran.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert_eq!(refusals, bodies.len() - 1);
}
