//! HTTP overhead of stormgate: the example MCP server with and without the stack, driven over
//! loopback by many concurrent connections, in one process.
//!
//! ```text
//! cargo run --release --example loadgen -- --duration 5 --connections 64 --rounds 3
//! ```
//!
//! It serves `examples/mcp_server/app.rs` twice on loopback ports: once protected by the whole
//! stack (`examples/stormgate.toml` in `adaptive` mode, the budgets raised so that nothing is
//! refused: global 1e9, tenant minimum 1e7, sessions 1e9 cost units/s; the Prometheus recorder
//! installed, the budget ticker and session sweeper running, as the example server runs), and
//! once as the bare rmcp service. Each connection opens its own MCP session (initialize,
//! initialized), then sends `cache_get` `tools/call`s back to back on one keep-alive
//! connection and reads each whole answer (rmcp answers as an SSE stream).
//!
//! Both servers and the client set `TCP_NODELAY` (without it every call waits about 40 ms on
//! Nagle's algorithm and delayed ACKs, which would hide any difference).
//!
//! `--gateway` measures the gateway instead (`stormgate::gateway`): the bare example server as
//! a Rust upstream, called directly, and through a gateway in front of it with the stack in
//! `off` (passing through, and measuring) and in `adaptive` (the example configuration,
//! budgets raised as above), each gateway in this process as the `stormgate` binary would
//! serve it. Its figures are what the proxy and the stack add to a call: the upstream's own
//! work is in every variant.
//!
//! `--only NAME` runs one variant alone, to profile it: `with` or `without`, or with
//! `--gateway` `direct`, `pass` (`off = "pass_through"`), `off` or `adaptive`.
//!
//! The variants take turns for `--rounds` rounds, each round starting one variant later, to
//! cancel drift; each run discards its first `--warmup` seconds. Only answers that are HTTP
//! 200 with a JSON-RPC `result` that is not `isError` count as throughput; refusals (stormgate's
//! `rate_limited`, or any JSON-RPC error) and failures (transport errors, other statuses) are
//! counted and reported apart. Latency is from sending the request to the end of its answer,
//! for answered calls.
//!
//! It also reports the process's CPU time per answered call (servers and client together,
//! from `CLOCK_PROCESS_CPUTIME_ID` over the measured seconds): on a machine shared with other
//! work, req/s moves with the neighbours' load, CPU per call much less.
//!
//! The load generator and both servers share one tokio runtime and this machine's cores: the
//! figures are a ratio between two variants under the same conditions, not the server's
//! capacity.

#[path = "mcp_server/app.rs"]
mod app;

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};
use stormgate::valid::{NonNegative, Positive};

use axum::Router;
use axum::serve::ListenerExt;
use bytes::Bytes;
use cpu_time::ProcessTime;
use hdrhistogram::Histogram;
use http::Request;
use http::header::{ACCEPT, CONTENT_TYPE};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use stormgate::control::{Config, Control, Mode, Off};
use stormgate::gateway::{GatewayConfig, Proxy};

type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// Command-line settings.
#[derive(Debug, Clone)]
struct Args {
    /// Measured seconds per variant and round.
    duration: f64,
    /// Seconds discarded at the start of each run.
    warmup: f64,
    /// Concurrent connections (each with its own MCP session).
    connections: usize,
    /// Rounds of both variants.
    rounds: usize,
    /// Run one variant only, by its short name (`--only with`), for a profiler.
    only: Option<String>,
    /// Measure the gateway (`--gateway`): a Rust upstream directly, and through the gateway.
    gateway: bool,
}

fn args() -> Args {
    let mut a = Args {
        duration: 5.0,
        warmup: 1.0,
        connections: 64,
        rounds: 3,
        only: None,
        gateway: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--gateway" {
            a.gateway = true;
            continue;
        }
        let value = it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--duration" => a.duration = number(&flag, &value),
            "--warmup" => a.warmup = number(&flag, &value),
            "--connections" => a.connections = number(&flag, &value),
            "--rounds" => a.rounds = number(&flag, &value),
            "--only" => a.only = Some(value),
            _ => panic!(
                "unknown flag {flag} (--duration, --warmup, --connections, --rounds, --only, --gateway)"
            ),
        }
    }
    assert!(a.connections > 0 && a.rounds > 0 && a.duration > 0.0);
    a
}

