//! The official MCP conformance suite (`@modelcontextprotocol/conformance`, pinned, installed by
//! .ci/run in target/ci-node) against the example server as shipped (examples/stormgate.toml)
//! in `adaptive` and in `off` mode: every check must give the same result in both. The example's
//! own tool set fails some scenarios (it has no resources, prompts or elicitation) in both
//! modes; that is fine, a difference is not.

mod common;

#[path = "../examples/mcp_server/app.rs"]
mod app;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use stormgate::control::{Config, Mode};

/// Per scenario, each check's id and status, from the suite's output directory.
fn results(dir: &Path) -> BTreeMap<String, Vec<(String, String)>> {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        // "server-<scenario>-<24-character timestamp>"
        let scenario = name[..name.len().saturating_sub(25)].to_owned();
        let checks: Value =
            serde_json::from_str(&std::fs::read_to_string(path.join("checks.json")).unwrap())
                .unwrap();
        let checks = checks
            .as_array()
            .unwrap()
            .iter()
            .map(|c| {
                (
                    c["id"].as_str().unwrap().to_owned(),
                    c["status"].as_str().unwrap().to_owned(),
                )
            })
            .collect();
        out.insert(scenario, checks);
    }
    out
}

async fn run_suite(mode: Mode) -> BTreeMap<String, Vec<(String, String)>> {
    let mut config = Config::load(Path::new(app::CONFIG)).unwrap();
    config.mode = mode;
    let (router, control) = app::protected(app::Backend::new(), config).unwrap();
    let _tasks = control.spawn();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        axum::serve(
            listener,
            router.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap()
    });
    let dir = common::node_dir();
    let out = std::env::temp_dir().join(format!(
        "stormgate-conformance-{}-{}",
        std::process::id(),
        mode.as_str()
    ));
    let _ = std::fs::remove_dir_all(&out);
    let run = tokio::process::Command::new(format!("{dir}/node_modules/.bin/node"))
        .current_dir(&dir)
        .arg("node_modules/@modelcontextprotocol/conformance/dist/index.js")
        .args(["server", "--url", &format!("http://{addr}/mcp"), "-o"])
        .arg(&out)
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(300), run)
        .await
        .expect("the suite finished within 300 s")
        .unwrap_or_else(|e| panic!("{dir}: {e} (.ci/run installs the suite there)"));
    // The suite exits non-zero when a scenario fails; the results are in its directory.
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains("Total:"),
        "the suite ran: {stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    server.abort();
    let results = results(&out);
    let _ = std::fs::remove_dir_all(&out);
    results
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
