//! Drives the example server through every refusal stormgate can give today, for the
//! dashboard checks. Deterministic in paused or real time.

#![allow(dead_code, unreachable_pub)]

use std::num::NonZeroUsize;
use std::time::Duration;
use stormgate::valid::{AtLeastOne, NonNegative, NonZeroDuration, Positive};

use axum::Router;
use axum::body::Body;
use http::Request;
use serde_json::{Value, json};
use stormgate::budget::{BudgetConfig, TenantConfig};
use stormgate::control::{Config, Control, IdentityConfig, Mode};
use stormgate::entropy::SessionConfig;
use stormgate::fifo::ResourceLimits;
use tower::ServiceExt;

use crate::common::message;

/// The reasons [`drive`] produces: every one a stage of stormgate gives.
pub const REASONS: [&str; 9] = [
    "circuit_open",
    "deadline_exceeded",
    "fixed_limit_exceeded",
    "global_budget_exceeded",
    "queue_full",
    "queue_timeout",
    "session_budget_exceeded",
    "tenant_budget_exceeded",
    "upstream_rate_limited",
];

/// A configuration under which each reason is easy to reach.
pub fn config() -> Config {
    let mut config = {
        let mut built = Config::default();
        built.budget = {
            let mut built = BudgetConfig::default();
            built.stable_budget = Positive::new(100.0).unwrap();
            built.burst = Some(AtLeastOne::new(8.0).unwrap());
            built
        };
        built.tenants = {
            let mut built = TenantConfig::default();
            built.min_budget = Some(NonNegative::new(0.001).unwrap());
            built
        };
        built.sessions = {
            let mut built = SessionConfig::default();
            built.base_budget = Positive::new(5.0).unwrap();
            built.burst = Positive::new(5.0).unwrap();
            built
        };
        built.fixed.session_rate = Some(Positive::new(0.5).unwrap());
        built.identity = {
            let mut built = IdentityConfig::default();
            built.tenant_header = Some("x-tenant".into());
            built.session_meta_key = None;
            built
        };
        built
    };
    config.fifo.keys.insert(
        "db".into(),
        ResourceLimits::default()
            .max_concurrent(NonZeroUsize::MIN)
            .max_queue_depth(1)
            .queue_timeout(NonZeroDuration::new(Duration::from_millis(100)).unwrap()),
    );
    config.fifo.keys.insert(
        "vector_search".into(),
        ResourceLimits::default()
            .queue_timeout(NonZeroDuration::new(Duration::from_millis(100)).unwrap()),
    );
    config.fifo.tools.insert("sql_scan".into(), "db".into());
    // A breaker that opens after two failed calls of create_order, and a deadline that cuts
    // every vector_search (it takes 50 ms).
    config.breaker.tools.insert("create_order".into());
    config.breaker.window_calls = 2;
    config.breaker.min_calls = 2;
    config.deadlines.tools.insert(
        "vector_search".into(),
        NonZeroDuration::from_millis(10).unwrap(),
    );
    config
}

async fn open(router: &Router, tenant: &str) -> String {
    crate::common::session_as(router, Some(tenant)).await
}

fn post(tenant: &str, session: Option<&str>, body: Value) -> Request<Body> {
    crate::common::request_as(Some(tenant), session, body)
}

