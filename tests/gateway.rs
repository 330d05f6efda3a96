//! The gateway (`stormgate::gateway`) in front of real upstreams
//! over loopback HTTP:
//!
//! * the official Python SDK's MCPServer (tests/gateway/python_server.py) and the TypeScript
//!   SDK's McpServer (tests/gateway/ts_server.mjs), both pinned and installed by .ci/run,
//!   driven through the gateway by both SDKs' clients: every tool listed and called, progress
//!   and log notifications through the stream, a storm from one session refused with the
//!   contract while another session is untouched;
//! * small axum upstreams in this process for what must be observed from the upstream's side:
//!   which headers arrive, SSE events passing one by one, the upstream request dropped when the
//!   client goes, 502 and 504 with the request's id.
//!
//! The `stormgate` binary itself is tested in cli/tests/binary.rs.

mod common;

use common::{client, echo_headers_upstream, json_of, rpc_post};
use stormgate::valid::{NonZeroDuration, Positive};

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::any;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use stormgate::control::{Config, Control, Mode};
use stormgate::gateway::{GatewayConfig, Proxy};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

// ---------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------

/// The gateway in this process: the proxy to `upstream` inside the whole stack from `config`;
/// the gateway's MCP URL and its control handle.
async fn gateway(upstream: &str, mut config: Config) -> (String, Control) {
    let gateway = config.gateway.get_or_insert_with(GatewayConfig::default);
    gateway.upstream = Some(upstream.to_owned());
    let proxy = Proxy::new(gateway).unwrap();
    let control = Control::new(config).unwrap();
    let _ = control.spawn();
    let addr = common::serve(control.wrap(Router::new().route_service("/mcp", proxy))).await;
    (format!("http://{addr}/mcp"), control)
}

/// Sets its flag when dropped: what the upstream's handler holds, to see it cancelled.
struct Dropped(Arc<AtomicBool>);

impl Drop for Dropped {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

// ---------------------------------------------------------------------------------------
// In-process upstreams: what the upstream sees
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn mcp_headers_pass_both_ways_and_credentials_only_when_listed() {
    let upstream = common::serve(echo_headers_upstream()).await;
    let upstream_url = format!("http://{upstream}/mcp");
    let request_headers = [
        ("mcp-session-id", "s-1"),
        ("mcp-protocol-version", "2025-06-18"),
        ("mcp-method", "tools/list"),
        ("last-event-id", "e-9"),
        ("authorization", "Bearer client-secret"),
        ("cookie", "sid=abc"),
        ("x-api-key", "k-1"),
        ("connection", "keep-alive, x-private"),
        ("x-private", "hop"),
        ("proxy-authorization", "Basic xyz"),
        ("te", "trailers"),
        ("x-random", "not forwarded"),
    ];
    let list = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"});

    // Default: no credential passes.
    let (url, _control) = gateway(&upstream_url, Config::default()).await;
    let answer = client()
        .request(rpc_post(
            &format!("{url}?tenant=t"),
            &list,
            &request_headers,
        ))
        .await
        .unwrap();
    let (status, headers, body) = json_of(answer).await;
    assert_eq!(status, StatusCode::OK);
    let seen = &body["result"]["headers"];
    for (name, value) in &request_headers[..4] {
        assert_eq!(seen[*name], *value, "{name} passes: {seen}");
    }
    assert_eq!(seen["content-type"], "application/json");
    assert_eq!(seen["accept"], "application/json, text/event-stream");
    assert_eq!(seen["host"], upstream.to_string(), "Host is the upstream's");
    for name in [
        "authorization",
        "cookie",
        "x-api-key",
        "connection",
        "x-private",
        "proxy-authorization",
        "te",
        "x-random",
    ] {
        assert!(seen.get(name).is_none(), "{name} must not pass: {seen}");
    }
    assert_eq!(body["result"]["method"], "POST");
    assert_eq!(
        body["result"]["query"], "tenant=t",
        "the query string passes"
    );
    // The answer's headers come back, but not the hop-by-hop ones.
    assert_eq!(headers["mcp-session-id"], "upstream-session-1");
    assert_eq!(headers["x-upstream"], "yes");
    assert!(headers.get("x-secret-hop").is_none(), "{headers:?}");
    assert!(headers.get("keep-alive").is_none(), "{headers:?}");

    // Listed credentials pass, and only those.
    let config = {
        let mut built = Config::default();
        built.gateway = Some({
            let mut built = GatewayConfig::default();
            built.forward_headers = vec!["Authorization".into(), "x-api-key".into()];
            built
        });
        built
    };
    let (url, _control) = gateway(&upstream_url, config).await;
    let answer = client()
        .request(rpc_post(&url, &list, &request_headers))
        .await
        .unwrap();
    let (_, _, body) = json_of(answer).await;
    let seen = &body["result"]["headers"];
    assert_eq!(seen["authorization"], "Bearer client-secret");
    assert_eq!(seen["x-api-key"], "k-1");
    assert!(seen.get("cookie").is_none(), "{seen}");

    // GET and DELETE reach the upstream too.
    for method in ["GET", "DELETE"] {
        let req = Request::builder()
            .method(method)
            .uri(&url)
            .header("mcp-session-id", "s-1")
            .body(Body::empty())
            .unwrap();
        let (status, _, body) = json_of(client().request(req).await.unwrap()).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body["result"]["method"], method);
        assert_eq!(body["result"]["headers"]["mcp-session-id"], "s-1");
    }
}

