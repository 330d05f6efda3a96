//! Real MCP clients against the example server over real HTTP: what an agent's SDK surfaces of
//! a refusal. The official Python SDK (`mcp`, pinned and installed by .ci/run) runs
//! tests/clients/python_client.py in each protocol mode it speaks (the legacy handshake and
//! 2026-07-28), and the official TypeScript SDK (on Node 22 from the `node@22` package, both
//! pinned and installed by .ci/run in target/ci-node) runs tests/clients/ts_client.mjs
//! (2025-11-25), each with both rejection forms; tests/clients/python_tokens.py runs two
//! session-less agents that differ only by their bearer tokens.

mod common;

#[path = "../examples/mcp_server/app.rs"]
mod app;

use serde_json::Value;
use stormgate::control::{Config, Control};
use stormgate::valid::Positive;

/// One session may make six quick calls, then one a second: the five tools once and a short
/// storm of `cache_get` are enough to be refused.
fn config(tool_result: bool) -> Config {
    let mut c = Config::default();
    c.sessions.base_budget = Positive::new(1.0).unwrap();
    c.sessions.burst = Positive::new(6.0).unwrap();
    c.rejection.tool_result = tool_result;
    c
}

async fn serve(config: Config) -> (String, Control) {
    let (router, control) = app::protected(app::Backend::new(), config).unwrap();
    let _ = control.spawn();
    let addr = common::serve(router).await;
    (format!("http://{addr}/mcp"), control)
}

/// The Python driver, with the `mcp` package of `STORMGATE_PYTHON` (default `python3`).
async fn python(url: &str, mode: &str) -> Value {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/clients/python_client.py"
    );
    let python = std::env::var("STORMGATE_PYTHON").unwrap_or_else(|_| "python3".into());
    let mut command = tokio::process::Command::new(&python);
    command.args([script, url, mode]);
    common::report(command, &format!("the Python client ({python} with mcp)")).await
}

/// The TypeScript driver, with Node and the SDK installed in `STORMGATE_NODE_DIR` (default
/// `target/ci-node`, where .ci/run installs them).
async fn typescript(url: &str, storm_tool: &str) -> Value {
    let dir = common::node_dir();
    let mut command = tokio::process::Command::new(format!("{dir}/node_modules/.bin/node"));
    command.current_dir(&dir).args([
        "--input-type=module",
        "-e",
        include_str!("clients/ts_client.mjs"),
        url,
        storm_tool,
    ]);
    common::report(
        command,
        &format!("the TypeScript client (node@22 and the SDK in {dir})"),
    )
    .await
}

/// What every mode and form must give: every tool listed and callable, a refusal whose words
/// and data say when to come back, and success after waiting that long.
fn assert_common(report: &Value) {
    let tools: Vec<&str> = report["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert_eq!(
        tools,
        [
            "cache_get",
            "create_order",
            "order_count",
            "read_doc",
            "sql_scan",
            "vector_search"
        ],
        "{report}"
    );
    for (tool, answer) in report["calls"].as_object().unwrap() {
        assert_eq!(answer["ok"], true, "{tool}: {answer}");
    }
    let refusal = &report["refusal"];
    assert!(refusal.is_object(), "the storm was refused: {report}");
    assert_eq!(report["after_waiting"]["ok"], true, "{report}");
}

/// A refusal in the tool-result form: `isError`, the sentence as its text, the data in
/// `structuredContent`.
fn assert_tool_result(refusal: &Value) {
    assert_eq!(refusal["is_error"], true, "{refusal}");
    assert_hint(refusal["text"].as_str().unwrap(), &refusal["structured"]);
}