async fn call(router: &Router, tenant: &str, session: &str, tool: &str, args: Value) -> Value {
    let body = json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":tool,"arguments":args}});
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

fn reason(msg: &Value) -> Option<String> {
    msg["error"]["data"]["reason"].as_str().map(str::to_owned)
}

/// Sends the traffic; returns every refusal reason seen.
pub async fn drive(router: &Router, control: &Control) -> Vec<String> {
    let mut seen = Vec::new();
    // FIFO: one scan at a time, one waiter, 100 ms patience: full and timed out.
    let s = open(router, "fifo").await;
    let scans: Vec<_> = (0..3)
        .map(|i| {
            let r = router.clone();
            let s = s.clone();
            tokio::spawn(async move {
                call(
                    &r,
                    "fifo",
                    &s,
                    "sql_scan",
                    json!({"table": format!("t{i}")}),
                )
                .await
            })
        })
        .collect();
    for h in scans {
        seen.extend(reason(&h.await.unwrap()));
    }
    // An upstream cooldown longer than the key's patience.
    control.report_upstream_rate_limit("vector_search", Some(Duration::from_millis(200)));
    seen.extend(reason(
        &call(router, "fifo", &s, "vector_search", json!({"query": "q"})).await,
    ));
    // Once the cooldown is over, a search runs past its 10 ms deadline and is cut.
    tokio::time::sleep(Duration::from_millis(300)).await;
    seen.extend(reason(
        &call(router, "fifo", &s, "vector_search", json!({"query": "q"})).await,
    ));
    // One session past its budget (5 calls of burst).
    let s = open(router, "solo").await;
    for i in 0..8 {
        seen.extend(reason(
            &call(
                router,
                "solo",
                &s,
                "cache_get",
                json!({"key": format!("k{i}")}),
            )
            .await,
        ));
    }
    // One tenant past its share (8 units of burst, as the global bucket once it has refilled),
    // in new sessions that stay within theirs.
    tokio::time::sleep(Duration::from_secs(1)).await;
    for _ in 0..4 {
        let s = open(router, "acme").await;
        for i in 0..4 {
            seen.extend(reason(
                &call(
                    router,
                    "acme",
                    &s,
                    "cache_get",
                    json!({"key": format!("k{i}")}),
                )
                .await,
            ));
        }
    }
    // Many tenants within their shares, past the global burst.
    for t in 0..8 {
        let tenant = format!("tenant-{t}");
        for _ in 0..2 {
            let s = open(router, &tenant).await;
            for i in 0..4 {
                seen.extend(reason(
                    &call(
                        router,
                        &tenant,
                        &s,
                        "cache_get",
                        json!({"key": format!("k{i}")}),
                    )
                    .await,
                ));
            }
        }
    }
    // Fixed mode: half a call per second per session.
    control.set_mode(Mode::Fixed);
    let s = open(router, "fixed").await;
    for i in 0..3 {
        seen.extend(reason(
            &call(
                router,
                "fixed",
                &s,
                "cache_get",
                json!({"key": format!("k{i}")}),
            )
            .await,
        ));
    }
    control.set_mode(Mode::Adaptive);
    // Two backend failures of create_order, seen by two clients (tenants), open its breaker
    // (invalid arguments would not: they are the client's mistake; nor would one client's
    // failures), once the budgets have refilled.
    tokio::time::sleep(Duration::from_secs(1)).await;
    for tenant in ["a", "b"] {
        let failed = stormgate::Call::request("tools/call")
            .with_tool("create_order")
            .with_tenant(stormgate::Tenant::new(tenant));
        stormgate::outcome::Observer::observe(
            control.stages().breakers,
            &stormgate::outcome::Observation {
                call: &failed,
                outcome: stormgate::outcome::Outcome::Error,
                service_time: Duration::from_millis(5),
                response_bytes: 0,
                queue_wait: Duration::ZERO,
                at: tokio::time::Instant::now(),
            },
        );
    }
    // (each call from a new session, so the session guard does not step in first).
    for i in 0..3 {
        let s = open(router, "breaker").await;
        seen.extend(reason(
            &call(router, "breaker", &s, "create_order", json!({"item": i})).await,
        ));
    }
    // A reload, the tick and the sweep that publish the gauges.
    control.reload(control.config().as_ref().clone()).unwrap();
    control.stages().budget.tick();
    control.stages().sessions.sweep();
    seen.sort();
    seen.dedup();
    seen
}

/// The dashboard row whose panels need a Redis-backed server (`[distributed]`).
pub const SHARED_ROW: &str = "Shared budget (Redis)";

/// One query of one panel.
pub struct PanelQuery {
    /// The row the panel is under.
    pub row: String,
    pub title: String,
    pub expr: String,
}

/// Every query of every panel of dashboards/stormgate.json.
pub fn panel_queries() -> Vec<PanelQuery> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/dashboards/stormgate.json");
    let dash: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut row = String::new();
    let mut queries = Vec::new();
    for p in dash["panels"].as_array().unwrap() {
        let title = p["title"].as_str().unwrap_or("").to_owned();
        if p["type"] == "row" {
            row = title;
            continue;
        }
        for t in p["targets"].as_array().cloned().unwrap_or_default() {
            queries.push(PanelQuery {
                row: row.clone(),
                title: title.clone(),
                expr: t["expr"].as_str().unwrap().to_owned(),
            });
        }
    }
    queries
}