/// An SSE upstream: on GET, one event at once, the next only when `next` is notified, and so
/// on, forever; the stream sets `dropped` when it is dropped.
fn sse_upstream(next: Arc<tokio::sync::Notify>, dropped: Arc<AtomicBool>) -> Router {
    Router::new().route(
        "/mcp",
        any(move |req: Request<Body>| {
            let next = next.clone();
            let dropped = dropped.clone();
            async move {
                let last = req
                    .headers()
                    .get("last-event-id")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("none")
                    .to_owned();
                let guard = Dropped(dropped);
                let events = futures::stream::unfold((0u32, guard), move |(n, guard)| {
                    let next = next.clone();
                    let last = last.clone();
                    async move {
                        if n > 0 {
                            next.notified().await;
                        }
                        let event = format!(
                            "id: {n}\nevent: message\ndata: {{\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{{\"n\":{n},\"after\":\"{last}\"}}}}\n\n"
                        );
                        Some((Ok::<_, Infallible>(Bytes::from(event)), (n + 1, guard)))
                    }
                });
                Response::builder()
                    .header("content-type", "text/event-stream")
                    .header("cache-control", "no-cache")
                    .body(Body::from_stream(events))
                    .unwrap()
            }
        }),
    )
}

#[tokio::test]
async fn sse_events_pass_one_by_one_and_a_client_that_goes_drops_the_upstream_stream() {
    let next = Arc::new(tokio::sync::Notify::new());
    let dropped = Arc::new(AtomicBool::new(false));
    let upstream = common::serve(sse_upstream(next.clone(), dropped.clone())).await;
    let (url, _control) = gateway(&format!("http://{upstream}/mcp"), Config::default()).await;
    let req = Request::get(&url)
        .header("accept", "text/event-stream")
        .header("mcp-session-id", "s-1")
        .header("last-event-id", "41")
        .body(Body::empty())
        .unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(5), client().request(req))
        .await
        .expect("the stream's headers come at once")
        .unwrap();
    assert_eq!(answer.status(), StatusCode::OK);
    assert_eq!(answer.headers()["content-type"], "text/event-stream");
    let mut body = answer.into_body();
    let mut read = String::new();
    for n in 0..3u32 {
        // Each event arrives before the upstream writes the next one: nothing is buffered.
        let want = format!("\"n\":{n},\"after\":\"41\"");
        while !read.contains(&want) {
            let frame = tokio::time::timeout(Duration::from_secs(5), body.frame())
                .await
                .unwrap_or_else(|_| panic!("event {n} held back; got {read:?}"))
                .expect("the stream is held open")
                .unwrap();
            if let Ok(data) = frame.into_data() {
                read.push_str(&String::from_utf8_lossy(&data));
            }
        }
        assert!(
            !read.contains(&format!("\"n\":{}", n + 1)),
            "event {} came before it was written",
            n + 1
        );
        next.notify_one();
    }
    assert!(
        !dropped.load(Ordering::SeqCst),
        "the long-lived stream is held"
    );
    // The client goes: the upstream's stream is dropped too.
    drop(body);
    common::until("the upstream stream dropped", || {
        dropped.load(Ordering::SeqCst)
    })
    .await;
}

#[tokio::test]
async fn a_client_that_goes_before_the_answer_drops_the_upstream_request() {
    let dropped = Arc::new(AtomicBool::new(false));
    let started = Arc::new(AtomicUsize::new(0));
    let (d, s) = (dropped.clone(), started.clone());
    let upstream = common::serve(Router::new().route(
        "/mcp",
        any(move || {
            let guard = Dropped(d.clone());
            s.fetch_add(1, Ordering::SeqCst);
            async move {
                let _guard = guard;
                std::future::pending::<()>().await;
                "never"
            }
        }),
    ))
    .await;
    let (url, _control) = gateway(&format!("http://{upstream}/mcp"), Config::default()).await;
    let call = json!({"jsonrpc": "2.0", "id": 5, "method": "tools/call",
                      "params": {"name": "slow", "arguments": {}}});
    let request = tokio::spawn(client().request(rpc_post(&url, &call, &[])));
    common::until("the upstream handler started", || {
        started.load(Ordering::SeqCst) == 1
    })
    .await;
    assert!(!dropped.load(Ordering::SeqCst));
    // The client gives up (its connection closes): the gateway drops the upstream request,
    // whose connection closes, and the upstream's handler is dropped.
    request.abort();
    common::until("the upstream request dropped", || {
        dropped.load(Ordering::SeqCst)
    })
    .await;
}

