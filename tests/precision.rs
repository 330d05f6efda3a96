//! Precision: healthy clients are never refused with no configuration at all (fast, bursty,
//! new, or with a few tool errors), a fresh server admits a calm newcomer's first call of
//! every tool with the example configuration, and a burst refused together that waits its
//! hints is admitted on its second try. The whole stack in process around the example's real
//! rmcp server (or a plain handler where a tool must fail on demand), on paused time.

mod common;

#[path = "../examples/mcp_server/app.rs"]
mod app;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use stormgate::valid::{Fraction, Positive};

use axum::Router;
use axum::body::Body;
use futures::future::join_all;
use serde_json::{Value, json};
use stormgate::SessionId;
use stormgate::control::{Config, Control};
use tower::ServiceExt;

/// The example server behind the whole stack with `config`, its background tasks running as
/// a server's do (the budget's ticker moves the fair levels and the adaptive budget).
fn stack(config: Config) -> (Router, Control) {
    let (router, control) = app::protected(app::Backend::new(), config).unwrap();
    // Dropping the handles detaches the tasks; they stop with the last handle of the stack.
    let _ = control.spawn();
    (router, control)
}

/// A call's answer: the message, and the refusal's reason and wait if it was refused.
async fn call(router: &Router, session: &str, id: usize, tool: &str, args: Value) -> Value {
    let res = router
        .clone()
        .oneshot(common::tool_call(session, id, tool, args))
        .await
        .unwrap();
    common::message(res).await.0
}

/// `n` calls of `tool` on `session`, one every `every` of the paused clock, with the arguments
/// `args(i)`: the refusals.
async fn sequential(
    router: &Router,
    session: &str,
    n: usize,
    every: Duration,
    tool: &str,
    args: impl Fn(usize) -> Value,
) -> Vec<(String, u64)> {
    let mut refusals = Vec::new();
    for i in 0..n {
        refusals.extend(refused(&call(router, session, i, tool, args(i)).await));
        tokio::time::advance(every).await;
    }
    refusals
}

fn refused(message: &Value) -> Option<(String, u64)> {
    let data = &message["error"]["data"];
    let reason = data["reason"].as_str()?.to_owned();
    Some((reason, data["retry_after_ms"].as_u64().unwrap()))
}

#[tokio::test(start_paused = true)]
async fn a_fast_sequential_client_is_never_refused_with_no_configuration() {
    let (router, _control) = stack(Config::default());
    let session = common::session(&router).await;
    let refusals = sequential(
        &router,
        &session,
        100,
        Duration::from_millis(5),
        "cache_get",
        |i| json!({"key": format!("k{i}")}),
    )
    .await;
    assert_eq!(refusals, [], "100 calls, one every 5 ms");
}

#[tokio::test(start_paused = true)]
async fn twenty_concurrent_calls_of_a_new_client_are_never_refused_with_no_configuration() {
    let (router, _control) = stack(Config::default());
    let session = common::session(&router).await;
    let answers = join_all((0..20).map(|i| {
        let (router, session) = (router.clone(), session.clone());
        async move {
            call(
                &router,
                &session,
                i,
                "cache_get",
                json!({"key": i.to_string()}),
            )
            .await
        }
    }))
    .await;
    let refusals: Vec<_> = answers.iter().filter_map(refused).collect();
    assert_eq!(refusals, [], "20 concurrent calls");
}

#[tokio::test(start_paused = true)]
async fn eight_one_shot_sessions_at_once_are_never_refused_with_no_configuration() {
    let (router, _control) = stack(Config::default());
    let answers = join_all((0..8).map(|i| {
        let router = router.clone();
        async move {
            let session = common::session(&router).await;
            let mut answers = Vec::new();
            for k in 0..3 {
                answers
                    .push(call(&router, &session, k, "read_doc", json!({"id": i * 10 + k})).await);
            }
            answers
        }
    }))
    .await;
    let refusals: Vec<_> = answers.iter().flatten().filter_map(refused).collect();
    assert_eq!(refusals, [], "8 one-shot sessions of three calls each");
}

