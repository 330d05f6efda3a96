//! Every metric and label the dashboard's queries name exists in a scrape of the example
//! server driven through every refusal. One test in this binary: it installs the recorder.

mod common;
mod driver;

#[path = "../examples/mcp_server/app.rs"]
mod app;

use std::collections::BTreeSet;

fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = expr;
    while let Some(i) = rest.find("stormgate_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        names.insert(tail[..end].to_owned());
        rest = &tail[end..];
    }
    names
}

/// Label names in `by (...)` clauses and `{label=~...}` matchers.
fn label_names(expr: &str) -> BTreeSet<String> {
    let mut labels = BTreeSet::new();
    for (open, close) in [("by (", ')'), ("{", '}')] {
        let mut rest = expr;
        while let Some(i) = rest.find(open) {
            let inner = &rest[i + open.len()..];
            let end = inner.find(close).unwrap_or(inner.len());
            for part in inner[..end].split(',') {
                let name = part.split(['=', '!', '~']).next().unwrap_or("").trim();
                if !name.is_empty() && name != "le" && !name.starts_with('$') {
                    labels.insert(name.to_owned());
                }
            }
            rest = &inner[end..];
        }
    }
    labels
}

#[tokio::test(start_paused = true)]
async fn every_metric_and_label_of_every_panel_is_emitted() {
    let handle = stormgate::metrics::prometheus_builder()
        .install_recorder()
        .unwrap();
    let (router, control) = app::protected(app::Backend::new(), driver::config()).unwrap();
    let seen = driver::drive(&router, &control).await;
    assert_eq!(
        seen,
        driver::REASONS
            .iter()
            .map(|r| r.to_string())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect::<Vec<_>>(),
        "every refusal reason was produced"
    );
    let scrape = handle.render();
    // The shared budget's panels need Redis: tests/prometheus.rs checks them against a
    // Redis-backed server.
    let queries: Vec<_> = driver::panel_queries()
        .into_iter()
        .filter(|q| q.row != driver::SHARED_ROW)
        .collect();
    assert!(queries.len() >= 20, "{} queries", queries.len());
    for driver::PanelQuery { title, expr, .. } in &queries {
        for metric in metric_names(expr) {
            assert!(
                scrape.lines().any(|l| l.starts_with(&format!("{metric}{{"))
                    || l.starts_with(&format!("{metric} "))),
                "panel {title:?}: {metric} is not in the scrape"
            );
        }
        for label in label_names(expr) {
            assert!(
                scrape.contains(&format!("{label}=\"")),
                "panel {title:?}: label {label} is not in the scrape"
            );
        }
    }
}
