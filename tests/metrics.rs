//! The metrics the classify, admit and FIFO stages emit, read back from a Prometheus scrape.
//! One test in this binary: it installs the process-wide recorder.

use std::num::NonZeroUsize;
use std::time::Duration;
use stormgate::valid::NonZeroDuration;

use axum::body::Body;
use http::Request;
use stormgate::admit::AdmitLayer;
use stormgate::classify::ClassifyLayer;
use stormgate::fifo::{ResourceLimiter, ResourceLimits};
use stormgate::metrics::CallMetrics;
use stormgate::{Call, Reason, Rejection, Scope};
use tower::{Layer, ServiceExt};

fn line<'a>(scrape: &'a str, prefix: &str) -> Option<&'a str> {
    scrape.lines().find(|l| l.starts_with(prefix))
}

#[tokio::test(start_paused = true)]
async fn every_stage_is_counted() {
    let handle = stormgate::metrics::prometheus_builder()
        .install_recorder()
        .unwrap();

    // FIFO: 1 admitted at once, 1 queued then admitted, 1 refused (queue full), 1 timed out.
    let limiter = ResourceLimiter::builder()
        .key(
            "db",
            ResourceLimits::default()
                .max_concurrent(NonZeroUsize::MIN)
                .max_queue_depth(1)
                .queue_timeout(NonZeroDuration::new(Duration::from_millis(100)).unwrap()),
        )
        .build();
    let first = limiter.acquire("db", None).await.unwrap();
    let queued = tokio::spawn({
        let l = limiter.clone();
        async move { l.acquire("db", None).await.map(drop) }
    });
    while limiter.queue_depth("db") == 0 {
        tokio::task::yield_now().await;
    }
    assert!(limiter.acquire("db", None).await.is_err()); // queue full
    drop(first);
    queued.await.unwrap().unwrap();
    let _held = limiter.acquire("db", None).await.unwrap();
    assert!(limiter.acquire("db", None).await.is_err()); // times out after 100 ms

    // Classify + admit: a request refused, a notification, a body that is not JSON.
    let refuse = AdmitLayer::new(|_: &Call| {
        Err(Rejection::new(
            Reason::GlobalBudgetExceeded,
            Scope::Global,
            Duration::from_secs(1),
        ))
    });
    let inner = tower::service_fn(|_req: Request<Body>| async {
        Ok::<_, std::convert::Infallible>(http::Response::new(Body::empty()))
    });
    let svc = ClassifyLayer::new()
        .observers([std::sync::Arc::new(CallMetrics::default())
            as std::sync::Arc<dyn stormgate::outcome::Observer>])
        .layer(refuse.layer(inner));
    for body in [
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x"}}"#,
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        "not json",
    ] {
        let req = Request::post("/mcp").body(Body::from(body)).unwrap();
        svc.clone().oneshot(req).await.unwrap();
    }

    let scrape = handle.render();
    for (prefix, value) in [
        (r#"stormgate_fifo_admitted_total{key="db"}"#, "3"),
        (r#"stormgate_fifo_queued_total{key="db"}"#, "2"),
        (
            r#"stormgate_fifo_rejected_total{key="db",reason="queue_full"}"#,
            "1",
        ),
        (
            r#"stormgate_fifo_rejected_total{key="db",reason="queue_timeout"}"#,
            "1",
        ),
        (r#"stormgate_fifo_queue_depth{key="db"}"#, "0"),
        (r#"stormgate_fifo_queue_wait_seconds_count{key="db"}"#, "3"),
        // Real histograms: all three waits were instant in paused time.
        (
            r#"stormgate_fifo_queue_wait_seconds_bucket{key="db",le="0.001"}"#,
            "3",
        ),
        (r#"stormgate_messages_total{kind="request"}"#, "1"),
        (r#"stormgate_messages_total{kind="notification"}"#, "1"),
        (r#"stormgate_unclassified_total{reason="not_json"}"#, "1"),
        (
            r#"stormgate_rejected_total{reason="global_budget_exceeded",scope="global",tenant="anonymous",tool="x"}"#,
            "1",
        ),
        (
            r#"stormgate_calls_total{tenant="anonymous",tool="x",result="rejected"}"#,
            "1",
        ),
    ] {
        let found = line(&scrape, prefix).unwrap_or_else(|| panic!("{prefix} missing:\n{scrape}"));
        assert_eq!(found.rsplit(' ').next(), Some(value), "{found}");
    }
}