#[tokio::test(start_paused = true)]
async fn a_fresh_server_admits_a_calm_newcomers_first_call_of_every_tool() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/stormgate.toml");
    let config = Config::load(std::path::Path::new(path)).unwrap();
    let (router, _control) = stack(config);
    let session = common::session(&router).await;
    let mut refusals = Vec::new();
    for (i, (tool, args)) in [
        ("cache_get", json!({"key": "a"})),
        ("create_order", json!({"item": "gpu", "quantity": 1})),
        ("sql_scan", json!({"table": "orders"})),
        ("vector_search", json!({"query": "q"})),
        ("read_doc", json!({"id": 1})),
        ("order_count", json!({})),
    ]
    .into_iter()
    .enumerate()
    {
        let m = call(&router, &session, i, tool, args).await;
        refusals.extend(refused(&m).map(|r| (tool, r)));
    }
    assert_eq!(refusals, [], "one call of each tool");
}

/// A plain MCP server (a handler, no SDK): `initialize` answered with `session` as its
/// `Mcp-Session-Id` (none: a stateless 2026-07-28 server), every `tools/call` answered with the
/// result `answer` makes of its message, anything else 202.
fn plain_server<F, Fut>(session: Option<&'static str>, answer: F) -> Router
where
    F: Fn(Value) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = Value> + Send,
{
    let server = move |body: bytes::Bytes| {
        let answer = answer.clone();
        async move {
            let message: Value = serde_json::from_slice(&body).unwrap();
            let id = message["id"].clone();
            let result = match message["method"].as_str() {
                Some("initialize") => json!({"protocolVersion":"2025-11-25",
                    "capabilities":{"tools":{}},"serverInfo":{"name":"plain","version":"1"}}),
                Some("tools/call") => answer(message).await,
                _ => {
                    return http::Response::builder()
                        .status(202)
                        .body(Body::empty())
                        .unwrap();
                }
            };
            let mut response = http::Response::builder().header("content-type", "application/json");
            if let Some(session) = session {
                response = response.header("mcp-session-id", session);
            }
            response
                .body(Body::from(
                    json!({"jsonrpc":"2.0","id":id,"result":result}).to_string(),
                ))
                .unwrap()
        }
    };
    Router::new().route("/mcp", axum::routing::post(server))
}

/// A plain server whose tool fails (an `isError` result) on the calls listed.
fn flaky_server(fail: &'static [usize]) -> Router {
    let n = Arc::new(AtomicUsize::new(0));
    plain_server(Some("flaky-1"), move |_| {
        let failed = fail.contains(&n.fetch_add(1, Ordering::SeqCst));
        let text = if failed { "no such row" } else { "ok" };
        async move { json!({"content":[{"type":"text","text":text}],"isError":failed}) }
    })
}

#[tokio::test(start_paused = true)]
async fn three_tool_errors_among_twenty_calls_cut_nothing() {
    let control = Control::new(Config::default()).unwrap();
    let router = control.wrap(flaky_server(&[4, 9, 13]));
    let session = common::session(&router).await;
    let refusals = sequential(
        &router,
        &session,
        20,
        Duration::from_millis(200),
        "flaky",
        |i| json!({"q": format!("query {i}")}),
    )
    .await;
    assert_eq!(refusals, [], "3 ordinary tool errors");
    let summary = control
        .sessions()
        .summary(&SessionId::new("flaky-1"))
        .unwrap();
    assert!(summary.factor >= 0.9, "{summary:?}");
}

#[tokio::test(start_paused = true)]
async fn a_burst_that_waits_its_hints_is_admitted_on_its_second_try() {
    // A session budget small enough to refuse a burst: 10 calls/s, a bucket of 10.
    let mut config = Config::default();
    config.sessions.base_budget = Positive::new(10.0).unwrap();
    config.sessions.burst = Positive::new(10.0).unwrap();
    config.sessions.probation = Fraction::new(1.0).unwrap();
    let (router, _control) = stack(config);
    let session = common::session(&router).await;
    let first = join_all((0..30).map(|i| {
        let (router, session) = (router.clone(), session.clone());
        async move {
            let m = call(
                &router,
                &session,
                i,
                "cache_get",
                json!({"key": i.to_string()}),
            )
            .await;
            (i, refused(&m))
        }
    }))
    .await;
    let waiting: Vec<(usize, u64)> = first
        .iter()
        .filter_map(|(i, r)| r.as_ref().map(|(_, wait)| (*i, *wait)))
        .collect();
    assert_eq!(waiting.len(), 20, "a bucket of 10: 20 refused");
    // Each waits exactly its hint, then calls again.
    let second = join_all(waiting.iter().map(|&(i, wait)| {
        let (router, session) = (router.clone(), session.clone());
        async move {
            tokio::time::sleep(Duration::from_millis(wait)).await;
            let m = call(
                &router,
                &session,
                100 + i,
                "cache_get",
                json!({"key": i.to_string()}),
            )
            .await;
            refused(&m)
        }
    }))
    .await;
    let again: Vec<_> = second.into_iter().flatten().collect();
    assert_eq!(again, [], "every waiter admitted on its second try");
}

/// A plain server whose tools sleep the `ms` their arguments ask (as long operations
/// reporting progress do).
fn long_server() -> Router {
    plain_server(Some("long-1"), |message: Value| async move {
        let ms = message["params"]["arguments"]["ms"].as_u64().unwrap_or(1);
        tokio::time::sleep(Duration::from_millis(ms)).await;
        json!({"content":[{"type":"text","text":"done"}]})
    })
}

/// Long operations whose duration their arguments choose (2 to 5 s) beside cheap calls, from
/// the only client: every tool answers at its usual speed, so the budget is never cut.
#[tokio::test(start_paused = true)]
async fn long_operations_of_varying_length_never_cut_the_budget() {
    let control = Control::new(Config::default()).unwrap();
    let _tasks = control.spawn();
    let router = control.wrap(long_server());
    let session = common::session(&router).await;
    let stable = control.budget().current();
    let mut lowest = stable;
    for (i, ms) in [2000, 5000, 2500, 4800, 3000, 5000, 2000, 4500, 2200, 5000]
        .into_iter()
        .enumerate()
    {
        let m = call(&router, &session, 2 * i, "long", json!({"ms": ms})).await;
        assert_eq!(refused(&m), None);
        let m = call(&router, &session, 2 * i + 1, "fast", json!({"ms": 1})).await;
        assert_eq!(refused(&m), None);
        for _ in 0..10 {
            tokio::time::advance(Duration::from_millis(100)).await;
            lowest = lowest.min(control.budget().current());
        }
    }
    assert_eq!(lowest, stable, "the budget was cut");
}

/// A plain stateless server (2026-07-28: no `Mcp-Session-Id`): every call answered at once.
fn stateless_server() -> Router {
    plain_server(None, |_| async {
        json!({"content":[{"type":"text","text":"ok"}]})
    })
}

/// A session-less call presenting `token`.
fn stateless_call(token: &str, id: usize, query: &str) -> http::Request<Body> {
    http::Request::post("/mcp")
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("authorization", format!("Bearer {token}"))
        .body(Body::from(
            json!({"jsonrpc":"2.0","id":id,"method":"tools/call",
                "params":{"name":"search","arguments":{"q":query}}})
            .to_string(),
        ))
        .unwrap()
}

/// The default settings with a session budget and bucket of 10 units.
fn sessions_of_ten() -> Config {
    let mut config = Config::default();
    config.sessions.base_budget = Positive::new(10.0).unwrap();
    config.sessions.burst = Positive::new(10.0).unwrap();
    config
}

/// The refusal of a session-less call presenting `token`, if it was refused.
async fn stateless_refusal(
    router: &Router,
    token: &str,
    id: usize,
    query: &str,
) -> Option<(String, u64)> {
    let res = router
        .clone()
        .oneshot(stateless_call(token, id, query))
        .await
        .unwrap();
    refused(&common::message(res).await.0)
}

/// Two stateless agents, each with its own bearer token: one storms (and is refused), the
/// other is never refused for it. Without the credential in the identity ladder both would be
/// one session, and the second would be refused 20 times of 20.
#[tokio::test(start_paused = true)]
async fn stateless_agents_with_their_own_tokens_are_their_own_sessions() {
    let control = Control::new(sessions_of_ten()).unwrap();
    let router = control.wrap(stateless_server());
    let send = |token: &'static str, id: usize| {
        let router = router.clone();
        async move { stateless_refusal(&router, token, id, &format!("q{id}")).await }
    };
    // Each agent's first call is answered: the server accepted its credential.
    assert_eq!(send("agent-a", 0).await, None);
    assert_eq!(send("agent-b", 1).await, None);
    let (mut a_refused, mut b_refused) = (0, Vec::new());
    for round in 0..20 {
        // A: 20 calls at once every 100 ms; B: one.
        let storm = join_all((0..20).map(|k| send("agent-a", 1000 + round * 20 + k))).await;
        a_refused += storm.iter().flatten().count();
        b_refused.extend(send("agent-b", 10 + round).await);
        tokio::time::advance(Duration::from_millis(100)).await;
    }
    assert!(a_refused > 0, "the storm is refused");
    assert_eq!(b_refused, [], "the other agent is never refused for it");
    // Neither token is kept in clear: sessions are keyed hashes.
    assert!(
        control
            .sessions()
            .top()
            .iter()
            .all(|s| !s.session.contains("agent"))
    );
}

