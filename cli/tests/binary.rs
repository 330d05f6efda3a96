//! The `stormgate` binary over loopback HTTP: flags and environment, exit code 2 on bad input
//! with a message, the configuration printed and checked, `/metrics`, the admin routes, reloads
//! on SIGHUP, the DNS-rebinding guard, request ids and credentials kept out of the logs, and
//! exit 0 on SIGTERM. The gateway itself (`stormgate::gateway`) in front of real upstreams is
//! tested in the library's tests/gateway.rs.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::any;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

#[path = "../../tests/common/loopback.rs"]
mod loopback;
#[path = "../../tests/common/node.rs"]
mod node;

use loopback::{client, echo_headers_upstream, json_of, rpc_post, serve};

// ---------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------

// ---------------------------------------------------------------------------------------
// The binary
// ---------------------------------------------------------------------------------------

const BIN: &str = env!("CARGO_BIN_EXE_stormgate");

/// Waits (at most 10 s) until the binary `child` (its stderr piped) logs where it listens;
/// that address, and a task that keeps reading its logs, so it never blocks on a full pipe,
/// and returns them all once it exits.
async fn listening(child: &mut tokio::process::Child) -> (String, tokio::task::JoinHandle<String>) {
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let addr = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if let Some(rest) = line.split("listening on http://").nth(1) {
                return rest.split('/').next().unwrap().to_owned();
            }
        }
        panic!("the binary exited before listening");
    })
    .await
    .expect("the binary listens within 10 s");
    let logs = tokio::spawn(async move {
        let mut all = String::new();
        while let Ok(Some(line)) = lines.next_line().await {
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    (addr, logs)
}

fn bin() -> std::process::Command {
    let mut c = std::process::Command::new(BIN);
    for var in [
        "STORMGATE_LISTEN",
        "STORMGATE_UPSTREAM",
        "STORMGATE_CONFIG",
        "STORMGATE_SHUTDOWN_GRACE_MS",
        "STORMGATE_HEADER_TIMEOUT_MS",
        "STORMGATE_MAX_CONNECTIONS",
        "RUST_LOG",
    ] {
        c.env_remove(var);
    }
    c
}

#[test]
fn the_binary_refuses_bad_input_with_exit_code_2_and_a_message() {
    type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], &'a str);
    let cases: [Case; 8] = [
        (&["--bogus"], &[], "unknown argument \"--bogus\""),
        (
            &["--upstream", "http://127.0.0.1:3001"],
            &[],
            "has no path: MCP servers serve at one, such as \"http://127.0.0.1:3001/mcp\"",
        ),
        (
            &["--check-config", "nope.toml"],
            &[],
            "nope.toml: No such file",
        ),
        (&["--upstream"], &[], "--upstream needs a value"),
        (&[], &[], "no upstream"),
        (&["--upstream", "ftp://x/mcp"], &[], "gateway.upstream"),
        (
            &[],
            &[("STORMGATE_UPSTREAM", "ws://x/mcp")],
            "is not an http:// or https:// URL",
        ),
        (
            &[
                "--upstream",
                "http://127.0.0.1:1/mcp",
                "--listen",
                "nowhere",
            ],
            &[],
            "--listen \"nowhere\"",
        ),
    ];
    for (args, env, message) in cases {
        let out = bin().args(args).envs(env.iter().copied()).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?} {env:?}: {stderr}");
        assert!(stderr.contains(message), "{args:?}: {stderr}");
    }
    let config = std::env::temp_dir().join(format!("stormgate-gw-bad-{}.toml", std::process::id()));
    std::fs::write(&config, "[gateway]\nrequest_timeout_ms = 0\n").unwrap();
    let out = bin()
        .args(["--upstream", "http://127.0.0.1:1/mcp"])
        .env("STORMGATE_CONFIG", &config)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("gateway.request_timeout_ms"), "{stderr}");
    // The flag and the file disagree on the upstream: refused at start, not at every reload.
    std::fs::write(
        &config,
        "[gateway]\nupstream = \"http://127.0.0.1:2/mcp\"\n",
    )
    .unwrap();
    let out = bin()
        .args(["--upstream", "http://127.0.0.1:1/mcp"])
        .env("STORMGATE_CONFIG", &config)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("differ: give one"), "{stderr}");
    let _ = std::fs::remove_file(&config);
    // A file that cannot be read is named once.
    let out = bin()
        .args([
            "--config",
            "nope.toml",
            "--upstream",
            "http://127.0.0.1:1/mcp",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.matches("nope.toml").count(), 1, "{stderr}");
    let help = bin().arg("--help").output().unwrap();
    assert_eq!(help.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&help.stdout).contains("usage: stormgate --upstream URL"));
}