#[tokio::test]
async fn an_unreachable_upstream_is_502_with_the_request_id() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let (url, _control) = gateway(&format!("http://127.0.0.1:{port}/mcp"), Config::default()).await;
    let call = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                      "params": {"name": "echo", "arguments": {"text": "x"}}});
    let (status, headers, body) =
        json_of(client().request(rpc_post(&url, &call, &[])).await.unwrap()).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY);
    assert_eq!(headers["content-type"], "application/json");
    assert_eq!(body["jsonrpc"], "2.0");
    assert_eq!(body["id"], 7, "{body}");
    assert_eq!(
        body["error"]["code"],
        stormgate::gateway::UPSTREAM_ERROR_CODE
    );
    assert_eq!(body["error"]["data"]["reason"], "upstream_unreachable");
    // A GET carries no id: null.
    let get = Request::get(&url).body(Body::empty()).unwrap();
    let (status, _, body) = json_of(client().request(get).await.unwrap()).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY);
    assert_eq!(body["id"], Value::Null);
    // In off with pass_through nothing is classified, so the id is not known: null (as
    // documented).
    let mut config = Config::default();
    config.mode = Mode::Off;
    config.off = stormgate::control::Off::PassThrough;
    let (url, _control) = gateway(&format!("http://127.0.0.1:{port}/mcp"), config).await;
    let (status, _, body) =
        json_of(client().request(rpc_post(&url, &call, &[])).await.unwrap()).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY);
    assert_eq!(body["id"], Value::Null, "{body}");
}

#[tokio::test]
async fn an_upstream_slower_than_the_request_timeout_is_504_with_the_request_id() {
    // Every call takes 30 s; notifications are taken at once and kept.
    let notified = Arc::new(std::sync::Mutex::new(Vec::<Value>::new()));
    let kept = notified.clone();
    let upstream = common::serve(Router::new().route(
        "/mcp",
        any(move |body: String| {
            let kept = kept.clone();
            async move {
                let message: Value = serde_json::from_str(&body).unwrap_or_default();
                if message.get("id").is_none() {
                    kept.lock().unwrap().push(message);
                    return StatusCode::ACCEPTED;
                }
                tokio::time::sleep(Duration::from_secs(30)).await;
                StatusCode::OK
            }
        }),
    ))
    .await;
    let config = {
        let mut built = Config::default();
        built.gateway = Some({
            let mut built = GatewayConfig::default();
            built.request_timeout = NonZeroDuration::new(Duration::from_millis(300)).unwrap();
            built
        });
        built
    };
    let (url, _control) = gateway(&format!("http://{upstream}/mcp"), config).await;
    let call = json!({"jsonrpc": "2.0", "id": "req-a", "method": "tools/call",
                      "params": {"name": "slow", "arguments": {}}});
    let started = std::time::Instant::now();
    let (status, _, body) =
        json_of(client().request(rpc_post(&url, &call, &[])).await.unwrap()).await;
    let took = started.elapsed();
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(body["id"], "req-a", "{body}");
    assert_eq!(body["error"]["data"]["reason"], "upstream_timeout");
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(5),
        "{took:?}"
    );
    // The upstream may still be running the call nobody waits for now: it is told so.
    common::until("the upstream told to cancel", || {
        !notified.lock().unwrap().is_empty()
    })
    .await;
    let notified = notified.lock().unwrap();
    assert_eq!(notified.len(), 1, "{notified:?}");
    assert_eq!(notified[0]["method"], "notifications/cancelled");
    assert_eq!(notified[0]["params"]["requestId"], "req-a");
}

// ---------------------------------------------------------------------------------------
// Real MCP servers and clients
// ---------------------------------------------------------------------------------------

/// A running upstream MCP server process, killed when dropped.
struct Upstream {
    _child: tokio::process::Child,
    url: String,
}

/// Starts `command` and waits for the `PORT <n>` line it prints when it accepts connections.
async fn start(mut command: tokio::process::Command, what: &str) -> Upstream {
    command
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .kill_on_drop(true);
    let mut child = command
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: {e} (.ci/run installs it)"));
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .unwrap_or_else(|_| panic!("{what} not ready within 30 s"))
        .unwrap()
        .unwrap_or_else(|| panic!("{what} exited before it was ready (.ci/run installs it)"));
    let port: u16 = line
        .strip_prefix("PORT ")
        .and_then(|p| p.trim().parse().ok())
        .unwrap_or_else(|| panic!("{what} printed {line:?}"));
    Upstream {
        _child: child,
        url: format!("http://127.0.0.1:{port}/mcp"),
    }
}

fn python() -> String {
    std::env::var("STORMGATE_PYTHON").unwrap_or_else(|_| "python3".into())
}

async fn python_server() -> Upstream {
    let mut command = tokio::process::Command::new(python());
    command.arg(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/gateway/python_server.py"
    ));
    start(
        command,
        &format!("the Python MCP server ({} with mcp)", python()),
    )
    .await
}

async fn ts_server() -> Upstream {
    let dir = common::node_dir();
    let mut command = tokio::process::Command::new(format!("{dir}/node_modules/.bin/node"));
    command.current_dir(&dir).args([
        "--input-type=module",
        "-e",
        include_str!("gateway/ts_server.mjs"),
    ]);
    start(
        command,
        &format!("the TypeScript MCP server (node@22 and the SDK in {dir})"),
    )
    .await
}