/// A new stateless client is refused at most once, and briefly, for another client of its
/// tenant that spends their unverified pool: its first call is refused for 100 ms (nothing
/// tells a new client's first call from that of an id made up per call); coming back as told,
/// its call is its trial, the server's success accepts its token, and its next calls are its
/// own session's. The other never gets an answer that accepts it (its tool fails every call),
/// so it stays in the pool. Before trial calls the new client was refused for 35 000 ms, and
/// until the pool refilled.
#[tokio::test(start_paused = true)]
async fn a_new_client_is_refused_once_briefly_for_another_unaccepted_client_spending_its_pool() {
    let control = Control::new(sessions_of_ten()).unwrap();
    let router = control.wrap(plain_server(None, |message: Value| async move {
        let failed = message["params"]["arguments"]["q"] == "bad";
        json!({"content":[{"type":"text","text":"x"}],"isError":failed})
    }));
    let storm = join_all((0..30).map(|k| stateless_refusal(&router, "failing", k, "bad"))).await;
    assert!(
        storm.iter().flatten().count() >= 19,
        "the pool refuses most of the failing client's calls: {storm:?}"
    );
    let first = stateless_refusal(&router, "newcomer", 100, "good").await;
    assert_eq!(
        first.as_ref().map(|(_, wait)| *wait),
        Some(100),
        "{first:?}"
    );
    tokio::time::advance(Duration::from_millis(100)).await;
    for n in 1..6 {
        let refusal = stateless_refusal(&router, "newcomer", 100 + n, "good").await;
        assert_eq!(refusal, None, "call {n}");
    }
}

