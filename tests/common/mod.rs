//! Helpers shared by the integration tests.

#![allow(dead_code, unreachable_pub)]

use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use http::Request;
use http_body_util::BodyExt;
use stormgate::Calls;
use stormgate::call::Unclassified;

mod loopback;
mod node;
#[allow(unused_imports)]
pub use loopback::{client, echo_headers_upstream, json_of, rpc_post, serve};
#[allow(unused_imports)]
pub use node::{node_dir, report};

/// What the inner service saw of one request.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: http::Method,
    pub body: Bytes,
    pub calls: Option<Calls>,
    pub unclassified: Option<Unclassified>,
}

/// Everything the inner service saw, in order.
#[derive(Debug, Clone, Default)]
pub struct Recorder(Arc<Mutex<Vec<Seen>>>);

impl Recorder {
    pub fn seen(&self) -> Vec<Seen> {
        self.0.lock().unwrap().clone()
    }

    pub fn last(&self) -> Seen {
        self.seen().pop().expect("the inner service was called")
    }

    /// An inner service that records the request and answers with `respond(&seen)`.
    pub fn service(
        &self,
        respond: impl Fn(&Seen) -> Response + Clone + Send + Sync + 'static,
    ) -> tower::util::BoxCloneService<Request<Body>, Response, std::convert::Infallible> {
        let log = self.0.clone();
        tower::util::BoxCloneService::new(tower::service_fn(move |req: Request<Body>| {
            let log = log.clone();
            let respond = respond.clone();
            async move {
                let (parts, body) = req.into_parts();
                let seen = Seen {
                    method: parts.method.clone(),
                    body: body.collect().await.unwrap().to_bytes(),
                    calls: parts.extensions.get::<Calls>().cloned(),
                    unclassified: parts.extensions.get::<Unclassified>().copied(),
                };
                let response = respond(&seen);
                log.lock().unwrap().push(seen);
                Ok(response)
            }
        }))
    }
}

/// 200 `{}` as application/json.
pub fn ok_json(_: &Seen) -> Response {
    let mut res = Response::new(Body::from("{}"));
    res.headers_mut()
        .insert("content-type", "application/json".parse().unwrap());
    res
}

/// A POST to /mcp with a JSON body.
pub fn post() -> http::request::Builder {
    Request::post("/mcp")
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
}

pub fn post_body(body: impl Into<Bytes>) -> Request<Body> {
    post().body(Body::from(body.into())).unwrap()
}

pub async fn body_json(res: Response) -> serde_json::Value {
    let bytes = res.into_body().collect().await.unwrap().to_bytes();
    serde_json::from_slice(&bytes)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&bytes)))
}

pub async fn body_bytes(res: Response) -> Bytes {
    res.into_body().collect().await.unwrap().to_bytes()
}

// --- Talking MCP to an in-process router (rmcp's session handshake, SSE answers) ---

/// A POST to `/mcp` with a JSON-RPC body, on `session` when given.
pub fn request(session: Option<&str>, body: serde_json::Value) -> Request<Body> {
    request_as(None, session, body)
}

/// The same, from `tenant` (an `x-tenant` header, for stacks configured to read it).
pub fn request_as(
    tenant: Option<&str>,
    session: Option<&str>,
    body: serde_json::Value,
) -> Request<Body> {
    let mut req = Request::post("/mcp")
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("host", "localhost");
    if let Some(t) = tenant {
        req = req.header("x-tenant", t);
    }
    if let Some(s) = session {
        req = req
            .header("mcp-session-id", s)
            .header("mcp-protocol-version", "2025-11-25");
    }
    req.body(Body::from(body.to_string())).unwrap()
}

/// The JSON-RPC message of an answer (the JSON body, or the SSE event carrying it), and the
/// queue wait the FIFO layer recorded.
pub async fn message(res: Response) -> (serde_json::Value, Option<stormgate::fifo::QueueWait>) {
    let wait = res
        .extensions()
        .get::<stormgate::fifo::QueueWait>()
        .copied();
    let bytes = res.into_body().collect().await.unwrap().to_bytes();
    let text = String::from_utf8(bytes.to_vec()).unwrap();
    let json = text
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(str::trim)
        .find(|d| d.contains("\"jsonrpc\""))
        .unwrap_or(text.trim())
        .to_owned();
    (serde_json::from_str(&json).unwrap(), wait)
}

/// Opens an MCP session on `router` (initialize + initialized) and returns its id.
pub async fn session(router: &axum::Router) -> String {
    session_as(router, None).await
}

