//! The listener of `stormgate::serve` against idle and slow connections (real sockets on
//! loopback, paused clock: exact): a connection that has not sent a whole request head within
//! the header timeout is closed, whether it sends nothing, trickles a byte at a time, or idles
//! after an answer; a request whose head has arrived is never cut by it; and the connections
//! open at once are capped, counted in `/metrics`. Request smuggling variants and oversized
//! heads are refused (400, 431) and their connection closed.

#![cfg(unix)]

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use metrics_exporter_prometheus::PrometheusBuilder;
use stormgate::serve::{Connections, DEFAULT_HEADER_TIMEOUT, serve_with};
use stormgate::valid::NonZeroDuration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

const REQUEST: &[u8] = b"GET / HTTP/1.1\r\nhost: localhost\r\n\r\n";

/// Serves `/` ("ok") and `/slow` (answered after 120 s) within `limits`.
async fn server(limits: Connections) -> SocketAddr {
    let app = Router::new().route("/", get(|| async { "ok" })).route(
        "/slow",
        get(|| async {
            tokio::time::sleep(Duration::from_secs(120)).await;
            "done"
        }),
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(serve_with(listener, app, Duration::from_secs(1), limits));
    addr
}

/// Reads `tcp` until the server closes it (end of stream or reset); what it read. Panics if
/// it is still open after ten minutes.
async fn until_closed(tcp: &mut TcpStream) -> String {
    let mut read = Vec::new();
    let mut buf = [0u8; 4096];
    let closed = async {
        loop {
            match tcp.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => read.extend_from_slice(&buf[..n]),
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(600), closed)
        .await
        .expect("still open after ten minutes");
    String::from_utf8_lossy(&read).into_owned()
}

/// Reads one whole answer of `body` from `tcp` (the connection stays open).
async fn answer(tcp: &mut TcpStream, body: &str) {
    let mut read = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&read).ends_with(&format!("\r\n\r\n{body}")) {
        let n = tcp.read(&mut buf).await.unwrap();
        assert!(n > 0, "closed before its answer");
        read.extend_from_slice(&buf[..n]);
    }
    assert!(String::from_utf8_lossy(&read).starts_with("HTTP/1.1 200"));
}

#[tokio::test(start_paused = true)]
async fn idle_connections_are_closed_at_the_header_timeout() {
    assert_eq!(
        DEFAULT_HEADER_TIMEOUT,
        Duration::from_secs(30),
        "as documented"
    );
    let addr = server(Connections::default()).await;
    let start = Instant::now();
    let mut idle = Vec::new();
    for _ in 0..200 {
        idle.push(TcpStream::connect(addr).await.unwrap());
    }
    for tcp in &mut idle {
        assert_eq!(until_closed(tcp).await, "", "closed without an answer");
        assert_eq!(
            start.elapsed(),
            DEFAULT_HEADER_TIMEOUT,
            "closed at the timeout"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_head_trickled_a_byte_at_a_time_gains_nothing() {
    let addr = server(Connections::default()).await;
    let start = Instant::now();
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    let (mut read, mut write) = tcp.split();
    let trickle = async {
        write.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
        // One header byte every 5 s, for ten minutes: every byte comes well within any read
        // timeout.
        for _ in 0..120 {
            tokio::time::sleep(Duration::from_secs(5)).await;
            if write.write_all(b"x").await.is_err() {
                break;
            }
        }
    };
    let closed = async {
        let mut buf = [0u8; 64];
        while matches!(read.read(&mut buf).await, Ok(n) if n > 0) {}
        start.elapsed()
    };
    let closed_at = tokio::select! {
        biased;
        at = closed => at,
        () = trickle => panic!("still open after ten minutes of trickling"),
    };
    assert_eq!(closed_at, Duration::from_secs(30));
}

#[tokio::test(start_paused = true)]
async fn a_kept_alive_connection_is_closed_once_idle_for_the_timeout() {
    let ten_seconds = NonZeroDuration::from_millis(10_000).unwrap();
    let addr = server(Connections::default().header_timeout(ten_seconds)).await;
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    // Nine seconds before each request: within the timeout every time, so served each time.
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_secs(9)).await;
        tcp.write_all(REQUEST).await.unwrap();
        answer(&mut tcp, "ok").await;
    }
    let answered = Instant::now();
    assert_eq!(until_closed(&mut tcp).await, "");
    assert_eq!(answered.elapsed(), Duration::from_secs(10));
}

#[tokio::test(start_paused = true)]
async fn a_request_whose_head_arrived_is_not_cut_by_the_header_timeout() {
    let addr = server(Connections::default()).await;
    let start = Instant::now();
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(b"GET /slow HTTP/1.1\r\nhost: localhost\r\n\r\n")
        .await
        .unwrap();
    answer(&mut tcp, "done").await;
    assert_eq!(start.elapsed(), Duration::from_secs(120));
}

#[tokio::test(start_paused = true)]
async fn open_connections_are_capped_and_counted() {
    let recorder = PrometheusBuilder::new().build_recorder();
    let metrics = recorder.handle();
    let _local = metrics::set_default_local_recorder(&recorder);
    let gauge = || {
        metrics
            .render()
            .lines()
            .find_map(|l| l.strip_prefix("stormgate_connections_open "))
            .map(|v| v.parse::<f64>().unwrap())
    };
    let two = std::num::NonZeroUsize::new(2).unwrap();
    let addr = server(Connections::default().max_connections(two)).await;
    let start = Instant::now();
    let mut a = TcpStream::connect(addr).await.unwrap();
    let mut b = TcpStream::connect(addr).await.unwrap();
    // A third connects (the kernel's backlog takes it) and asks at once; it is not served
    // while the two idle ones hold the places.
    let mut c = TcpStream::connect(addr).await.unwrap();
    c.write_all(REQUEST).await.unwrap();
    let mut buf = [0u8; 64];
    assert!(
        tokio::time::timeout(Duration::from_secs(29), c.read(&mut buf))
            .await
            .is_err(),
        "served past the cap"
    );
    assert_eq!(gauge(), Some(2.0));
    // The idle two are closed at the header timeout; the third takes a place and is answered.
    assert_eq!(until_closed(&mut a).await, "");
    assert_eq!(until_closed(&mut b).await, "");
    answer(&mut c, "ok").await;
    assert_eq!(start.elapsed(), DEFAULT_HEADER_TIMEOUT);
    let timed_out = metrics
        .render()
        .lines()
        .find_map(|l| l.strip_prefix("stormgate_connections_timed_out_total "))
        .map(|v| v.parse::<f64>().unwrap());
    assert_eq!(timed_out, Some(2.0));
    assert_eq!(gauge(), Some(1.0), "the third is open");
}

/// What the server answered to `request` on one connection, read until it closed it.
async fn answers_to(addr: SocketAddr, request: &[u8]) -> String {
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    // The server may answer and close before all of a huge request is written.
    let _ = tcp.write_all(request).await;
    until_closed(&mut tcp).await
}

#[tokio::test(start_paused = true)]
async fn smuggling_variants_and_oversized_heads_are_refused_and_the_connection_closed() {
    let app = Router::new().route("/", axum::routing::post(|body: String| async move { body }));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(serve_with(
        listener,
        app,
        Duration::from_secs(1),
        Connections::default(),
    ));
    let many_headers: String = (0..200).map(|i| format!("x-h{i}: v\r\n")).collect();
    let huge_header = format!("x-big: {}\r\n", "a".repeat(1 << 20));
    let cases: [(&str, String, &str); 4] = [
        (
            "two different Content-Lengths",
            "POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\nhello!"
                .into(),
            "HTTP/1.1 400",
        ),
        (
            "a Transfer-Encoding other than chunked last",
            "POST / HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked, identity\r\n\r\n0\r\n\r\n"
                .into(),
            "HTTP/1.1 400",
        ),
        (
            "200 header fields",
            format!("POST / HTTP/1.1\r\nhost: x\r\n{many_headers}content-length: 0\r\n\r\n"),
            "HTTP/1.1 431",
        ),
        (
            "a 1 MiB header",
            format!("POST / HTTP/1.1\r\nhost: x\r\n{huge_header}content-length: 0\r\n\r\n"),
            "HTTP/1.1 431",
        ),
    ];
    for (what, request, expected) in cases {
        let answers = answers_to(addr, request.as_bytes()).await;
        assert!(answers.starts_with(expected), "{what}: {answers:?}");
        assert_eq!(
            answers.matches("HTTP/1.1").count(),
            1,
            "{what}: one answer, then closed"
        );
    }
    // Content-Length and Transfer-Encoding both: chunked framing wins (RFC 9112, 6.3), the
    // request is answered with `connection: close`, and nothing after it is read as another.
    let answers = answers_to(
        addr,
        b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\nPOST / HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\nhi",
    )
    .await;
    assert_eq!(answers.matches("HTTP/1.1").count(), 1, "{answers:?}");
    assert!(answers.starts_with("HTTP/1.1 200"), "{answers:?}");
    assert!(answers.contains("connection: close\r\n"), "{answers:?}");
    assert!(answers.contains("content-length: 0\r\n"), "{answers:?}");
}