/// One client on `session` for `secs` of the paused clock: a call of a fresh `cache_get` key
/// every 20 ms; after a refusal it waits the refusal's `retry_after_ms` if it `honours` it,
/// else calls again 20 ms later all the same. Its refusals' reasons.
async fn client_for(
    router: &Router,
    session: &str,
    worker: usize,
    secs: u64,
    honours: bool,
) -> Vec<String> {
    caller(
        router,
        session,
        worker,
        secs,
        honours,
        Duration::from_millis(20),
    )
    .await
}

/// [`client_for`] pausing `after_answer` after each answered call.
async fn caller(
    router: &Router,
    session: &str,
    worker: usize,
    secs: u64,
    honours: bool,
    after_answer: Duration,
) -> Vec<String> {
    let end = tokio::time::Instant::now() + Duration::from_secs(secs);
    let mut reasons = Vec::new();
    let mut i = worker * 100_000;
    while tokio::time::Instant::now() < end {
        i += 1;
        let m = call(
            router,
            session,
            i,
            "cache_get",
            json!({"key": i.to_string()}),
        )
        .await;
        let pause = match refused(&m) {
            Some((reason, wait)) if honours => {
                reasons.push(reason);
                Duration::from_millis(wait)
            }
            Some((reason, _)) => {
                reasons.push(reason);
                Duration::from_millis(20)
            }
            None => after_answer,
        };
        tokio::time::sleep(pause).await;
    }
    reasons
}