async fn python_client(url: &str) -> Value {
    let mut command = tokio::process::Command::new(python());
    command.args([
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/gateway/python_client.py"
        ),
        url,
    ]);
    common::report(command, "the Python client").await
}

async fn ts_client(url: &str) -> Value {
    let dir = common::node_dir();
    let mut command = tokio::process::Command::new(format!("{dir}/node_modules/.bin/node"));
    command.current_dir(&dir).args([
        "--input-type=module",
        "-e",
        include_str!("gateway/ts_client.mjs"),
        url,
    ]);
    common::report(command, "the TypeScript client").await
}

/// One session may make six quick calls, then one a second: the four tools once and a short
/// storm of `echo` are enough to be refused.
fn storm_config() -> Config {
    let mut c = Config::default();
    c.sessions.base_budget = Positive::new(1.0).unwrap();
    c.sessions.burst = Positive::new(6.0).unwrap();
    c
}

/// What every client must see through the gateway, whatever the upstream.
fn assert_report(report: &Value, who: &str) {
    let tools: Vec<&str> = report["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("{who}: {report}"))
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert_eq!(
        tools,
        ["echo", "progress", "slow", "stats"],
        "{who}: {report}"
    );
    for (tool, answer) in report["calls"].as_object().unwrap() {
        assert_eq!(answer["ok"], true, "{who}: {tool}: {answer}");
    }
    assert_eq!(report["calls"]["echo"]["text"], "hi", "{who}");
    assert_eq!(report["calls"]["progress"]["text"], "3 steps", "{who}");
    let progress = report["progress"].as_array().unwrap();
    assert_eq!(
        progress.len(),
        3,
        "{who}: every progress event arrived: {report}"
    );
    assert_eq!(progress[2][0], 3.0, "{who}: {report}");
    let logs: Vec<&str> = report["logs"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        logs.iter().any(|l| l.contains("step 3 of 3")),
        "{who}: the log messages arrived: {report}"
    );
    let refusal = &report["refusal"];
    assert!(
        refusal.is_object(),
        "{who}: the storm was refused: {report}"
    );
    assert_eq!(refusal["code"], -32029, "{who}: {refusal}");
    let data = &refusal["data"];
    let ms = data["retry_after_ms"].as_u64().unwrap();
    assert!(ms > 0 && ms <= 60_000, "{who}: {data}");
    // Its own session refused it: the plain budget, or the budget its storm score cut.
    assert_eq!(data["scope"], "agent_session", "{who}: {data}");
    assert!(
        ["session_budget_exceeded", "session_storm"].contains(&data["reason"].as_str().unwrap()),
        "{who}: {data}"
    );
    assert!(
        refusal["message"]
            .as_str()
            .unwrap()
            .contains(&format!("retry after {ms} ms")),
        "{who}: {refusal}"
    );
    assert_eq!(
        report["other_session"]["ok"], true,
        "{who}: another session is untouched: {report}"
    );
}

/// Both SDKs' clients through a gateway in front of `upstream` (named `server` in failures):
/// every tool listed and called, notifications through, a storm refused, another session
/// untouched. The gateway's control, to look at what the stack saw.
async fn both_sdks_through_the_gateway(upstream: &Upstream, server: &str) -> Control {
    let (url, control) = gateway(&upstream.url, storm_config()).await;
    let (py, ts) = tokio::join!(python_client(&url), ts_client(&url));
    assert_report(&py, &format!("Python client → gateway → {server}"));
    assert_report(&ts, &format!("TypeScript client → gateway → {server}"));
    // The outcomes were learned from the upstream's answers.
    assert!(
        control.audit().len() >= 4,
        "every session was seen by the stack"
    );
    control
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_server_behind_the_gateway_serves_both_sdks_and_refuses_a_storm() {
    both_sdks_through_the_gateway(&python_server().await, "Python server").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typescript_server_behind_the_gateway_serves_both_sdks_and_refuses_a_storm() {
    both_sdks_through_the_gateway(&ts_server().await, "TypeScript server").await;
}

// ---------------------------------------------------------------------------------------
// Reloads
// ---------------------------------------------------------------------------------------

#[test]
fn the_gateway_section_cannot_change_while_running_and_a_document_without_it_keeps_it() {
    let config = {
        let mut built = Config::default();
        built.gateway = Some({
            let mut built = GatewayConfig::default();
            built.upstream = Some("http://127.0.0.1:8000/mcp".into());
            built
        });
        built
    };
    let control = Control::new(config).unwrap();
    let source = stormgate::control::Source::File;
    // A file without [gateway] (the upstream came from the command line): applied, kept.
    control
        .reload_document("[sessions]\nburst = 3.0\n", source.clone())
        .unwrap();
    assert_eq!(control.config().sessions.burst, Positive::new(3.0).unwrap());
    let running = control.config().gateway.clone().unwrap();
    assert_eq!(
        running.upstream.as_deref(),
        Some("http://127.0.0.1:8000/mcp")
    );
    // [gateway] without an upstream keeps the running upstream: the same section is applied.
    control
        .reload_document("[sessions]\nburst = 4.0\n[gateway]\n", source.clone())
        .unwrap();
    assert_eq!(control.config().sessions.burst, Positive::new(4.0).unwrap());
    // A different upstream, or different timeouts: refused by name, the running one stays.
    for text in [
        "[sessions]\nburst = 5.0\n[gateway]\nupstream = \"http://127.0.0.1:9000/mcp\"\n",
        "[sessions]\nburst = 5.0\n[gateway]\nrequest_timeout_ms = 5\n",
    ] {
        let err = control.reload_document(text, source.clone()).unwrap_err();
        let err = err.config_error().unwrap();
        assert_eq!(err.field, "gateway", "{text}: {err}");
        assert!(err.rule.contains("restart"), "{err}");
        assert_eq!(
            control.config().sessions.burst,
            Positive::new(4.0).unwrap(),
            "refused whole"
        );
        assert_eq!(control.config().gateway.as_ref(), Some(&running));
    }
}

// ---------------------------------------------------------------------------------------
// The conformance suite
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_conformance_suite_through_the_gateway_in_off_gives_the_upstreams_results() {
    let upstream = ts_server().await;
    let direct = common::conformance_suite(&upstream.url, "gateway-direct").await;
    let mut config = Config::default();
    config.mode = Mode::Off;
    let (url, _control) = gateway(&upstream.url, config).await;
    let through = common::conformance_suite(&url, "gateway-through").await;
    assert!(direct.len() >= 20, "{} scenarios", direct.len());
    assert!(
        direct
            .values()
            .flatten()
            .any(|(_, status)| status == "SUCCESS"),
        "some checks pass"
    );
    assert_eq!(direct, through, "the gateway changes no conformance result");
}

/// An upstream that answers every JSON-RPC request with a result (or an error for the tool
/// `fail`) carrying its id, and a session id on every answer.
fn jsonrpc_upstream() -> Router {
    Router::new().route(
        "/mcp",
        any(|body: Bytes| async move {
            let req: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            let answer = if req["params"]["name"] == "fail" {
                json!({"jsonrpc": "2.0", "id": req["id"],
                       "error": {"code": -32603, "message": "the tool broke"}})
            } else {
                json!({"jsonrpc": "2.0", "id": req["id"],
                       "result": {"content": [{"type": "text", "text": "ok"}],
                                  "protocolVersion": "2025-06-18", "capabilities": {},
                                  "serverInfo": {"name": "u", "version": "1"}}})
            };
            Response::builder()
                .header("content-type", "application/json")
                .header("mcp-session-id", "upstream-session-1")
                .body(Body::from(answer.to_string()))
                .unwrap()
        }),
    )
}

#[tokio::test]
async fn outcomes_are_learned_from_the_upstreams_answers() {
    let upstream = common::serve(jsonrpc_upstream()).await;
    let (url, control) = gateway(&format!("http://{upstream}/mcp"), Config::default()).await;
    let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize",
                      "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                                 "clientInfo": {"name": "c", "version": "1"}}});
    let (status, headers, _) =
        json_of(client().request(rpc_post(&url, &init, &[])).await.unwrap()).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["mcp-session-id"], "upstream-session-1");
    let session = [
        ("mcp-session-id", "upstream-session-1"),
        ("mcp-protocol-version", "2025-06-18"),
    ];
    for (id, tool) in [(1, "echo"), (2, "fail")] {
        let call = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                          "params": {"name": tool, "arguments": {}}});
        let (status, _, body) = json_of(
            client()
                .request(rpc_post(&url, &call, &session))
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body["id"], id);
    }
    // Learned when the answer's body ends on the gateway's side, which may be just after the
    // client read it. (A JSON answer is learned only if the server polls the body to its end:
    // without the proxy's `Streamed` body, hyper would stop at the last byte and the call would
    // be settled as cancelled, so the session would never be accepted and nothing learned.)
    let session = stormgate::SessionId::new("upstream-session-1");
    let outcome = |tool: &str| {
        control
            .audit()
            .invocations(&session)
            .iter()
            .find(|i| i.target.as_deref() == Some(tool))
            .and_then(|i| i.outcome)
    };
    common::until("both outcomes learned", || {
        outcome("echo").is_some() && outcome("fail").is_some()
    })
    .await;
    assert_eq!(outcome("echo"), Some("ok"));
    assert_eq!(outcome("fail"), Some("error"));
}