fn number<T: std::str::FromStr>(flag: &str, value: &str) -> T {
    value
        .parse()
        .unwrap_or_else(|_| panic!("{flag}: not a number: {value}"))
}

/// What one run (or several, merged) measured.
struct Stats {
    /// Answered calls, in microseconds.
    latency: Histogram<u64>,
    ok: u64,
    refused: u64,
    failed: u64,
    seconds: f64,
    /// CPU time this process (servers and client) used while measuring.
    cpu: Duration,
}

impl Stats {
    fn new() -> Self {
        Stats {
            latency: Histogram::new_with_bounds(1, 60_000_000, 3).unwrap(),
            ok: 0,
            refused: 0,
            failed: 0,
            seconds: 0.0,
            cpu: Duration::ZERO,
        }
    }

    fn add(&mut self, other: &Stats) {
        self.latency.add(&other.latency).unwrap();
        self.ok += other.ok;
        self.refused += other.refused;
        self.failed += other.failed;
        self.seconds += other.seconds;
        self.cpu += other.cpu;
    }

    /// Process CPU time per answered call, microseconds.
    fn cpu_per_call(&self) -> f64 {
        self.cpu.as_secs_f64() * 1e6 / self.ok as f64
    }

    fn throughput(&self) -> f64 {
        self.ok as f64 / self.seconds
    }

    fn p(&self, q: f64) -> f64 {
        self.latency.value_at_quantile(q) as f64 / 1000.0
    }
}

/// Serves `router` on a free loopback port.
async fn serve(router: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    // Without TCP_NODELAY, rmcp's answer (an SSE stream written in several small writes) waits
    // on Nagle's algorithm and the client's delayed ACK: about 40 ms per call on Linux.
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    addr
}

fn post(addr: SocketAddr, session: Option<&str>, body: String) -> Request<Full<Bytes>> {
    let mut req = Request::post(format!("http://{addr}/mcp"))
        .header(CONTENT_TYPE, "application/json")
        .header(ACCEPT, "application/json, text/event-stream");
    if let Some(s) = session {
        req = req
            .header("mcp-session-id", s)
            .header("mcp-protocol-version", "2025-11-25");
    }
    req.body(Full::new(Bytes::from(body))).unwrap()
}

/// A client with one keep-alive connection, and the MCP session it opened.
async fn connect(addr: SocketAddr) -> (HttpClient, String) {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client: HttpClient = Client::builder(TokioExecutor::new()).build(connector);
    let init = r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"loadgen","version":"1"}}}"#;
    let res = client.request(post(addr, None, init.into())).await.unwrap();
    assert!(res.status().is_success(), "initialize: {}", res.status());
    let session = res.headers()["mcp-session-id"].to_str().unwrap().to_owned();
    res.into_body().collect().await.unwrap();
    let done = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
    let res = client
        .request(post(addr, Some(&session), done.into()))
        .await
        .unwrap();
    assert!(res.status().is_success(), "initialized: {}", res.status());
    res.into_body().collect().await.unwrap();
    (client, session)
}

/// How an answer counts.
enum Answer {
    Ok,
    Refused,
    Failed,
}

fn judge(status: http::StatusCode, body: &[u8]) -> Answer {
    if status != http::StatusCode::OK {
        return Answer::Failed;
    }
    let text = String::from_utf8_lossy(body);
    if text.contains(r#""notProcessed":true"#) || text.contains(r#""error":"#) {
        Answer::Refused
    } else if text.contains(r#""result":"#) && !text.contains(r#""isError":true"#) {
        Answer::Ok
    } else {
        Answer::Failed
    }
}