/// Three clients asking five times their session budget: one calls straight through its
/// refusals (every 20 ms, whatever `retry_after_ms` says), one waits each hint, and one runs
/// four workers that each wait their own. Only the first is scored: its budget is cut to a
/// storm's and its refusals say `session_storm`; the others keep their whole budget.
#[tokio::test(start_paused = true)]
async fn a_client_ignoring_its_hints_is_scored_and_clients_honouring_them_are_not() {
    let mut config = Config::default();
    config.sessions.base_budget = Positive::new(10.0).unwrap();
    config.sessions.burst = Positive::new(10.0).unwrap();
    config.sessions.probation = Fraction::new(1.0).unwrap();
    let (router, control) = stack(config);
    let ignoring = common::session(&router).await;
    let honouring = common::session(&router).await;
    let workers = common::session(&router).await;
    let (ignored, honoured, four) = tokio::join!(
        client_for(&router, &ignoring, 0, 10, false),
        client_for(&router, &honouring, 1, 10, true),
        join_all((0..4).map(|w| client_for(&router, &workers, 2 + w, 10, true))),
    );
    let factor = |id: &str| {
        control
            .sessions()
            .summary(&SessionId::new(id))
            .unwrap()
            .factor
    };
    assert!(factor(&ignoring) < 0.5, "scored: {}", factor(&ignoring));
    assert_eq!(ignored.last().map(String::as_str), Some("session_storm"));
    assert!(!honoured.is_empty(), "the honouring client was refused too");
    assert!(four.iter().any(|r| !r.is_empty()), "so were the workers");
    assert!(factor(&honouring) >= 0.9, "{}", factor(&honouring));
    assert!(factor(&workers) >= 0.9, "{}", factor(&workers));
    assert!(
        !honoured
            .iter()
            .chain(four.iter().flatten())
            .any(|r| r == "session_storm")
    );
}

/// A swarm's sub-agent: two callers that each pause 200 ms after an answer and call again 20 ms
/// after a refusal, whatever its `retry_after_ms`, asking a little more than the global budget
/// (8.5 units/s; no session budget in the way), so their refusals come a few at a time, never
/// sixteen in a row. They are scored; the same two callers waiting their hints, on a server of
/// their own, are not.
#[tokio::test(start_paused = true)]
async fn two_callers_retrying_their_refusals_at_once_are_scored_and_two_waiting_them_are_not() {
    let pair = |honours: bool| async move {
        let mut config = Config::default();
        config.budget.stable_budget = Positive::new(8.5).unwrap();
        config.sessions.probation = Fraction::new(1.0).unwrap();
        let (router, control) = stack(config);
        let session = common::session(&router).await;
        let pause = Duration::from_millis(200);
        let (a, b) = tokio::join!(
            caller(&router, &session, 0, 10, honours, pause),
            caller(&router, &session, 1, 10, honours, pause),
        );
        let summary = control
            .sessions()
            .summary(&SessionId::new(session.as_str()));
        (
            a.into_iter().chain(b).collect::<Vec<_>>(),
            summary.unwrap().factor,
        )
    };
    let (ignored, ignoring) = pair(false).await;
    let (honoured, honouring) = pair(true).await;
    assert!(
        !honoured.is_empty(),
        "the honouring callers were refused too"
    );
    assert!(honouring >= 0.9, "{honouring}");
    assert!(!honoured.iter().any(|r| r == "session_storm"));
    assert!(ignored.len() > honoured.len());
    assert!(ignoring < 0.5, "scored: {ignoring}");
}