#[tokio::test]
async fn a_deadline_cuts_a_proxied_call_and_drops_its_upstream_request() {
    let dropped = Arc::new(AtomicBool::new(false));
    let d = dropped.clone();
    let upstream = common::serve(Router::new().route(
        "/mcp",
        any(move || {
            let guard = Dropped(d.clone());
            async move {
                let _guard = guard;
                std::future::pending::<()>().await;
                "never"
            }
        }),
    ))
    .await;
    let mut config = Config::default();
    config
        .deadlines
        .tools
        .insert("slow".into(), NonZeroDuration::from_millis(200).unwrap());
    let (url, _control) = gateway(&format!("http://{upstream}/mcp"), config).await;
    let call = json!({"jsonrpc": "2.0", "id": 11, "method": "tools/call",
                      "params": {"name": "slow", "arguments": {}}});
    let answer = tokio::time::timeout(
        Duration::from_secs(5),
        client().request(rpc_post(&url, &call, &[])),
    )
    .await
    .expect("the deadline answers, not the upstream")
    .unwrap();
    let (_, _, body) = json_of(answer).await;
    assert_eq!(body["id"], 11, "{body}");
    assert_eq!(
        body["error"]["data"]["reason"], "deadline_exceeded",
        "{body}"
    );
    common::until("the upstream request dropped", || {
        dropped.load(Ordering::SeqCst)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fifo_limit_guards_the_python_servers_pool_through_the_gateway() {
    let upstream = python_server().await;
    // Two in flight, two waiting: of six calls at once, two are refused and never reach the
    // upstream.
    let config = Config::from_toml(
        "[sessions]\nburst = 100.0\n[fifo.keys.slow]\nmax_concurrent = 2\nmax_queue_depth = 2\n",
    )
    .unwrap();
    let (url, _control) = gateway(&upstream.url, config).await;
    let mut command = tokio::process::Command::new(python());
    command.args([
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/gateway/python_client.py"
        ),
        &url,
        "burst",
    ]);
    let report = common::report(command, "the Python client").await;
    let answers = report["answers"].as_array().unwrap();
    let ok = answers.iter().filter(|a| a["ok"] == true).count();
    let full: Vec<&Value> = answers
        .iter()
        .filter(|a| a["data"]["reason"] == "queue_full")
        .collect();
    assert_eq!((ok, full.len()), (4, 2), "{report}");
    assert_eq!(full[0]["code"], -32029, "{report}");
    assert_eq!(
        report["stats"]["slow_started"], 4,
        "refused calls never ran: {report}"
    );
    assert_eq!(report["stats"]["in_pool"], 0, "{report}");
}

/// The JSON-RPC message of an answer, JSON or the first `data:` line of an SSE stream that
/// holds one.
fn message_of(text: &str) -> Value {
    if let Ok(v) = serde_json::from_str(text) {
        return v;
    }
    text.lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .find_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
        .unwrap_or_else(|| panic!("no JSON-RPC message in {text:?}"))
}

/// One MCP session through the gateway at `url`, by hand: its id.
async fn open_session(url: &str) -> String {
    let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "gateway-test", "version": "1"}}});
    let answer = client().request(rpc_post(url, &init, &[])).await.unwrap();
    assert_eq!(answer.status(), StatusCode::OK);
    let session = answer.headers()["mcp-session-id"]
        .to_str()
        .unwrap()
        .to_owned();
    answer.into_body().collect().await.unwrap();
    let done = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let headers = [
        ("mcp-session-id", session.as_str()),
        ("mcp-protocol-version", "2025-06-18"),
    ];
    let answer = client()
        .request(rpc_post(url, &done, &headers))
        .await
        .unwrap();
    assert!(answer.status().is_success(), "{}", answer.status());
    answer.into_body().collect().await.unwrap();
    session
}