/// One connection's loop: calls until `end`, counting those that finish after `measure_from`.
async fn drive(
    client: HttpClient,
    addr: SocketAddr,
    session: String,
    worker: usize,
    measure_from: Instant,
    end: Instant,
) -> Stats {
    let mut stats = Stats::new();
    let mut id = 0u64;
    while Instant::now() < end {
        id += 1;
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"cache_get","arguments":{{"key":"user:{worker}:{}"}}}}}}"#,
            id % 100
        );
        let started = Instant::now();
        let answer = match client.request(post(addr, Some(&session), body)).await {
            Ok(res) => {
                let status = res.status();
                match res.into_body().collect().await {
                    Ok(b) => judge(status, &b.to_bytes()),
                    Err(_) => Answer::Failed,
                }
            }
            Err(_) => Answer::Failed,
        };
        let finished = Instant::now();
        if started < measure_from || finished > end {
            continue;
        }
        match answer {
            Answer::Ok => {
                stats.ok += 1;
                let us = (finished - started).as_micros().max(1) as u64;
                stats.latency.saturating_record(us);
            }
            Answer::Refused => stats.refused += 1,
            Answer::Failed => stats.failed += 1,
        }
    }
    stats
}

/// One run of a variant: every connection at once, warmup then measurement.
async fn run(conns: &[(HttpClient, String)], addr: SocketAddr, a: &Args) -> Stats {
    let start = Instant::now();
    let measure_from = start + Duration::from_secs_f64(a.warmup);
    let end = measure_from + Duration::from_secs_f64(a.duration);
    let tasks: Vec<_> = conns
        .iter()
        .enumerate()
        .map(|(w, (client, session))| {
            tokio::spawn(drive(
                client.clone(),
                addr,
                session.clone(),
                w,
                measure_from,
                end,
            ))
        })
        .collect();
    tokio::time::sleep_until(measure_from.into()).await;
    let cpu = ProcessTime::now();
    let mut total = Stats::new();
    for t in tasks {
        total.add(&t.await.unwrap());
    }
    total.cpu = cpu.elapsed();
    total.seconds = a.duration;
    total
}

fn row(name: &str, s: &Stats) {
    println!(
        "| {name} | {:.0} | {:.3} | {:.3} | {:.1} | {} | {} | {} |",
        s.throughput(),
        s.p(0.50),
        s.p(0.99),
        s.cpu_per_call(),
        s.ok,
        s.refused,
        s.failed
    );
}

/// One way of serving the example: where it listens, its connections, what it measured.
struct Variant {
    /// The name `--only` takes.
    short: &'static str,
    /// Its row in the table.
    name: &'static str,
    addr: SocketAddr,
    conns: Vec<(HttpClient, String)>,
    total: Stats,
}

impl Variant {
    async fn new(short: &'static str, name: &'static str, addr: SocketAddr, a: &Args) -> Self {
        let mut conns = Vec::with_capacity(a.connections);
        for _ in 0..a.connections {
            conns.push(connect(addr).await);
        }
        Variant {
            short,
            name,
            addr,
            conns,
            total: Stats::new(),
        }
    }
}

/// The example configuration with every budget raised so that nothing is refused, in `mode`,
/// `off` doing what `off` says.
fn config(mode: Mode, off: Off) -> Config {
    let mut config = Config::load(Path::new(app::CONFIG)).unwrap();
    config.mode = mode;
    config.off = off;
    config.budget.stable_budget = Positive::new(1e9).unwrap();
    config.tenants.min_budget = Some(NonNegative::new(1e7).unwrap());
    config.sessions.base_budget = Positive::new(1e9).unwrap();
    config.sessions.burst = Positive::new(1e9).unwrap();
    config
}

/// The gateway in front of `upstream`, served with the stack in `mode`.
async fn gateway(upstream: SocketAddr, mode: Mode, off: Off) -> (SocketAddr, Control) {
    let proxy = Proxy::new(&{
        let mut built = GatewayConfig::default();
        built.upstream = Some(format!("http://{upstream}/mcp"));
        built
    })
    .unwrap();
    let control = Control::new(config(mode, off)).unwrap();
    let app = control.wrap(Router::new().route_service("/mcp", proxy));
    (serve(app).await, control)
}