/// A host running eight tool calls at once on a fast tool, each waiting its own refusal's hint,
/// asking five times its session budget: never scored. Its eight callers each have a wait
/// ahead when they are refused together; the session has shown eight calls in flight at once,
/// so a call is judged by its last eight waits, not four.
#[tokio::test(start_paused = true)]
async fn eight_callers_waiting_their_hints_are_not_scored() {
    let mut config = Config::default();
    config.sessions.base_budget = Positive::new(10.0).unwrap();
    config.sessions.burst = Positive::new(10.0).unwrap();
    config.sessions.probation = Fraction::new(1.0).unwrap();
    let (router, control) = stack(config);
    let session = common::session(&router).await;
    let reasons = join_all((0..8).map(|w| client_for(&router, &session, w, 10, true))).await;
    let summary = control
        .sessions()
        .summary(&SessionId::new(session.as_str()));
    let factor = summary.unwrap().factor;
    assert!(reasons.iter().any(|r| !r.is_empty()), "refused");
    assert!(factor >= 0.9, "{factor}");
    assert!(!reasons.iter().flatten().any(|r| r == "session_storm"));
}

/// A new host running eight tool calls at once arrives while another client has drained the
/// global budget: its calls are refused before any runs (it never shows a call in flight), and
/// each of its callers waits its own hint. It is not scored: its first eight calls came at
/// once, so a call is judged by its last eight waits.
#[tokio::test(start_paused = true)]
async fn eight_new_callers_refused_before_any_ran_and_waiting_their_hints_are_not_scored() {
    let mut config = Config::default();
    config.budget.stable_budget = Positive::new(20.0).unwrap();
    config.sessions.probation = Fraction::new(1.0).unwrap();
    let (router, control) = stack(config);
    let hog = common::session(&router).await;
    let host = common::session(&router).await;
    let (_, reasons) = tokio::join!(
        join_all((0..4).map(|w| client_for(&router, &hog, w, 12, true))),
        async {
            tokio::time::sleep(Duration::from_secs(2)).await;
            join_all((0..8).map(|w| client_for(&router, &host, 10 + w, 10, true))).await
        }
    );
    let summary = control.sessions().summary(&SessionId::new(host.as_str()));
    let factor = summary.unwrap().factor;
    assert!(reasons.iter().any(|r| !r.is_empty()), "refused");
    assert!(factor >= 0.9, "{factor}");
}

/// A client the session guard has cut still asks, but counts towards the fair level only for
/// what its own budget lets it have. Global budget 100 units/s: three sub-agents calling
/// through their refusals (scored, cut to 2 units/s each), a host of eight callers waiting
/// their hints and asking four times the budget, and a light agent asking 20 units/s. Counted
/// at what they ask, the cut sub-agents would pull the fair level down to the light agent's
/// rate, and it would lose the bucket to the host; counted at what they may have, it stays
/// under its part and is never refused once they are scored.
#[tokio::test(start_paused = true)]
async fn cut_clients_count_towards_the_fair_level_only_for_what_they_may_have() {
    let mut config = Config::default();
    config.budget.stable_budget = Positive::new(100.0).unwrap();
    config.sessions.base_budget = Positive::new(100.0).unwrap();
    config.sessions.burst = Positive::new(100.0).unwrap();
    config.sessions.probation = Fraction::new(1.0).unwrap();
    let (router, control) = stack(config);
    let swarm = [
        common::session(&router).await,
        common::session(&router).await,
        common::session(&router).await,
    ];
    let host = common::session(&router).await;
    let light = common::session(&router).await;
    let fast = Duration::from_millis(5);
    let (_, _, refusals) = tokio::join!(
        join_all(
            swarm
                .iter()
                .flat_map(|s| { (0..2).map(|w| caller(&router, s, w, 12, false, fast)) })
        ),
        join_all((0..8).map(|w| caller(
            &router,
            &host,
            10 + w,
            12,
            true,
            Duration::from_millis(20)
        ))),
        async {
            // Once the swarm is scored: a call every 50 ms, each waiting its hint if refused.
            tokio::time::sleep(Duration::from_secs(3)).await;
            caller(&router, &light, 20, 9, true, Duration::from_millis(50)).await
        }
    );
    for s in &swarm {
        let factor = control
            .sessions()
            .summary(&SessionId::new(s.as_str()))
            .unwrap()
            .factor;
        assert!(factor <= 0.05, "the swarm is cut: {factor}");
    }
    assert_eq!(refusals, Vec::<String>::new());
}
