//! `/metrics` stays bounded whatever tool names and session ids clients send: 10 000 distinct
//! tool names (some of them long) on made-up and real sessions add no more than the label caps
//! allow. One test in this binary: it installs the process-wide recorder.

mod common;

#[path = "../examples/mcp_server/app.rs"]
mod app;

use common::{body_bytes, session, tool_call};
use serde_json::json;
use stormgate::control::Config;
use tower::ServiceExt;

/// Distinct values of `label` in a scrape.
fn values(scrape: &str, label: &str) -> usize {
    let needle = format!("{label}=\"");
    let mut seen = std::collections::BTreeSet::new();
    for line in scrape.lines().filter(|l| !l.starts_with('#')) {
        let mut rest = line;
        while let Some(at) = rest.find(&needle) {
            let tail = &rest[at + needle.len()..];
            let end = tail.find('"').unwrap_or(tail.len());
            seen.insert(tail[..end].to_owned());
            rest = &tail[end..];
        }
    }
    seen.len()
}

#[tokio::test(start_paused = true)]
async fn ten_thousand_tool_names_leave_the_scrape_bounded() {
    let handle = stormgate::metrics::prometheus_builder()
        .install_recorder()
        .unwrap();
    let config = Config::from_toml(include_str!("../examples/stormgate.toml")).unwrap();
    let (router, _control) = app::protected(app::Backend::new(), config).unwrap();
    let sid = session(&router).await;
    // One call in ten has a 256 KiB name; every other one is on a made-up session.
    let send = |i: usize| {
        let name = if i.is_multiple_of(10) {
            format!("{i}-{}", "x".repeat(256 * 1024))
        } else {
            format!("tool-{i}")
        };
        let on = if i.is_multiple_of(2) {
            sid.clone()
        } else {
            format!("made-up-{i}")
        };
        tool_call(&on, i, &name, json!({}))
    };
    // A few hundred names first: what the scrape holds once every cap is reached.
    let mut early = 0;
    for i in 0..10_000usize {
        if i == 300 {
            early = handle.render().len();
        }
        body_bytes(router.clone().oneshot(send(i)).await.unwrap()).await;
    }
    let scrape = handle.render();
    assert!(
        scrape.len() < 128 * 1024,
        "{} bytes after 10 000 tool names",
        scrape.len()
    );
    assert!(
        scrape.len() <= early + 4 * 1024,
        "{} bytes after 10 000 names, {early} after 300: it stopped growing",
        scrape.len()
    );
    // The example caps tool labels at 100 (then "other"); FIFO keys are only the configured
    // ones and the default; session ids only the top 10.
    assert!(
        values(&scrape, "tool") <= 101,
        "{} tool values",
        values(&scrape, "tool")
    );
    assert!(
        values(&scrape, "key") <= 4,
        "{} key values",
        values(&scrape, "key")
    );
    assert!(values(&scrape, "session") <= 10);
    assert!(
        scrape.lines().all(|l| l.len() < 1024),
        "no long label value"
    );
}
