//! The official MCP conformance suite (`@modelcontextprotocol/conformance`, pinned, installed by
//! .ci/run in target/ci-node) against the example server as shipped (examples/stormgate.toml)
//! in `adaptive` and in `off` mode: every check must give the same result in both. The example's
//! own tool set fails some scenarios (it has no resources, prompts or elicitation) in both
//! modes; that is fine, a difference is not.

mod common;

#[path = "../examples/mcp_server/app.rs"]
mod app;

use std::collections::BTreeMap;
use std::path::Path;

use stormgate::control::{Config, Mode};

/// The suite against the example server as shipped, in `mode`.
async fn run_suite(mode: Mode) -> BTreeMap<String, Vec<(String, String)>> {
    let mut config = Config::load(Path::new(app::CONFIG)).unwrap();
    config.mode = mode;
    let (router, control) = app::protected(app::Backend::new(), config).unwrap();
    let _tasks = control.spawn();
    let addr = common::serve(router).await;
    common::conformance_suite(&format!("http://{addr}/mcp"), mode.as_str()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_conformance_suite_gives_the_same_results_in_adaptive_and_off() {
    let adaptive = run_suite(Mode::Adaptive).await;
    let off = run_suite(Mode::Off).await;
    assert!(adaptive.len() >= 20, "{} scenarios", adaptive.len());
    assert!(
        adaptive
            .values()
            .flatten()
            .any(|(_, status)| status == "SUCCESS"),
        "some checks pass"
    );
    assert_eq!(adaptive, off, "stormgate changes no conformance result");
}
