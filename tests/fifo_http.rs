//! The FIFO layer in front of the example server (in process, paused time: exact).

#[path = "../examples/mcp_server/app.rs"]
mod app;

mod common;

use std::num::NonZeroUsize;
use std::time::Duration;
use stormgate::valid::NonZeroDuration;

use common::{message, request, session};
use serde_json::{Value, json};
use stormgate::classify::ClassifyLayer;
use stormgate::control::{Config, ControlError};
use stormgate::fifo::{FifoLimitLayer, ResourceLimiter, ResourceLimits};
use tower::ServiceExt;

#[tokio::test(start_paused = true)]
async fn concurrent_sql_scans_get_the_expected_mix() {
    let limiter = ResourceLimiter::builder()
        .key(
            "db",
            ResourceLimits::default()
                .max_concurrent(NonZeroUsize::new(2).unwrap())
                .max_queue_depth(4)
                .queue_timeout(NonZeroDuration::new(Duration::from_secs(1)).unwrap()),
        )
        .key(
            "vector_search",
            ResourceLimits::default()
                .max_concurrent(NonZeroUsize::MIN)
                .queue_timeout(NonZeroDuration::new(Duration::from_millis(120)).unwrap()),
        )
        .build();
    let backend = app::Backend::new();
    let router = app::mcp_router(backend.clone())
        .layer(FifoLimitLayer::new(limiter).tool_key("sql_scan", "db"))
        .layer(ClassifyLayer::new());
    let sid = session(&router).await;

    let call = |i: usize, tool: &str, args: Value| {
        let router = router.clone();
        let req = request(
            Some(&sid),
            json!({"jsonrpc":"2.0","id":i,"method":"tools/call","params":{"name":tool,"arguments":args}}),
        );
        tokio::spawn(async move { message(router.oneshot(req).await.unwrap()).await })
    };
    let scans: Vec<_> = (1..=20)
        .map(|i| call(i, "sql_scan", json!({"table": format!("t{i}")})))
        .collect();
    let searches: Vec<_> = (21..=25)
        .map(|i| call(i, "vector_search", json!({"query": format!("q{i}")})))
        .collect();

    let mut ok_waits = Vec::new();
    let mut reasons = Vec::new();
    for h in scans {
        let (msg, wait) = h.await.unwrap();
        if let Some(err) = msg.get("error") {
            assert_eq!(err["code"], -32029);
            assert_eq!(err["data"]["scope"], "resource");
            assert!(err["data"]["retry_after_ms"].as_u64().unwrap() > 0);
            reasons.push(err["data"]["reason"].as_str().unwrap().to_owned());
        } else {
            assert_eq!(msg["result"]["isError"], false, "{msg}");
            ok_waits.push(wait.unwrap().0.as_millis());
        }
    }
    ok_waits.sort();
    // 2 run at once, 4 wait (each pair 200 ms behind the last), 14 find the queue full.
    assert_eq!(ok_waits, [0, 0, 200, 200, 400, 400]);
    assert_eq!(reasons, vec!["queue_full".to_owned(); 14]);
    assert_eq!(backend.scans(), 6);

    // One vector_search at a time, 50 ms each, 120 ms patience: 3 run, 2 time out.
    let mut outcomes = Vec::new();
    for h in searches {
        let (msg, wait) = h.await.unwrap();
        match msg.get("error") {
            Some(err) => {
                assert_eq!(err["data"]["reason"], "queue_timeout");
                outcomes.push(format!("timeout after {}", err["data"]["queue_wait_ms"]));
            }
            None => outcomes.push(format!("ok after {}", wait.unwrap().0.as_millis())),
        }
    }
    outcomes.sort();
    assert_eq!(
        outcomes,
        [
            "ok after 0",
            "ok after 100",
            "ok after 50",
            "timeout after 120",
            "timeout after 120"
        ]
    );
}

#[test]
fn the_example_config_holds_the_seed_presets() {
    let config = Config::load(std::path::Path::new(app::CONFIG)).unwrap();
    let limiter = config.fifo.limiter();
    assert_eq!(
        limiter.limits("export.arxiv.org"),
        ResourceLimits::arxiv().rate_per_second(std::num::NonZeroU32::new(5).unwrap())
    );
    assert_eq!(
        limiter.limits("export.arxiv.org").pacing(),
        ResourceLimits::arxiv().pacing()
    );
    assert_eq!(
        limiter.limits("eutils.ncbi.nlm.nih.gov"),
        ResourceLimits::ncbi_eutils()
    );
    assert_eq!(
        limiter.limits("rest.uniprot.org"),
        ResourceLimits::public_api()
    );
    let db = limiter.limits("db");
    assert_eq!(db.max_concurrent, NonZeroUsize::new(4));
    assert_eq!(db.max_queue_depth, Some(8));
    assert_eq!(
        db.queue_timeout,
        NonZeroDuration::new(Duration::from_secs(2)).ok()
    );
    assert!(limiter.limits("cache_get").is_unlimited());
    assert_eq!(config.fifo.tools["sql_scan"], "db");
    let gitee = limiter.limits("gitee");
    assert_eq!(gitee.window.unwrap().max.get(), 5);
    assert_eq!(gitee.max_concurrent_per_account, NonZeroUsize::new(2));
}

#[test]
fn an_invalid_config_names_the_field() {
    let err = Config::from_toml("[fifo.keys.db]\nmax_concurrent = 0\n").unwrap_err();
    // Rules serde checks (types that cannot hold the value) name the field too.
    let field = &err.config_error().expect("a field named").field;
    assert_eq!(field, "fifo.keys.db.max_concurrent", "{err}");
    let err = Config::from_toml("[fifo.keys.db]\nmax_queue = 3\n").unwrap_err();
    assert_eq!(
        err.config_error().unwrap().field,
        "fifo.keys.db.max_queue",
        "{err}"
    );
    assert!(err.to_string().contains("max_queue"), "{err}");
    // Text that is not TOML: where it breaks.
    let err = Config::from_toml("[fifo.keys.db\n").unwrap_err();
    assert!(matches!(err, ControlError::Toml(_)), "{err}");
    let err = Config::from_toml("[fifo.keys.db]\nqueue_timeout_ms = 0\n").unwrap_err();
    let err = err.config_error().expect("a field named");
    assert_eq!(err.field, "fifo.keys.db.queue_timeout_ms");
    assert_eq!(err.rule, "must be greater than 0");
}

/// Mapping a tool on a clone of the layer leaves the original's map as it was.
#[tokio::test]
async fn a_tool_key_on_a_clone_leaves_the_original_untouched() {
    let limiter = ResourceLimiter::builder()
        .key(
            "db",
            ResourceLimits::default().max_concurrent(NonZeroUsize::MIN),
        )
        .build();
    let original = FifoLimitLayer::new(limiter);
    let mapped = original.clone().tool_key("sql_scan", "db");
    assert!(format!("{mapped:?}").contains("sql_scan"));
    assert!(!format!("{original:?}").contains("sql_scan"));
}