/// The Python server's pool counters, asked on `session` through the gateway.
async fn upstream_stats(url: &str, session: &str, id: u64) -> Value {
    let call = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                      "params": {"name": "stats", "arguments": {}}});
    let headers = [
        ("mcp-session-id", session),
        ("mcp-protocol-version", "2025-06-18"),
    ];
    let answer = client()
        .request(rpc_post(url, &call, &headers))
        .await
        .unwrap();
    let text = answer.into_body().collect().await.unwrap().to_bytes();
    let message = message_of(&String::from_utf8_lossy(&text));
    let stats = message["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("{message}"));
    serde_json::from_str(stats).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_goes_mid_call_gets_the_upstream_tool_cancelled_and_its_pool_place_back() {
    let upstream = python_server().await;
    // Budgets the test's own polling never reaches.
    let config = Config::from_toml("[sessions]\nbase_budget = 1000.0\nburst = 1000.0\n").unwrap();
    let (url, _control) = gateway(&upstream.url, config).await;
    let session = open_session(&url).await;
    let call = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                      "params": {"name": "slow", "arguments": {"ms": 20000}}});
    let headers = [
        ("mcp-session-id", session.as_str()),
        ("mcp-protocol-version", "2025-06-18"),
    ];
    let answer = client()
        .request(rpc_post(&url, &call, &headers))
        .await
        .unwrap();
    assert_eq!(answer.status(), StatusCode::OK);
    // The tool holds a pool place...
    let mut id = 100;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        id += 1;
        let stats = upstream_stats(&url, &session, id).await;
        if stats["in_pool"] == 1 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the slow call never started: {stats}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // ... and the client goes, its answer unread. The server would hold the place 20 s.
    drop(answer);
    loop {
        id += 1;
        let stats = upstream_stats(&url, &session, id).await;
        if stats["slow_cancelled"] == 1 && stats["in_pool"] == 0 {
            assert_eq!(stats["slow_finished"], 0, "{stats}");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline + Duration::from_secs(5),
            "the upstream kept running the abandoned call: {stats}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// An upstream that answers each request on a connection as soon as its head has come and,
/// when `answer` is false, closes without answering. After an answer it reads nothing more
/// and closes the connection 20 ms later, as a server does at the end of its keep-alive,
/// without `Connection: close`: a request sent on that connection meanwhile is never read.
/// Counts the request heads it read.
async fn closing_upstream(seen: Arc<AtomicUsize>, answer: bool) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            // A failed accept (a connection reset while queued) is not the end of the server.
            let Ok((tcp, _)) = listener.accept().await else {
                continue;
            };
            let seen = seen.clone();
            tokio::spawn(async move {
                let mut tcp = BufReader::new(tcp);
                let mut line = String::new();
                let mut head = false;
                while tcp.read_line(&mut line).await.unwrap_or(0) > 0 {
                    if line == "\r\n" {
                        head = true;
                        break;
                    }
                    line.clear();
                }
                // A connection closed before a whole head came (one the client's pool opened
                // and never used) carried no request.
                if !head {
                    return;
                }
                seen.fetch_add(1, Ordering::SeqCst);
                if !answer {
                    return;
                }
                let body = r#"{"jsonrpc":"2.0","id":1,"result":{"content":[],"isError":false}}"#;
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                    body.len()
                );
                let _ = tcp.get_mut().write_all(answer.as_bytes()).await;
                tokio::time::sleep(Duration::from_millis(20)).await;
            });
        }
    });
    format!("http://{addr}/mcp")
}

