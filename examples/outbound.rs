//! The FIFO limiter around an outbound HTTP client, against a local stand-in upstream that
//! answers 429 with `Retry-After: 2` to its third request.
//!
//! ```text
//! cargo run --example outbound
//! ```
//! Six calls are fired at once. The limiter lets one run at a time, 250 ms apart; the rest wait
//! in FIFO order. When the upstream answers 429, the limiter reads `Retry-After` and holds the
//! queue for 2 s instead of letting the next call hit the same 429. Each line is the audit of
//! one call: its queue wait (an audit's `queueWaitMs`) and when it was admitted.

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use stormgate::valid::NonZeroDuration;

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderValue, Request, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use stormgate::fifo::{OutboundLimitLayer, QueueWait, ResourceLimiter, ResourceLimits};
use tokio::time::Instant;
use tower::{Layer, ServiceExt};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    // The stand-in upstream.
    let hits = Arc::new(AtomicUsize::new(0));
    let upstream = Router::new().route(
        "/query",
        get(move || {
            let n = hits.fetch_add(1, Ordering::SeqCst) + 1;
            async move {
                if n == 3 {
                    let mut res = (StatusCode::TOO_MANY_REQUESTS, "slow down").into_response();
                    res.headers_mut()
                        .insert("retry-after", HeaderValue::from_static("2"));
                    res
                } else {
                    (StatusCode::OK, format!("result {n}")).into_response()
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, upstream).await });

    // The client, limited per upstream host.
    let limiter = ResourceLimiter::builder()
        .key(
            "127.0.0.1",
            ResourceLimits::default()
                .min_interval(Duration::from_millis(250))
                .max_concurrent(NonZeroUsize::MIN)
                .max_queue_depth(8)
                .queue_timeout(NonZeroDuration::new(Duration::from_secs(10)).unwrap()),
        )
        .build();
    let client = Client::builder(TokioExecutor::new()).build_http::<Body>();
    let client = OutboundLimitLayer::new(limiter).layer(client);

    let start = Instant::now();
    let calls: Vec<_> = (1..=6)
        .map(|i| {
            let client = client.clone();
            let uri = format!("http://{addr}/query?call={i}");
            tokio::spawn(async move {
                let req = Request::get(uri)
                    .body(Body::empty())
                    .expect("valid request");
                let res = client.oneshot(req).await?;
                let wait = res
                    .extensions()
                    .get::<QueueWait>()
                    .map_or(Duration::ZERO, |w| w.0);
                Ok::<_, tower::BoxError>((i, res.status(), wait, start.elapsed()))
            })
        })
        .collect();
    println!("call  status  queue_wait_ms  done_at_ms");
    for call in calls {
        let (i, status, wait, done) = call.await??;
        println!(
            "{i:>4}  {:>6}  {:>13}  {:>10}",
            status.as_u16(),
            wait.as_millis(),
            done.as_millis()
        );
    }
    Ok(())
}
