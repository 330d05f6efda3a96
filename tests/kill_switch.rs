//! The kill switch governs every stage. For each stage, a stack where only that stage limits,
//! driven through the real example server in each mode: what each mode refuses.

mod common;

#[path = "../examples/mcp_server/app.rs"]
mod app;

use std::collections::BTreeSet;
use std::num::NonZeroUsize;
use std::time::Duration;
use stormgate::valid::{NonZeroDuration, Positive};

use common::{message, session, tool_call};
use serde_json::{Value, json};
use stormgate::Call;
use stormgate::control::{Config, Mode, Off};
use stormgate::fifo::ResourceLimits;
use stormgate::idempotency::Missing;
use stormgate::outcome::{Observation, Observer, Outcome};
use tower::ServiceExt;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    GlobalBudget,
    SessionGuard,
    Breaker,
    Fifo,
    Deadline,
    Idempotency,
}

/// A configuration in which only `stage` limits (and the fixed-mode limit that replaces it).
fn config(stage: Stage) -> Config {
    let mut c = Config::default();
    c.features.tenant_budgets = false;
    match stage {
        Stage::GlobalBudget => {
            c.budget.stable_budget = Positive::new(1.0).unwrap();
            c.fixed.global_rate = Some(Positive::new(1.0).unwrap());
        }
        Stage::SessionGuard => {
            c.sessions.base_budget = Positive::new(1.0).unwrap();
            c.sessions.burst = Positive::new(1.0).unwrap();
            c.fixed.session_rate = Some(Positive::new(1.0).unwrap());
        }
        Stage::Breaker => {
            c.breaker.tools.insert("sql_scan".into());
            c.breaker.window_calls = 2;
            c.breaker.min_calls = 2;
        }
        Stage::Fifo => {
            c.fifo.keys.insert(
                "db".into(),
                ResourceLimits::default()
                    .max_concurrent(NonZeroUsize::MIN)
                    .max_queue_depth(0),
            );
            c.fifo.tools.insert("sql_scan".into(), "db".into());
        }
        Stage::Deadline => {
            c.deadlines
                .tools
                .insert("sql_scan".into(), NonZeroDuration::from_millis(50).unwrap());
        }
        Stage::Idempotency => {
            c.idempotency.tools.insert("create_order".into());
            c.idempotency.missing = Missing::Reject;
        }
    }
    c
}

/// Tells the breakers of a backend failure of `sql_scan` seen by each of two clients (two
/// tenants: one client's failures never open a breaker).
fn fail_sql_scan(control: &stormgate::control::Control) {
    for tenant in ["a", "b"] {
        let failed = Call::request("tools/call")
            .with_tool("sql_scan")
            .with_tenant(stormgate::Tenant::new(tenant));
        control.stages().breakers.observe(&Observation {
            call: &failed,
            outcome: Outcome::Error,
            service_time: Duration::from_millis(1),
            response_bytes: 0,
            queue_wait: Duration::ZERO,
            at: tokio::time::Instant::now(),
        });
    }
}

/// What an answer refused, if anything: the contract's reason, or the idempotency error.
fn refusal(msg: &Value) -> Option<String> {
    let error = msg.get("error")?;
    if let Some(reason) = error["data"]["reason"].as_str() {
        return Some(reason.to_owned());
    }
    assert_eq!(error["code"], -32602, "{msg}");
    Some("missing_idempotency_key".into())
}

/// The refusals `stage` makes of its trigger in `mode`, with `off` set as given.
async fn refusals(stage: Stage, mode: Mode, off: Off) -> BTreeSet<String> {
    let mut config = config(stage);
    config.off = off;
    let (router, control) = app::protected(app::Backend::new(), config).unwrap();
    let sid = session(&router).await;
    tokio::time::advance(Duration::from_secs(10)).await; // every bucket full again
    control.set_mode(mode);
    let call = |id: usize, tool: &str, args: Value| {
        let r = router.clone();
        let req = tool_call(&sid, id, tool, args);
        tokio::spawn(async move { message(r.oneshot(req).await.unwrap()).await.0 })
    };
    let scan = json!({"table": "orders"});
    let handles = match stage {
        // Five quick calls: more than a bucket of one holds.
        Stage::GlobalBudget | Stage::SessionGuard => {
            let mut answers = Vec::new();
            for i in 0..5 {
                answers.push(call(i, "cache_get", json!({"key": "k"})).await.unwrap());
            }
            return answers.iter().filter_map(refusal).collect();
        }
        Stage::Breaker => {
            // One failure opens it (a window of one).
            fail_sql_scan(&control);
            vec![call(1, "sql_scan", scan)]
        }
        // Two at once where one may run and none may wait.
        Stage::Fifo => vec![call(1, "sql_scan", scan.clone()), call(2, "sql_scan", scan)],
        // A 200 ms scan with a 50 ms deadline.
        Stage::Deadline => vec![call(1, "sql_scan", scan)],
        // A write without a key.
        Stage::Idempotency => vec![call(1, "create_order", json!({"item": "a", "quantity": 1}))],
    };
    let mut refused = BTreeSet::new();
    for h in handles {
        let msg = h.await.unwrap();
        match refusal(&msg) {
            Some(r) => {
                refused.insert(r);
            }
            None => assert_eq!(msg["result"]["isError"], false, "{msg}"),
        }
    }
    refused
}

