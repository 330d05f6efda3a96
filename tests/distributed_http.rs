//! Two example servers (the whole stack of `examples/mcp_server`, in process) configured with
//! one `[distributed]` Redis hold one budget between them; the same two without it admit
//! about twice as much. A real `redis-server` on a free port, real time.

#![cfg(feature = "redis")]

mod common;
mod redis_support;

#[path = "../examples/mcp_server/app.rs"]
mod app;

use std::time::{Duration, Instant};
use stormgate::valid::{AtLeastOne, NonNegative, Positive};

use common::{message, session, tool_call};
use serde_json::json;
use stormgate::budget::{BudgetConfig, TenantConfig};
use stormgate::control::{AdminConfig, Config};
use stormgate::distributed::{DistributedConfig, SharedMode};
use stormgate::entropy::SessionConfig;
use tower::ServiceExt;

const BUDGET: f64 = 200.0;

fn config(redis: Option<&str>, node: &str) -> Config {
    {
        let mut built = Config::default();
        built.budget = {
            let mut built = BudgetConfig::default();
            built.stable_budget = Positive::new(BUDGET).unwrap();
            // A tenth of a second of burst (the default is a second): the cluster's rate is
            // measured over windows of about a second.
            built.burst = Some(AtLeastOne::new(BUDGET / 10.0).unwrap());
            built
        };
        built.tenants = {
            let mut built = TenantConfig::default();
            built.min_budget = Some(NonNegative::new(0.0).unwrap());
            built
        }; // The session guard would refuse this one busy session first; the budget is under test.
        built.sessions = {
            let mut built = SessionConfig::default();
            built.enabled = false;
            built
        };
        built.distributed = redis.map(|url| {
            let mut built = DistributedConfig::default();
            built.url = url.to_owned();
            built.prefix = "http".into();
            built.node_id = Some(node.to_owned());
            built
        });
        built.admin = {
            let mut built = AdminConfig::default();
            built.token = Some("s3cret".into());
            built
        };
        built
    }
}

/// Offers `cache_get` (weight 1) to both servers at once, `per_ms` calls every 2 ms each, for
/// `run`; returns the calls answered (not refused) after the first `warmup`, and the refusal
/// reasons seen.
async fn drive(redis: Option<&str>, run: Duration, warmup: Duration) -> (u64, Vec<String>) {
    let mut servers = Vec::new();
    for node in ["a", "b"] {
        let (router, control) = app::protected(app::Backend::new(), config(redis, node)).unwrap();
        let tasks = control.spawn();
        if let Some(shared) = control.budget().shared() {
            assert!(shared.ready(Duration::from_secs(3)).await);
        }
        let sid = session(&router).await;
        servers.push((router, control, tasks, sid));
    }
    let start = Instant::now();
    let handles: Vec<_> = servers
        .iter()
        .map(|(router, _, _, sid)| {
            let (router, sid) = (router.clone(), sid.clone());
            tokio::spawn(async move {
                let mut admitted = 0u64;
                let mut reasons = Vec::new();
                let mut tick = tokio::time::interval(Duration::from_millis(2));
                let mut id = 0;
                while start.elapsed() < run {
                    tick.tick().await;
                    id += 1;
                    let req = tool_call(&sid, id, "cache_get", json!({"key": "k"}));
                    let (msg, _) = message(router.clone().oneshot(req).await.unwrap()).await;
                    match msg["error"]["data"]["reason"].as_str() {
                        Some(r) => reasons.push(r.to_owned()),
                        None if start.elapsed() >= warmup => {
                            assert!(msg["result"].is_object(), "{msg}");
                            admitted += 1;
                        }
                        None => {}
                    }
                }
                (admitted, reasons)
            })
        })
        .collect();
    let mut total = 0;
    let mut reasons = Vec::new();
    for h in handles {
        let (a, r) = h.await.unwrap();
        total += a;
        reasons.extend(r);
    }
    for (_, control, _, _) in &servers {
        if let Some(shared) = control.budget().shared() {
            assert_eq!(shared.mode(), SharedMode::Shared);
            assert_eq!(shared.stats().errors, 0, "{:?}", shared.stats());
            // The admin state shows it too.
            let req = http::Request::get("/state")
                .header("authorization", "Bearer s3cret")
                .body(axum::body::Body::empty())
                .unwrap();
            let res = control.admin_router().unwrap().oneshot(req).await.unwrap();
            let state = common::body_json(res).await;
            assert_eq!(state["shared"]["mode"], "shared", "{state}");
            assert_eq!(state["shared"]["rate"], BUDGET, "{state}");
        }
    }
    reasons.sort();
    reasons.dedup();
    (total, reasons)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_example_servers_sharing_one_redis_hold_one_budget() {
    let redis = redis_support::RedisServer::start();
    let run = Duration::from_millis(3500);
    let warmup = Duration::from_millis(1000);
    let measured = (run - warmup).as_secs_f64();
    // Each server is offered 500 calls/s, 2.5 times the whole budget.
    let (shared, reasons) = drive(Some(&redis.url()), run, warmup).await;
    let (alone, _) = drive(None, run, warmup).await;
    let (shared, alone) = (shared as f64 / measured, alone as f64 / measured);
    eprintln!("two servers, one Redis: {shared:.0}/s; two servers alone: {alone:.0}/s");
    // Up to one lease window of slack at each end of the measured span.
    assert!(
        shared <= BUDGET * 1.05 + BUDGET * 0.5 * 2.0 / measured,
        "two servers sharing a budget of {BUDGET}/s admitted {shared:.0}/s"
    );
    assert!(shared >= 0.7 * BUDGET, "{shared:.0}/s");
    assert!(
        alone >= 1.7 * BUDGET,
        "two servers alone admitted only {alone:.0}/s"
    );
    assert!(
        reasons
            .iter()
            .all(|r| r == "global_budget_exceeded" || r == "tenant_budget_exceeded"),
        "{reasons:?}"
    );
}