/// The same, for `tenant` (an `x-tenant` header).
pub async fn session_as(router: &axum::Router, tenant: Option<&str>) -> String {
    use tower::ServiceExt;
    let init = serde_json::json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{
        "protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}});
    let res = router
        .clone()
        .oneshot(request_as(tenant, None, init))
        .await
        .unwrap();
    let id = res.headers()["mcp-session-id"].to_str().unwrap().to_owned();
    message(res).await;
    let done = serde_json::json!({"jsonrpc":"2.0","method":"notifications/initialized"});
    router
        .clone()
        .oneshot(request_as(tenant, Some(&id), done))
        .await
        .unwrap();
    id
}

/// A `tools/call` on `session`.
pub fn tool_call(session: &str, id: usize, tool: &str, args: serde_json::Value) -> Request<Body> {
    request(
        Some(session),
        serde_json::json!({"jsonrpc":"2.0","id":id,"method":"tools/call",
            "params":{"name":tool,"arguments":args}}),
    )
}

// --- Log lines, captured ---

/// Every log line written on this thread while captured.
#[derive(Clone, Default)]
pub struct Logs(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Logs {
    type Writer = Logs;
    fn make_writer(&'a self) -> Logs {
        self.clone()
    }
}

impl Logs {
    /// Captures this thread's log lines (every level) until the guard drops.
    pub fn capture() -> (Logs, tracing::subscriber::DefaultGuard) {
        let logs = Logs::default();
        let guard = tracing::subscriber::set_default(
            tracing_subscriber::fmt()
                .with_max_level(tracing::Level::TRACE)
                .with_writer(logs.clone())
                .finish(),
        );
        // Another test thread may have cached a callsite's interest before this subscriber.
        tracing::callsite::rebuild_interest_cache();
        (logs, guard)
    }

    pub fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }
}

/// Waits (real time, for the OS's file events or signals) until `cond` holds; gives up after
/// 5 s with a panic naming `what`.
pub async fn until(what: &str, mut cond: impl FnMut() -> bool) {
    for _ in 0..100 {
        if cond() {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("{what} did not happen within 5 s");
}

/// Per scenario, each check's id and status, from the conformance suite's output directory.
pub fn conformance_results(
    dir: &std::path::Path,
) -> std::collections::BTreeMap<String, Vec<(String, String)>> {
    let mut out = std::collections::BTreeMap::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        // "server-<scenario>-<24-character timestamp>"
        let scenario = name[..name.len().saturating_sub(25)].to_owned();
        let checks: serde_json::Value =
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

/// The official conformance suite (pinned, installed by .ci/run) against the MCP endpoint
/// `url`; `name` tells its output directory apart. Its per-check results.
pub async fn conformance_suite(
    url: &str,
    name: &str,
) -> std::collections::BTreeMap<String, Vec<(String, String)>> {
    let dir = node_dir();
    let out = std::env::temp_dir().join(format!(
        "stormgate-conformance-{}-{name}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&out);
    let run = tokio::process::Command::new(format!("{dir}/node_modules/.bin/node"))
        .current_dir(&dir)
        .arg("node_modules/@modelcontextprotocol/conformance/dist/index.js")
        .args(["server", "--url", url, "-o"])
        .arg(&out)
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(std::time::Duration::from_secs(300), run)
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
    let results = conformance_results(&out);
    let _ = std::fs::remove_dir_all(&out);
    results
}

/// A layer's stack around tower-test's mock service, boxed.
pub type MockStack = tower::util::BoxCloneService<Request<Body>, Response, tower::BoxError>;
/// The handle that answers what reaches the mock.
pub type MockHandle = tower_test::mock::Handle<Request<Body>, Response>;
/// A call sent through a [`MockStack`] on its own task.
pub type MockAnswer = tokio::task::JoinHandle<Result<Response, tower::BoxError>>;

/// Sends `sql_scan` call `id` on session `s` through `stack` on its own task.
pub fn scan(stack: &MockStack, id: u64) -> MockAnswer {
    use tower::ServiceExt;
    let req = request(
        Some("s"),
        serde_json::json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
               "params": {"name": "sql_scan", "arguments": {"table": "t"}}}),
    );
    tokio::spawn(stack.clone().oneshot(req))
}

/// A whole JSON-RPC tool result answering `id`.
pub fn answer(id: u64) -> Response {
    let body = serde_json::json!({"jsonrpc": "2.0", "id": id,
                                  "result": {"content": [], "isError": false}});
    http::Response::builder()
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap()
}

/// The JSON-RPC id of the next request that reached tower-test's mock service, with the handle
/// to answer it, if one does within a second.
pub async fn reached(
    handle: &mut tower_test::mock::Handle<Request<Body>, http::Response<Body>>,
) -> Option<(u64, tower_test::mock::SendResponse<http::Response<Body>>)> {
    let (req, send) =
        tokio::time::timeout(std::time::Duration::from_secs(1), handle.next_request())
            .await
            .ok()??;
    let body = axum::body::to_bytes(req.into_body(), usize::MAX)
        .await
        .unwrap();
    let message: serde_json::Value = serde_json::from_slice(&body).unwrap();
    Some((message["id"].as_u64().unwrap(), send))
}
