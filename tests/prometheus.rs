//! A real Prometheus (the Debian `prometheus` package; .ci/run installs it when missing)
//! scrapes the example server on loopback while it is driven through every refusal; then
//! every panel query of dashboards/stormgate.json, variables substituted, must return data.
//! With the `redis` feature the server shares its budget through a real `redis-server`
//! (stopped for a moment, so the Redis-error panel has data too), and the shared budget's
//! row is checked as well. One test in this binary: it installs the recorder.

mod common;
mod driver;
#[cfg(feature = "redis")]
mod redis_support;

#[path = "../examples/mcp_server/app.rs"]
mod app;

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

/// Kills Prometheus however the test ends.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn prometheus_binary() -> String {
    let path =
        std::env::var("STORMGATE_PROMETHEUS").unwrap_or_else(|_| "/usr/bin/prometheus".into());
    assert!(
        std::path::Path::new(&path).exists(),
        "no Prometheus at {path}: install the Debian package `prometheus` (.ci/run does) or set STORMGATE_PROMETHEUS"
    );
    path
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn encode(q: &str) -> String {
    q.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

async fn get(uri: &str) -> Option<(u16, String)> {
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let res = tokio::time::timeout(Duration::from_secs(5), client.get(uri.parse().ok()?))
        .await
        .ok()?
        .ok()?;
    let status = res.status().as_u16();
    let body = res.into_body().collect().await.ok()?.to_bytes();
    Some((status, String::from_utf8_lossy(&body).into_owned()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_returns_data_for_every_panel_query() {
    let binary = prometheus_binary();
    let handle = stormgate::metrics::prometheus_builder()
        .install_recorder()
        .unwrap();
    #[cfg_attr(not(feature = "redis"), allow(unused_mut))]
    let mut config = driver::config();
    #[cfg(feature = "redis")]
    let mut redis = redis_support::RedisServer::start();
    #[cfg(feature = "redis")]
    {
        config.distributed = Some({
            let mut built = stormgate::distributed::DistributedConfig::default();
            built.url = redis.url();
            built
        });
    }
    let (router, control) = app::protected(app::Backend::new(), config).unwrap();
    let router = router.route(
        "/metrics",
        axum::routing::get(move || std::future::ready(handle.render())),
    );
    let _tasks = control.spawn();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let app_addr: SocketAddr = listener.local_addr().unwrap();
    tokio::spawn({
        let router = router.clone();
        async move { axum::serve(listener, router).await.unwrap() }
    });

    let dir = std::env::temp_dir().join(format!("stormgate-prometheus-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("prometheus.yml"),
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: stormgate\n    static_configs:\n      - targets: ['{app_addr}']\n"
        ),
    )
    .unwrap();
    let port = free_port();
    let prom = format!("http://127.0.0.1:{port}");
    let _prometheus = Running(
        Command::new(&binary)
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--log.level=warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start prometheus"),
    );
    let started = Instant::now();
    while get(&format!("{prom}/-/ready")).await.map(|r| r.0) != Some(200) {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "Prometheus did not become ready"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Real time: which budget refuses first may vary with timing (tests/dashboards.rs checks
    // every reason in paused time); here the traffic only has to reach every panel.
    let seen = driver::drive(&router, &control).await;
    assert!(seen.len() >= 5, "{seen:?}");
    #[cfg(feature = "redis")]
    {
        // Redis away for a moment: the node falls back, and counts the errors.
        redis.kill();
        tokio::time::sleep(Duration::from_millis(1500)).await;
        redis.restart();
        let shared = control.budget().shared().unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while shared.mode() != stormgate::distributed::SharedMode::Shared {
            assert!(Instant::now() < deadline, "the node did not reconnect");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(shared.stats().errors > 0);
    }

    // Every panel query, with Grafana's variables substituted, must return data. Bounded:
    // each query is retried for up to 20 s while scrapes accumulate.
    let queries = driver::panel_queries()
        .into_iter()
        .filter(|q| cfg!(feature = "redis") || q.row != driver::SHARED_ROW);
    for driver::PanelQuery { title, expr, .. } in queries {
        let query = expr
            .replace("$__rate_interval", "1m")
            .replace("$tenant", ".*")
            .replace("$tool", ".*");
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let answer = get(&format!("{prom}/api/v1/query?query={}", encode(&query))).await;
            let results = answer
                .as_ref()
                .and_then(|(_, body)| serde_json::from_str::<Value>(body).ok())
                .filter(|v| v["status"] == "success")
                .map_or(0, |v| v["data"]["result"].as_array().map_or(0, Vec::len));
            if results > 0 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "panel {title:?}: no data for {query} (last answer: {answer:?})"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
