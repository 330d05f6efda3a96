//! SIGTERM (what orchestrators send) lets the calls in flight finish, then the example server
//! returns; a call that outlives the grace period does not hold the process. One test in this
//! binary: signals are process-wide.

#![cfg(unix)]

mod common;

#[path = "../examples/mcp_server/app.rs"]
mod app;
use stormgate::serve as shutdown;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::get;
use common::Logs;
use rmcp::ServiceExt;
use rmcp::model::{CallToolRequestParams, ClientConfig};
use rmcp::transport::StreamableHttpClientTransport;
use stormgate::control::Config;

fn terminate_self() {
    let status = std::process::Command::new("kill")
        .args(["-TERM", &std::process::id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

/// A bounded wait: gives up after 10 s.
async fn until(what: &str, mut cond: impl FnMut() -> bool) {
    for _ in 0..2000 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("{what} did not happen within 10 s");
}

#[tokio::test(flavor = "current_thread")]
async fn sigterm_drains_calls_in_flight_within_the_grace_period() {
    let (logs, _guard) = Logs::capture();
    assert_eq!(
        shutdown::DEFAULT_GRACE,
        Duration::from_secs(30),
        "as documented"
    );

    // 1. Eight scans in flight (four running, four waiting for the pool) when SIGTERM comes.
    let backend = app::Backend::new();
    let (router, _control) = app::protected(backend.clone(), Config::default()).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(shutdown::serve(listener, router, Duration::from_secs(20)));
    let transport = StreamableHttpClientTransport::from_uri(format!("http://{addr}/mcp"));
    let client = ClientConfig::default().serve(transport).await.unwrap();
    let calls: Vec<_> = (0..8)
        .map(|i| {
            let peer = client.peer().clone();
            let mut args = serde_json::Map::new();
            args.insert("table".into(), format!("t{i}").into());
            let params = CallToolRequestParams::new("sql_scan").with_arguments(args);
            tokio::spawn(async move { peer.call_tool(params).await })
        })
        .collect();
    until("eight scans in flight", || backend.scans_started() == 8).await;
    assert_eq!(backend.scans(), 0, "none finished yet");
    let signalled = Instant::now();
    terminate_self();
    for call in calls {
        let result = call.await.unwrap().expect("answered, not cut");
        assert_eq!(result.is_error, Some(false));
    }
    assert_eq!(backend.scans(), 8);
    client.cancel().await.unwrap();
    let served = tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .expect("returned once the calls were done");
    assert_eq!(
        served.unwrap().unwrap(),
        shutdown::Stopped::Drained { signal: "SIGTERM" }
    );
    assert!(signalled.elapsed() < Duration::from_secs(10));
    assert!(
        logs.text().contains("signal=\"SIGTERM\""),
        "{}",
        logs.text()
    );
    assert!(logs.text().contains("every call in flight finished"));

    // 2. A call that outlives the grace period: the server returns when the grace is over.
    let started = Arc::new(AtomicBool::new(false));
    let flag = started.clone();
    let slow = Router::new().route(
        "/slow",
        get(move || {
            flag.store(true, Ordering::SeqCst);
            async {
                tokio::time::sleep(Duration::from_secs(600)).await;
                "late"
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let grace = Duration::from_millis(300);
    let server = tokio::spawn(shutdown::serve(listener, slow, grace));
    let request = tokio::spawn(async move {
        let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        tokio::io::AsyncWriteExt::write_all(
            &mut tcp,
            b"GET /slow HTTP/1.1\r\nhost: localhost\r\n\r\n",
        )
        .await
        .unwrap();
        tcp
    });
    until("the slow call in flight", || started.load(Ordering::SeqCst)).await;
    let signalled = Instant::now();
    terminate_self();
    tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .expect("returned at the end of the grace period")
        .unwrap()
        .map(|stopped| {
            assert_eq!(
                stopped,
                shutdown::Stopped::GraceExpired { signal: "SIGTERM" }
            )
        })
        .unwrap();
    let took = signalled.elapsed();
    assert!(took >= grace && took < Duration::from_secs(10), "{took:?}");
    assert!(logs.text().contains("grace period over"), "{}", logs.text());
    drop(request);

    // 3. An event stream opened with GET (an MCP session's server messages) never ends by
    // itself: the drain ends it at once, so the server returns well before a long grace.
    let events = Router::new().route(
        "/mcp",
        get(|| async {
            let ticks = futures::stream::unfold((), |()| async {
                tokio::time::sleep(Duration::from_millis(50)).await;
                Some((Ok::<_, std::convert::Infallible>(": ping\n\n"), ()))
            });
            (
                [("content-type", "text/event-stream")],
                axum::body::Body::from_stream(ticks),
            )
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let grace = Duration::from_secs(8);
    let server = tokio::spawn(shutdown::serve(listener, events, grace));
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    tokio::io::AsyncWriteExt::write_all(
        &mut tcp,
        b"GET /mcp HTTP/1.1\r\nhost: localhost\r\naccept: text/event-stream\r\n\r\n",
    )
    .await
    .unwrap();
    let mut first = [0u8; 64];
    let n = tokio::io::AsyncReadExt::read(&mut tcp, &mut first)
        .await
        .unwrap();
    assert!(
        first[..n].starts_with(b"HTTP/1.1 200"),
        "the stream is open"
    );
    let reader = tokio::spawn(async move {
        let mut rest = Vec::new();
        let _ = tokio::io::AsyncReadExt::read_to_end(&mut tcp, &mut rest).await;
        rest
    });
    let signalled = Instant::now();
    terminate_self();
    let stopped = tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .expect("returned")
        .unwrap()
        .unwrap();
    assert_eq!(stopped, shutdown::Stopped::Drained { signal: "SIGTERM" });
    let took = signalled.elapsed();
    assert!(
        took < Duration::from_secs(2),
        "the stream held the drain {took:?}"
    );
    let rest = tokio::time::timeout(Duration::from_secs(5), reader)
        .await
        .expect("the client sees its stream end")
        .unwrap();
    assert!(
        rest.ends_with(b"0\r\n\r\n"),
        "a clean end of the chunked body"
    );
}
