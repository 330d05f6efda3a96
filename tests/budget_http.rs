//! The budget in front of the example server (in process, paused time): a burst of sql_scan
//! drives p99 and errors up and the budget down; once it ends, the budget climbs back by steps.

mod common;

#[path = "../examples/mcp_server/app.rs"]
mod app;

use std::time::Duration;
use stormgate::valid::{AtLeastOne, NonZeroDuration, Positive};

use common::{message, session, tool_call};
use serde_json::json;
use stormgate::budget::{BudgetConfig, TenantConfig};
use stormgate::control::Config;
use stormgate::cost::{CostConfig, Weight};
use stormgate::entropy::SessionConfig;
use tower::ServiceExt;

#[tokio::test(start_paused = true)]
async fn a_sql_scan_burst_drives_the_budget_down_and_it_recovers_by_steps() {
    let mut costs = CostConfig::default();
    costs
        .tools
        .insert("sql_scan".into(), Weight::fixed(50).unwrap());
    let config = {
        let mut built = Config::default(); // A budget above what the pool can serve (4 connections x 5 scans/s x 50 units =
        // 1000/s), so the burst reaches the backend and the controller has to find out.
        built.budget = {
            let mut built = BudgetConfig::default();
            built.stable_budget = Positive::new(5000.0).unwrap();
            built.burst = Some(AtLeastOne::new(2500.0).unwrap());
            built.target_p99 = Some(NonZeroDuration::new(Duration::from_millis(1000)).unwrap());
            built
        }; // One tenant only: its share would cap the burst at a tenth of a second of budget
        // (10 scans); here the global controller is under test.
        built.tenants = {
            let mut built = TenantConfig::default();
            built.enabled = false;
            built
        };
        built.costs = costs; // The session guard is under test elsewhere; here it must not stand in the way.
        built.sessions = {
            let mut built = SessionConfig::default();
            built.enabled = false;
            built
        };
        built
    };
    let backend = app::Backend::new();
    let (router, control) = app::protected(backend.clone(), config).unwrap();
    let budget = control.stages().budget.clone();
    let _tasks = control.spawn();
    let sid = session(&router).await;

    // Warm up: one scan at a time, healthy (200 ms).
    for i in 0..20 {
        let (msg, _) = message(
            router
                .clone()
                .oneshot(tool_call(&sid, i, "sql_scan", json!({"table": "t"})))
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(msg["result"]["isError"], false);
    }
    let warm = budget.health();
    assert_eq!(warm.budget, 5000.0);
    assert!((0.19..0.25).contains(&warm.p99), "healthy p99 {}", warm.p99);

    // The burst: 60 scans at once on a pool of 4.
    let burst: Vec<_> = (100..160)
        .map(|i| {
            let r = router.clone();
            let req = tool_call(&sid, i, "sql_scan", json!({"table": format!("t{i}")}));
            tokio::spawn(async move { message(r.oneshot(req).await.unwrap()).await.0 })
        })
        .collect();
    let mut trace = Vec::new();
    for _ in 0..1500 {
        tokio::time::sleep(Duration::from_millis(10)).await;
        let b = budget.current();
        if trace.last() != Some(&b) {
            trace.push(b);
        }
    }
    let mut failed = 0;
    for h in burst {
        let msg = h.await.unwrap();
        if msg["result"]["isError"] == true || msg.get("error").is_some() {
            failed += 1;
        }
    }
    assert!(
        failed > 0,
        "the pool was overrun: some scans waited past 2 s"
    );

    let lowest = trace.iter().cloned().fold(f64::MAX, f64::min);
    assert!(
        lowest <= 0.5 * 5000.0,
        "the budget fell: lowest {lowest}, trace {trace:?}"
    );
    assert_eq!(*trace.last().unwrap(), 5000.0, "recovered: {trace:?}");
    // After its lowest point the budget only climbs, by exactly 5% of 5000 per tick.
    let low_at = trace.iter().rposition(|b| *b == lowest).unwrap();
    for w in trace[low_at..].windows(2) {
        let step = w[1] - w[0];
        assert!(
            (step - 250.0).abs() < 1e-6 || (w[1] == 5000.0 && step > 0.0 && step <= 250.0),
            "step {step} in {trace:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_clumsy_client_moves_neither_the_budget_nor_a_breaker() {
    // Unknown tools and bad arguments (rmcp answers at once) are the client's mistakes: read as
    // backend failures, they would cut the global budget for everyone, and ten of them would
    // open the tool's breaker.
    let mut config = Config::default();
    config.breaker.tools.insert("sql_scan".into());
    config.sessions.enabled = false; // the guard is not under test here
    let (router, control) = app::protected(app::Backend::new(), config).unwrap();
    let sid = session(&router).await;
    let mut id = 0;
    for _ in 0..10 {
        for _ in 0..10 {
            id += 1;
            let (tool, args) = if id % 2 == 0 {
                ("no_such_tool", json!({}))
            } else {
                ("sql_scan", json!({"tabel": "misspelt"}))
            };
            let (msg, _) = message(
                router
                    .clone()
                    .oneshot(tool_call(&sid, id, tool, args))
                    .await
                    .unwrap(),
            )
            .await;
            // rmcp: -32602 for an unknown tool; an isError result "failed to deserialize
            // parameters" for bad arguments.
            assert!(
                msg["error"]["code"] == -32602 || msg["result"]["isError"] == true,
                "{msg}"
            );
        }
        control.stages().budget.tick();
    }
    assert_eq!(
        control.budget().current(),
        1000.0,
        "the budget stays at stable"
    );
    assert_eq!(
        control.budget().health().error_rate,
        0.0,
        "no backend error seen"
    );
    let (msg, _) = message(
        router
            .clone()
            .oneshot(tool_call(&sid, 999, "sql_scan", json!({"table": "t"})))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(
        msg["result"]["isError"], false,
        "the breaker stayed closed: {msg}"
    );
}