fn assert_hint(message: &str, data: &Value) {
    let ms = data["retry_after_ms"].as_u64().unwrap();
    assert!(ms > 0 && ms <= 60_000, "{data}");
    assert_eq!(data["retryAfterMs"], ms);
    assert_eq!(data["notProcessed"], true);
    // Its own session refused it: the plain budget, or the budget its storm score cut.
    let reason = data["reason"].as_str().unwrap();
    assert!(
        ["session_budget_exceeded", "session_storm"].contains(&reason),
        "{data}"
    );
    assert_eq!(
        message,
        format!(
            "rate limited: retry after {ms} ms ({})",
            reason.replace('_', " ")
        )
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_legacy_handshake_reads_the_error_form() {
    let (url, _control) = serve(config(false)).await;
    let report = python(&url, "legacy").await;
    assert_common(&report);
    let refusal = &report["refusal"];
    assert_eq!(refusal["exception"], "MCPError", "{refusal}");
    assert_eq!(refusal["code"], -32029);
    assert_hint(refusal["message"].as_str().unwrap(), &refusal["data"]);
    assert_eq!(
        report["other_client"]["ok"], true,
        "another session is not refused for A's storm: {report}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_legacy_handshake_reads_the_tool_result_form() {
    let (url, _control) = serve(config(true)).await;
    let report = python(&url, "legacy").await;
    assert_common(&report);
    assert_tool_result(&report["refusal"]);
    assert_eq!(report["other_client"]["ok"], true, "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_2026_07_28_reads_the_error_form() {
    let (url, _control) = serve(config(false)).await;
    let report = python(&url, "2026-07-28").await;
    assert_common(&report);
    let refusal = &report["refusal"];
    assert_eq!(refusal["exception"], "MCPError", "{refusal}");
    assert_eq!(
        refusal["code"], 429,
        "the modern code, outside the reserved range"
    );
    assert_hint(refusal["message"].as_str().unwrap(), &refusal["data"]);
    // Without `Mcp-Session-Id` (2026-07-28 has none) the identity ladder tells the two agents
    // apart by the names they declare (same host, and the SDK opens a new connection for most
    // requests): B is not refused for A's storm. Two instances declaring the same name from one
    // host would be one session unless they send a `session_meta_key`.
    assert_eq!(report["other_client"]["ok"], true, "{report}");
}

/// Two agents of the same SDK on one host, declaring the same name, each with its own bearer
/// token, on the session-less protocol: the credential tells them apart, so B is never refused
/// for A's storm (without the credential rung of the identity ladder both would be one
/// session).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_2026_07_28_agents_with_their_own_tokens_are_apart() {
    let (url, _control) = serve(config(false)).await;
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/clients/python_tokens.py"
    );
    let python = std::env::var("STORMGATE_PYTHON").unwrap_or_else(|_| "python3".into());
    let mut command = tokio::process::Command::new(&python);
    command.args([script, &url, "2026-07-28"]);
    let report = common::report(command, &format!("the Python client ({python} with mcp)")).await;
    assert_eq!(report["first_b"]["ok"], true, "{report}");
    assert!(
        report["refusal"].is_object(),
        "A's storm is refused: {report}"
    );
    for answer in report["other_client"].as_array().unwrap() {
        assert_eq!(
            answer["ok"], true,
            "B is not refused for A's storm: {report}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_2026_07_28_reads_the_tool_result_form() {
    let (url, _control) = serve(config(true)).await;
    let report = python(&url, "2026-07-28").await;
    assert_common(&report);
    let refusal = &report["refusal"];
    assert_eq!(
        refusal["is_error"], true,
        "a valid result, not a ValidationError: {refusal}"
    );
    assert_hint(refusal["text"].as_str().unwrap(), &refusal["structured"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typescript_sdk_reads_the_error_form() {
    let (url, _control) = serve(config(false)).await;
    let report = typescript(&url, "cache_get").await;
    assert_eq!(report["protocol"], "2025-11-25");
    assert_common(&report);
    let refusal = &report["refusal"];
    assert_eq!(refusal["exception"], "McpError", "{refusal}");
    assert_eq!(refusal["code"], -32029);
    // The SDK prefixes the code: the sentence after it is ours, hint included.
    let message = refusal["message"].as_str().unwrap();
    let ours = message
        .strip_prefix("MCP error -32029: ")
        .unwrap_or_else(|| panic!("{message}"));
    assert_hint(ours, &refusal["data"]);
    assert_eq!(report["other_client"]["ok"], true, "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typescript_sdk_reads_the_tool_result_form() {
    let (url, _control) = serve(config(true)).await;
    let report = typescript(&url, "cache_get").await;
    assert_common(&report);
    assert_tool_result(&report["refusal"]);
    assert_eq!(report["other_client"]["ok"], true, "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typescript_sdk_accepts_the_tool_result_form_of_a_tool_with_an_output_schema() {
    // `order_count` declares an outputSchema: the SDK validates structuredContent against it
    // even on isError (-32602 "Structured content does not match the tool's output schema"),
    // so the refusal's data goes in _meta, learned from the tools/list answer the client read.
    let (url, control) = serve(config(true)).await;
    let report = typescript(&url, "order_count").await;
    assert_common(&report);
    assert!(
        control.classify().tool_schemas().declares("order_count"),
        "learned from tools/list"
    );
    let refusal = &report["refusal"];
    assert_eq!(refusal["is_error"], true, "{refusal}");
    assert_eq!(refusal["structured"], Value::Null, "{refusal}");
    let data = &refusal["meta"][stormgate::mcp::META_KEY];
    assert_hint(refusal["text"].as_str().unwrap(), data);
}