/// `calls` tool calls from each of `clients` clients at once, one every 15 ms; the HTTP
/// status of each, and whether it carried the upstream's result.
async fn calls_to(url: &str, clients: u64, calls: u64) -> Vec<(StatusCode, bool)> {
    let mut tasks = Vec::new();
    for c in 0..clients {
        let url = url.to_owned();
        tasks.push(tokio::spawn(async move {
            let mut statuses = Vec::new();
            for id in 0..calls {
                let call = json!({"jsonrpc": "2.0", "id": c * 1000 + id, "method": "tools/call",
                                  "params": {"name": "echo", "arguments": {"text": "x"}}});
                let answer = client().request(rpc_post(&url, &call, &[])).await.unwrap();
                let (status, _, body) = json_of(answer).await;
                statuses.push((status, body.get("result").is_some()));
                tokio::time::sleep(Duration::from_millis(15)).await;
            }
            statuses
        }));
    }
    let mut statuses = Vec::new();
    for t in tasks {
        statuses.extend(t.await.unwrap());
    }
    statuses
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooled_connection_the_upstream_closed_is_not_the_next_clients_error() {
    let seen = Arc::new(AtomicUsize::new(0));
    let upstream = closing_upstream(seen.clone(), true).await;
    // Measuring only: what is under test is the proxy, not the budgets.
    // A call the upstream never answers would show as 504 after 10 s, not after a minute.
    let measuring = || {
        let mut built = Config::default();
        built.mode = Mode::Off;
        built.gateway = Some({
            let mut built = GatewayConfig::default();
            built.request_timeout = NonZeroDuration::new(Duration::from_secs(10)).unwrap();
            built
        });
        built
    };
    let (url, _control) = gateway(&upstream, measuring()).await;
    let statuses = calls_to(&url, 8, 50).await;
    let failed: Vec<_> = statuses
        .iter()
        .filter(|s| **s != (StatusCode::OK, true))
        .collect();
    assert!(
        failed.is_empty(),
        "calls not answered for a connection the upstream had closed: {failed:?}"
    );
    // Each ran once: a call sent again had not been read on the dead connection.
    assert_eq!(seen.load(Ordering::SeqCst), 400);

    // A fresh connection the upstream closes after reading the request is its failure: 502,
    // and the request is not sent twice (it may have run).
    let seen = Arc::new(AtomicUsize::new(0));
    let upstream = closing_upstream(seen.clone(), false).await;
    let (url, _control) = gateway(&upstream, measuring()).await;
    assert_eq!(
        calls_to(&url, 1, 5).await,
        vec![(StatusCode::BAD_GATEWAY, false); 5]
    );
    assert_eq!(seen.load(Ordering::SeqCst), 5);
}

/// A CA of the test's own, and a certificate it signed for `names`: the CA's PEM, and the
/// TLS settings of a server presenting the certificate.
#[cfg(feature = "tls")]
fn private_ca(names: &[&str]) -> (String, Arc<tokio_rustls::rustls::ServerConfig>) {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    use tokio_rustls::rustls;
    use tokio_rustls::rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
    let cert = CertificateParams::new(names)
        .unwrap()
        .signed_by(&key, &ca)
        .unwrap();
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let server = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert.der().clone()], key)
        .unwrap();
    (ca.pem(), Arc::new(server))
}