#[tokio::test(start_paused = true)]
async fn each_mode_refuses_exactly_what_it_says_at_every_stage() {
    let set = |r: &[&str]| r.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
    // `off` refuses nothing whether it measures or passes through.
    let table: [(Stage, [&[&str]; 3]); 6] = [
        // stage            adaptive                         fixed                      off
        (
            Stage::GlobalBudget,
            [&["global_budget_exceeded"], &["fixed_limit_exceeded"], &[]],
        ),
        (
            Stage::SessionGuard,
            // A new session: what probation lends it is what refuses it.
            [&["session_probation"], &["fixed_limit_exceeded"], &[]],
        ),
        (Stage::Breaker, [&["circuit_open"], &["circuit_open"], &[]]),
        (Stage::Fifo, [&["queue_full"], &["queue_full"], &[]]),
        (
            Stage::Deadline,
            [&["deadline_exceeded"], &["deadline_exceeded"], &[]],
        ),
        (
            Stage::Idempotency,
            [
                &["missing_idempotency_key"],
                &["missing_idempotency_key"],
                &[],
            ],
        ),
    ];
    for (stage, expected) in table {
        for (mode, want) in [Mode::Adaptive, Mode::Fixed, Mode::Off]
            .into_iter()
            .zip(expected)
        {
            for off in [Off::Measure, Off::PassThrough] {
                assert_eq!(
                    refusals(stage, mode, off).await,
                    set(want),
                    "{stage:?} in {mode:?} ({off:?})"
                );
            }
        }
    }
}

/// What the stack's stages saw of `count` calls on one session (its audit), the last answer,
/// and how the same session's next call is answered once the mode is back to `adaptive`.
async fn audited_in_off(off: Off, count: usize) -> (usize, Value, Value) {
    let mut config = config(Stage::GlobalBudget);
    config.off = off;
    let (router, control) = app::protected(app::Backend::new(), config).unwrap();
    let sid = session(&router).await;
    let seen = || {
        control
            .audit()
            .invocations(&stormgate::SessionId::new(sid.clone()))
            .len()
    };
    let handshake = seen();
    tokio::time::advance(Duration::from_secs(10)).await; // the bucket of one full again
    control.set_mode(Mode::Off);
    let mut last = Value::Null;
    for id in 0..count {
        let req = tool_call(&sid, id, "cache_get", json!({"key": "k"}));
        last = message(router.clone().oneshot(req).await.unwrap()).await.0;
    }
    let audited = seen() - handshake;
    control.set_mode(Mode::Adaptive);
    let mut after = Value::Null;
    for id in count..count + 2 {
        let req = tool_call(&sid, id, "cache_get", json!({"key": "k"}));
        after = message(router.clone().oneshot(req).await.unwrap()).await.0;
    }
    (audited, last, after)
}

#[tokio::test(start_paused = true)]
async fn off_passing_through_steps_the_whole_stack_aside_and_measuring_does_not() {
    // Measuring: every call is seen (and charged: the bucket of one is spent by the first).
    let (audited, last, after) = audited_in_off(Off::Measure, 5).await;
    assert_eq!(audited, 5);
    assert_eq!(last["result"]["isError"], false, "{last}");
    assert_eq!(
        after["error"]["data"]["reason"], "global_budget_exceeded",
        "{after}"
    );
    // Passing through: the stages see nothing, the server answers every call itself, and no
    // stage takes the calls let by for a stack built in the wrong order.
    let (logs, _guard) = common::Logs::capture();
    let (audited, last, after) = audited_in_off(Off::PassThrough, 5).await;
    assert_eq!(audited, 0, "no stage saw the calls");
    assert!(
        !logs.text().contains("no ClassifyLayer read"),
        "{}",
        logs.text()
    );
    assert_eq!(last["result"]["isError"], false, "{last}");
    // Back in adaptive the stack runs again: the bucket of one, untouched while off, takes
    // one call and refuses the next.
    assert_eq!(
        after["error"]["data"]["reason"], "global_budget_exceeded",
        "{after}"
    );
}