/// `--print-config` writes the configuration in effect (the flag's upstream, every default) as
/// TOML that `--check-config` accepts and that loads back to the same configuration.
#[test]
fn the_binary_prints_the_configuration_in_effect_and_checks_files() {
    let out = bin()
        .args(["--upstream", "http://127.0.0.1:1/mcp", "--print-config"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let printed = stormgate::control::Config::from_toml(&text).unwrap();
    let expected = {
        let mut built = stormgate::control::Config::default();
        built.gateway = Some({
            let mut built = stormgate::gateway::GatewayConfig::default();
            built.upstream = Some("http://127.0.0.1:1/mcp".into());
            built
        });
        built
    };
    assert_eq!(printed, expected, "{text}");
    assert!(
        text.contains("base_budget = 1000.0"),
        "the defaults are printed: {text}"
    );
    let file = std::env::temp_dir().join(format!("stormgate-printed-{}.toml", std::process::id()));
    std::fs::write(&file, &text).unwrap();
    let check = bin().arg("--check-config").arg(&file).output().unwrap();
    assert_eq!(
        check.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );
    std::fs::write(&file, "[sessions]\nbase_budget = -1\n").unwrap();
    let check = bin().arg("--check-config").arg(&file).output().unwrap();
    let stderr = String::from_utf8_lossy(&check.stderr);
    assert_eq!(check.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("sessions.base_budget: must be greater than 0"),
        "{stderr}"
    );
    let _ = std::fs::remove_file(&file);
}

/// The binary in front of `upstream` with a configuration file of `text` (named after `name`
/// in the temp dir), listening on a free port: the child, its address, its logs (see
/// [`listening`]) and the file.
async fn binary_with(
    name: &str,
    text: &str,
    upstream: std::net::SocketAddr,
) -> (
    tokio::process::Child,
    String,
    tokio::task::JoinHandle<String>,
    std::path::PathBuf,
) {
    let config =
        std::env::temp_dir().join(format!("stormgate-gw-{name}-{}.toml", std::process::id()));
    std::fs::write(&config, text).unwrap();
    let mut child = tokio::process::Command::from(bin())
        .arg("--config")
        .arg(&config)
        .env("STORMGATE_LISTEN", "127.0.0.1:0")
        .env("STORMGATE_UPSTREAM", format!("http://{upstream}/mcp"))
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let (addr, logs) = listening(&mut child).await;
    (child, addr, logs, config)
}

/// An upstream answering every request with a JSON-RPC result, counting them.
fn counting_upstream(seen: Arc<AtomicUsize>) -> Router {
    Router::new().route(
        "/mcp",
        any(move || {
            seen.fetch_add(1, Ordering::SeqCst);
            async {
                (
                    [("content-type", "application/json")],
                    r#"{"jsonrpc":"2.0","id":1,"result":{}}"#,
                )
            }
        }),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_refuses_a_rebound_host_or_origin_before_the_upstream() {
    let seen = Arc::new(AtomicUsize::new(0));
    let upstream = serve(counting_upstream(seen.clone())).await;
    let (mut child, addr, logs, config) = binary_with(
        "hosts",
        "[gateway]\nallowed_hosts = [\"mcp.internal\"]\n",
        upstream,
    )
    .await;
    let port = addr.rsplit(':').next().unwrap().to_owned();
    let list = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"});
    let url = format!("http://{addr}/mcp");
    // A page on evil.example whose name was rebound to 127.0.0.1 sends its own name as Host,
    // or its Origin; neither reaches the upstream.
    for (host, origin) in [
        (format!("evil.example:{port}"), None),
        (addr.clone(), Some("http://evil.example")),
        (addr.clone(), Some("null")),
    ] {
        let mut headers = vec![("host", host.as_str())];
        headers.extend(origin.map(|o| ("origin", o)));
        let (status, _, body) = json_of(
            client()
                .request(rpc_post(&url, &list, &headers))
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{host} {origin:?}: {body}");
        assert_eq!(body["error"]["code"], -32600, "{body}");
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("allowed_hosts"),
            "{body}"
        );
    }
    // Raw requests a client library would not write: two Host headers (400, RFC 9112), two
    // Origin headers (400), an absolute-form target naming another site (403).
    let body = list.to_string();
    for (head, status) in [
        (
            format!("POST /mcp HTTP/1.1\r\nHost: {addr}\r\nHost: evil.example\r\n"),
            "400",
        ),
        (
            format!(
                "POST /mcp HTTP/1.1\r\nHost: {addr}\r\nOrigin: http://localhost\r\nOrigin: http://evil.example\r\n"
            ),
            "400",
        ),
        (
            format!("POST http://evil.test/mcp HTTP/1.1\r\nHost: {addr}\r\n"),
            "403",
        ),
    ] {
        let mut socket = tokio::net::TcpStream::connect(&addr).await.unwrap();
        let request = format!(
            "{head}Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        socket.write_all(request.as_bytes()).await.unwrap();
        let mut answer = String::new();
        socket.read_to_string(&mut answer).await.unwrap();
        assert!(
            answer.starts_with(&format!("HTTP/1.1 {status}")),
            "{head:?}: {answer}"
        );
    }
    assert_eq!(
        seen.load(Ordering::SeqCst),
        0,
        "nothing refused reached the upstream"
    );
    // Loopback names, a loopback page's Origin, and the listed name pass.
    let listed = format!("mcp.internal:{port}");
    for (host, origin) in [
        (addr.as_str(), None),
        (addr.as_str(), Some("http://localhost:5173")),
        (listed.as_str(), None),
    ] {
        let mut headers = vec![("host", host)];
        headers.extend(origin.map(|o| ("origin", o)));
        let (status, _, body) = json_of(
            client()
                .request(rpc_post(&url, &list, &headers))
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{host} {origin:?}: {body}");
    }
    assert_eq!(seen.load(Ordering::SeqCst), 3);
    child.start_kill().unwrap();
    let _ = child.wait().await;
    logs.abort();
    let _ = std::fs::remove_file(&config);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_proxies_serves_metrics_and_exits_0_on_sigterm() {
    let upstream = serve(echo_headers_upstream()).await;
    let (mut child, addr, logs, config) =
        binary_with("admin", "[admin]\ntoken = \"t0ken\"\n", upstream).await;
    let list = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"});
    let (status, headers, body) = json_of(
        client()
            .request(rpc_post(&format!("http://{addr}/mcp"), &list, &[]))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["mcp-session-id"], "upstream-session-1");
    assert_eq!(body["result"]["headers"]["host"], upstream.to_string());
    let metrics = client()
        .request(
            Request::get(format!("http://{addr}/metrics"))
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(metrics.status(), StatusCode::OK);
    let text = metrics.into_body().collect().await.unwrap().to_bytes();
    let text = String::from_utf8_lossy(&text);
    assert!(text.contains("stormgate_messages_total"), "{text}");
    assert!(
        text.contains("stormgate_mode"),
        "the gauges set at start are there: {text}"
    );
    let admin = client()
        .request(
            Request::get(format!("http://{addr}/admin/mode"))
                .header("authorization", "Bearer t0ken")
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(
        admin.status(),
        StatusCode::OK,
        "the admin routes are served"
    );
    let mode = || async {
        let req = Request::get(format!("http://{addr}/admin/mode"))
            .header("authorization", "Bearer t0ken")
            .body(Body::empty())
            .unwrap();
        json_of(client().request(req).await.unwrap()).await.2["mode"].clone()
    };
    assert_eq!(mode().await, "adaptive");
    // The configuration file is reloaded (its watcher or SIGHUP, both sent here).
    std::fs::write(&config, "mode = \"fixed\"\n[admin]\ntoken = \"t0ken\"\n").unwrap();
    let pid = child.id().unwrap().to_string();
    let hup = std::process::Command::new("kill")
        .args(["-HUP", &pid])
        .status()
        .unwrap();
    assert!(hup.success());
    let mut reloaded = false;
    for _ in 0..500 {
        if mode().await == "fixed" {
            reloaded = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(reloaded, "the file was reloaded within 5 s");
    let kill = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(kill.success());
    let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .expect("exits within 10 s of SIGTERM")
        .unwrap();
    let logs = logs.await.unwrap();
    assert_eq!(status.code(), Some(0), "{logs}");
    assert!(logs.contains("SIGTERM"), "{logs}");
    let _ = std::fs::remove_file(&config);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_counts_upstream_failures_in_its_metrics() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let mut child = tokio::process::Command::from(bin())
        .args(["--listen", "127.0.0.1:0", "--upstream"])
        .arg(format!("http://127.0.0.1:{port}/mcp"))
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let (addr, drain) = listening(&mut child).await;
    let call = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                      "params": {"name": "echo", "arguments": {}}});
    for _ in 0..3 {
        let (status, _, body) = json_of(
            client()
                .request(rpc_post(&format!("http://{addr}/mcp"), &call, &[]))
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(status, StatusCode::BAD_GATEWAY);
        assert_eq!(body["id"], 3);
    }
    let metrics = client()
        .request(
            Request::get(format!("http://{addr}/metrics"))
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    let text = metrics.into_body().collect().await.unwrap().to_bytes();
    let text = String::from_utf8_lossy(&text);
    assert!(
        text.lines().any(|l| l.starts_with(
            "stormgate_gateway_upstream_failures_total{reason=\"upstream_unreachable\"}"
        ) && l.ends_with(" 3")),
        "{text}"
    );
    let pid = child.id().unwrap().to_string();
    assert!(
        std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .expect("exits within 10 s of SIGTERM")
        .unwrap();
    assert_eq!(status.code(), Some(0));
    drain.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_gives_each_request_an_id_and_never_logs_credentials() {
    let upstream = serve(echo_headers_upstream()).await;
    let config = std::env::temp_dir().join(format!("stormgate-gw-ids-{}.toml", std::process::id()));
    std::fs::write(
        &config,
        "[gateway]\nforward_headers = [\"authorization\"]\n",
    )
    .unwrap();
    let mut child = tokio::process::Command::from(bin())
        .arg("--config")
        .arg(&config)
        .env("STORMGATE_LISTEN", "127.0.0.1:0")
        .env("STORMGATE_UPSTREAM", format!("http://{upstream}/mcp"))
        // Everything logged, down to debug, from every crate.
        .env("RUST_LOG", "debug")
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let (addr, logs) = listening(&mut child).await;
    let list = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"});
    let mut ids = Vec::new();
    for _ in 0..2 {
        let req = rpc_post(
            &format!("http://{addr}/mcp"),
            &list,
            &[
                ("authorization", "Bearer sup3r-s3cret-token"),
                ("cookie", "session=sup3r-s3cret-cookie"),
                ("x-request-id", "a-client-chosen-id"),
            ],
        );
        let (status, headers, body) = json_of(client().request(req).await.unwrap()).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        // The listed credential reached the upstream; the cookie did not.
        assert_eq!(
            body["result"]["headers"]["authorization"],
            "Bearer sup3r-s3cret-token"
        );
        assert!(body["result"]["headers"].get("cookie").is_none(), "{body}");
        let id = headers["x-request-id"].to_str().unwrap().to_owned();
        assert_ne!(id, "a-client-chosen-id", "the id is the gateway's own");
        ids.push(id);
    }
    assert_ne!(ids[0], ids[1], "one id per request");
    let kill = std::process::Command::new("kill")
        .args(["-TERM", &child.id().unwrap().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .expect("exits within 10 s of SIGTERM")
        .unwrap();
    let logs = logs.await.unwrap();
    for id in &ids {
        assert!(
            logs.contains(id.as_str()),
            "the request's id is in its logs: {logs}"
        );
    }
    for secret in ["sup3r-s3cret", "a-client-chosen-id"] {
        assert!(!logs.contains(secret), "{secret} logged: {logs}");
    }
    let _ = std::fs::remove_file(&config);
}

// ---------------------------------------------------------------------------------------
// In front of the reference server, as the README starts it
// ---------------------------------------------------------------------------------------

/// A running upstream MCP server process, killed when dropped.
struct Upstream {
    _child: tokio::process::Child,
    url: String,
}

/// The reference `@modelcontextprotocol/server-everything` (pinned, installed by .ci/run) on
/// streamable HTTP at a free port.
async fn server_everything() -> Upstream {
    let dir = node::node_dir();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut command = tokio::process::Command::new(format!("{dir}/node_modules/.bin/node"));
    command
        .current_dir(&dir)
        .args([
            "node_modules/@modelcontextprotocol/server-everything/dist/index.js",
            "streamableHttp",
        ])
        .env("PORT", port.to_string())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true);
    let child = command
        .spawn()
        .unwrap_or_else(|e| panic!("server-everything in {dir}: {e} (.ci/run installs it)"));
    let ready = tokio::time::timeout(Duration::from_secs(30), async {
        while tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(
        ready.is_ok(),
        "server-everything in {dir} not listening within 30 s"
    );
    Upstream {
        _child: child,
        url: format!("http://127.0.0.1:{port}/mcp"),
    }
}

/// The gateway started as the quick start says (no configuration) in front of the reference
/// server-everything: the TypeScript SDK's feature walk, 100 sequential calls as fast as the
/// server answers, 20 concurrent calls and 8 one-shot sessions at once, none refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_configuration_a_healthy_client_is_never_refused_by_the_gateway() {
    let upstream = server_everything().await;
    let mut child = tokio::process::Command::from(bin())
        .args(["--listen", "127.0.0.1:0", "--upstream", &upstream.url])
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let (addr, _logs) = listening(&mut child).await;
    let dir = node::node_dir();
    let mut command = tokio::process::Command::new(format!("{dir}/node_modules/.bin/node"));
    command.current_dir(&dir).args([
        "--input-type=module",
        "-e",
        include_str!("../../tests/gateway/ts_walk.mjs"),
        &format!("http://{addr}/mcp"),
    ]);
    let report = node::report(command, "the TypeScript feature walk").await;
    assert_eq!(report["refusals"], json!([]), "{report}");
    for tool in ["echo", "get-sum", "trigger-long-running-operation"] {
        assert!(
            report["tools"].as_array().unwrap().contains(&json!(tool)),
            "{report}"
        );
    }
    assert!(report["resources"].as_u64().unwrap() > 0, "{report}");
    assert!(report["read"].as_u64().unwrap() > 0, "{report}");
    assert!(report["prompts"].as_u64().unwrap() > 0, "{report}");
    assert!(report["prompt_messages"].as_u64().unwrap() > 0, "{report}");
    assert!(report["sum"].as_str().unwrap().contains('5'), "{report}");
    assert_eq!(report["sequential_ok"], 100, "{report}");
    assert_eq!(report["concurrent_ok"], 20, "{report}");
    assert_eq!(report["one_shot_ok"], 8, "{report}");
}