#[tokio::main]
async fn main() {
    let a = args();
    let metrics = stormgate::metrics::prometheus_builder()
        .install_recorder()
        .unwrap();
    let mut controls = Vec::new();
    let mut variants = Vec::new();
    if a.gateway {
        // A Rust upstream (the bare example), so that the proxy is what is measured.
        let upstream = serve(app::mcp_router(app::Backend::new())).await;
        variants
            .push(Variant::new("direct", "the upstream directly (bare rmcp)", upstream, &a).await);
        for (short, name, mode, off) in [
            (
                "pass",
                "through the gateway, stack off passing through",
                Mode::Off,
                Off::PassThrough,
            ),
            (
                "off",
                "through the gateway, stack off",
                Mode::Off,
                Off::Measure,
            ),
            (
                "adaptive",
                "through the gateway, stack adaptive",
                Mode::Adaptive,
                Off::Measure,
            ),
        ] {
            let (addr, control) = gateway(upstream, mode, off).await;
            variants.push(Variant::new(short, name, addr, &a).await);
            controls.push(control);
        }
    } else {
        let (protected, control) = app::app(
            app::Backend::new(),
            config(Mode::Adaptive, Off::Measure),
            metrics,
        )
        .unwrap();
        let with = serve(protected).await;
        let without = serve(app::mcp_router(app::Backend::new())).await;
        variants.push(Variant::new("without", "without stormgate (bare rmcp)", without, &a).await);
        variants.push(Variant::new("with", "with stormgate (adaptive)", with, &a).await);
        controls.push(control);
    }
    let _tasks: Vec<_> = controls.iter().map(Control::spawn).collect();
    if let Some(only) = &a.only {
        assert!(
            variants.iter().any(|v| v.short == only),
            "--only: no variant {only} (the variants: {})",
            variants
                .iter()
                .map(|v| v.short)
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    println!(
        "{} connections, {} rounds of {} s per variant (after {} s warmup each), {} worker threads",
        a.connections,
        a.rounds,
        a.duration,
        a.warmup,
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );

    let n = variants.len();
    for round in 0..a.rounds {
        // Each round starts one variant later, to cancel drift.
        for k in 0..n {
            let v = &mut variants[(round + k) % n];
            if a.only.as_deref().is_some_and(|only| only != v.short) {
                continue;
            }
            let s = run(&v.conns, v.addr, &a).await;
            println!(
                "round {} {:<8} {:>8.0} req/s  p50 {:.3} ms  p99 {:.3} ms  cpu {:.1} µs/call  ok {} refused {} failed {}",
                round + 1,
                v.short,
                s.throughput(),
                s.p(0.50),
                s.p(0.99),
                s.cpu_per_call(),
                s.ok,
                s.refused,
                s.failed
            );
            v.total.add(&s);
        }
    }

    println!();
    println!("| variant | req/s | p50 ms | p99 ms | CPU µs per call | ok | refused | failed |");
    println!("|---|---|---|---|---|---|---|---|");
    for v in &variants {
        row(v.name, &v.total);
    }
    println!();
    let base = &variants[0];
    for v in variants[1..].iter().filter(|_| a.only.is_none()) {
        let (t, b) = (&v.total, &base.total);
        println!(
            "{}: req/s ratio to the first {:.3}; p99 {:+.3} ms, p50 {:+.3} ms; CPU per call {:.1} / {:.1} µs ({:+.1} µs, {:+.1}%)",
            v.short,
            t.throughput() / b.throughput(),
            t.p(0.99) - b.p(0.99),
            t.p(0.50) - b.p(0.50),
            t.cpu_per_call(),
            b.cpu_per_call(),
            t.cpu_per_call() - b.cpu_per_call(),
            100.0 * (t.cpu_per_call() / b.cpu_per_call() - 1.0),
        );
    }
    if variants
        .iter()
        .any(|v| v.total.refused + v.total.failed > 0)
    {
        println!(
            "note: some calls were refused or failed (see the table); they are not throughput"
        );
    }
}