#[tokio::test(start_paused = true)]
async fn off_still_measures_breakers_open_on_the_outcomes_seen_while_off() {
    let (router, control) = app::protected(app::Backend::new(), config(Stage::Breaker)).unwrap();
    let sid = session(&router).await;
    control.set_mode(Mode::Off);
    fail_sql_scan(&control);
    assert!(
        matches!(
            control.breakers().state("sql_scan"),
            Some(stormgate::breaker::BreakerState::Open { .. })
        ),
        "recorded while off"
    );
    let req = tool_call(&sid, 1, "sql_scan", json!({"table": "t"}));
    let (msg, _) = message(router.clone().oneshot(req).await.unwrap()).await;
    assert_eq!(
        msg["result"]["isError"], false,
        "off refuses nothing: {msg}"
    );
    control.set_mode(Mode::Adaptive);
    let req = tool_call(&sid, 2, "sql_scan", json!({"table": "t"}));
    let (msg, _) = message(router.clone().oneshot(req).await.unwrap()).await;
    assert_eq!(msg["error"]["data"]["reason"], "circuit_open", "{msg}");
}

#[tokio::test(start_paused = true)]
async fn a_batch_gets_the_servers_own_answer_in_every_mode() {
    // The example configuration as shipped (`[classify] batches = "off"`: rmcp has no batches).
    let config = Config::load(std::path::Path::new(app::CONFIG)).unwrap();
    let (router, control) = app::protected(app::Backend::new(), config).unwrap();
    let sid = session(&router).await;
    let batch = json!([
        {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
         "params": {"name": "sql_scan", "arguments": {"table": "t"}}},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
         "params": {"name": "sql_scan", "arguments": {"table": "u"}}}
    ]);
    let mut answers = Vec::new();
    for mode in [Mode::Adaptive, Mode::Fixed, Mode::Off] {
        control.set_mode(mode);
        for version in ["2025-03-26", "2025-06-18", "2025-11-25"] {
            let req = http::Request::post("/mcp")
                .header("content-type", "application/json")
                .header("accept", "application/json, text/event-stream")
                .header("mcp-session-id", &sid)
                .header("mcp-protocol-version", version)
                .body(axum::body::Body::from(batch.to_string()))
                .unwrap();
            let res = router.clone().oneshot(req).await.unwrap();
            answers.push((version, res.status()));
        }
    }
    // rmcp refuses every batch itself; the answer is its own, the same in every mode (never
    // stormgate's 200 with an array of refusals).
    assert!(
        answers
            .iter()
            .all(|(_, s)| *s == answers[0].1 && s.is_client_error()),
        "{answers:?}"
    );
}

/// A stack built stage by stage, without a `Control`, is flipped through its own switch.
#[tokio::test(start_paused = true)]
async fn a_switch_of_your_own_flips_the_stages_that_follow_it() {
    use stormgate::admit::Admission;
    use stormgate::control::{Policy, Switch};
    use stormgate::entropy::{SessionConfig, SessionGuard};
    let switch = Switch::default();
    let guard = SessionGuard::with_switch(
        {
            let mut built = SessionConfig::default();
            built.base_budget = Positive::new(1.0).unwrap();
            built.burst = Positive::new(1.0).unwrap();
            built
        },
        switch.clone(),
    )
    .unwrap();
    // A session the server accepted (an unaccepted id's refusals by its tenant's pool would
    // be trial calls while the tenant has newcomer places).
    let session = stormgate::SessionId::new("s");
    assert!(guard.accept(&session, &stormgate::Tenant::anonymous()));
    let call = Call::request("tools/call")
        .with_tool("search")
        .with_session(session);
    let admitted = |n| (0..n).filter(|_| guard.admit(&call).is_ok()).count();
    assert_eq!(admitted(5), 1, "adaptive: a bucket of one");
    switch.set(Policy {
        mode: Mode::Off,
        ..Policy::default()
    });
    assert_eq!(admitted(5), 5, "off: nothing refused");
    switch.set(Policy::default());
    assert_eq!(admitted(5), 0, "adaptive again: the bucket is still empty");
}

#[test]
fn the_off_setting_is_read_and_checked() {
    let c = Config::from_toml("mode = \"off\"\noff = \"pass_through\"\n").unwrap();
    assert!(c.policy().passes_through());
    let c = Config::from_toml("off = \"pass_through\"\n").unwrap();
    assert!(!c.policy().passes_through(), "only in mode off");
    assert!(
        !Config::default().policy().passes_through(),
        "measures by default"
    );
    let err = Config::from_toml("off = \"skip\"\n").unwrap_err();
    assert!(err.to_string().contains("off"), "{err}");
}