/// [`jsonrpc_upstream`] over TLS with `server`; its port.
#[cfg(feature = "tls")]
async fn tls_upstream(server: Arc<tokio_rustls::rustls::ServerConfig>) -> u16 {
    use tower::ServiceExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let acceptor = tokio_rustls::TlsAcceptor::from(server);
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return; // the gateway refused our certificate
                };
                let service = hyper::service::service_fn(|req: Request<hyper::body::Incoming>| {
                    jsonrpc_upstream().oneshot(req.map(Body::new))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    port
}

#[cfg(feature = "tls")]
#[tokio::test]
async fn an_https_upstream_is_reached_when_its_certificate_chains_to_a_known_ca_for_its_name() {
    let dir = std::env::temp_dir().join(format!("stormgate-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (ca, server) = private_ca(&["localhost"]);
    let ca_file = dir.join("ca.pem");
    std::fs::write(&ca_file, &ca).unwrap();
    let port = tls_upstream(server).await;
    let call = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                      "params": {"name": "echo", "arguments": {"text": "x"}}});
    let with_ca = |ca_file: Option<std::path::PathBuf>| {
        let mut built = Config::default();
        built.gateway = Some({
            let mut built = GatewayConfig::default();
            built.ca_file = ca_file;
            built
        });
        built
    };
    // The private CA given: answered through TLS, the name checked (`localhost`, sent as SNI).
    let (url, _control) = gateway(
        &format!("https://localhost:{port}/mcp"),
        with_ca(Some(ca_file.clone())),
    )
    .await;
    let (status, _, body) =
        json_of(client().request(rpc_post(&url, &call, &[])).await.unwrap()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["result"]["content"][0]["text"], "ok", "{body}");
    // Only the bundled roots: the certificate is not trusted; the right CA and another name:
    // the certificate is for `localhost`, not `127.0.0.1`. Each a 502 before anything is sent.
    for (host, ca) in [("localhost", None), ("127.0.0.1", Some(ca_file.clone()))] {
        let (url, _control) = gateway(&format!("https://{host}:{port}/mcp"), with_ca(ca)).await;
        let (status, _, body) =
            json_of(client().request(rpc_post(&url, &call, &[])).await.unwrap()).await;
        assert_eq!(status, StatusCode::BAD_GATEWAY, "{host}: {body}");
        assert_eq!(
            body["error"]["data"]["reason"], "upstream_unreachable",
            "{host}"
        );
        assert_eq!(body["id"], 3, "{host}");
    }

    // A CA file that is missing, or holds no certificate, is refused when the proxy is built.
    let empty = dir.join("empty.pem");
    std::fs::write(&empty, "not a certificate\n").unwrap();
    for (file, says) in [
        (dir.join("missing.pem"), "missing.pem"),
        (empty, "no certificate"),
    ] {
        let mut gw = GatewayConfig::default();
        gw.upstream = Some(format!("https://localhost:{port}/mcp"));
        gw.ca_file = Some(file);
        let e = Proxy::new(&gw).unwrap_err();
        assert_eq!(e.field, "gateway.ca_file");
        assert!(e.to_string().contains(says), "{e}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_abandoned_call_is_cancelled_upstream_exactly_once() {
    // Calls never end; notifications are taken at once and kept.
    let running = Arc::new(AtomicUsize::new(0));
    let notified = Arc::new(std::sync::Mutex::new(Vec::<Value>::new()));
    let (seen, kept) = (running.clone(), notified.clone());
    let upstream = common::serve(Router::new().route(
        "/mcp",
        any(move |body: String| {
            let (seen, kept) = (seen.clone(), kept.clone());
            async move {
                let message: Value = serde_json::from_str(&body).unwrap_or_default();
                if message.get("id").is_none() {
                    kept.lock().unwrap().push(message);
                    return StatusCode::ACCEPTED;
                }
                seen.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_secs(3600)).await;
                StatusCode::OK
            }
        }),
    ))
    .await;
    let mut measuring = Config::default();
    measuring.mode = Mode::Off;
    let (url, _control) = gateway(&format!("http://{upstream}/mcp"), measuring).await;
    const CALLS: usize = 400;
    let clients: Vec<_> = (0..CALLS)
        .map(|i| {
            let call = json!({"jsonrpc": "2.0", "id": format!("call-{i}"), "method": "tools/call",
                              "params": {"name": "slow", "arguments": {}}});
            let req = rpc_post(&url, &call, &[]);
            tokio::spawn(async move { client().request(req).await })
        })
        .collect();
    // Bounded waits of 30 s: 400 connections on a loaded machine take a while. A wait that
    // runs out says how far it got and how many clients had already ended (a call refused or
    // failed on its way never runs upstream).
    async fn within<T>(
        what: &str,
        count: impl Fn() -> usize,
        clients: &[tokio::task::JoinHandle<T>],
    ) {
        for _ in 0..600 {
            if count() >= CALLS {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let ended = clients.iter().filter(|c| c.is_finished()).count();
        panic!(
            "{what}: {} of {CALLS} within 30 s ({ended} clients had ended)",
            count()
        );
    }
    within(
        "every call running upstream",
        || running.load(Ordering::SeqCst),
        &clients,
    )
    .await;
    // Every client goes away.
    for c in &clients {
        c.abort();
    }
    within(
        "every call cancelled upstream",
        || notified.lock().unwrap().len(),
        &clients,
    )
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let notified = notified.lock().unwrap();
    assert_eq!(notified.len(), CALLS, "exactly one each");
    let mut ids: Vec<String> = notified
        .iter()
        .map(|n| {
            assert_eq!(n["method"], "notifications/cancelled");
            n["params"]["requestId"].as_str().unwrap().to_owned()
        })
        .collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), CALLS, "one for each call");
}
