//! The outbound FIFO limiter around an HTTP client (a stand-in service), paused time.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use http::{Request, Response, StatusCode};
use stormgate::fifo::{
    AcquireError, OutboundLimitLayer, QueueWait, ResourceLimiter, ResourceLimits,
};
use tokio::time::Instant;
use tower::{Layer, ServiceExt};

/// An upstream that answers 429 with `retry_after` to its first request, 200 after.
fn upstream(
    retry_after: Option<String>,
) -> (
    Arc<AtomicUsize>,
    impl tower::Service<
        Request<()>,
        Response = Response<String>,
        Error = Infallible,
        Future = impl Send,
    > + Clone
    + Send
    + 'static,
) {
    let hits = Arc::new(AtomicUsize::new(0));
    let counter = hits.clone();
    let svc = tower::service_fn(move |_req: Request<()>| {
        let n = counter.fetch_add(1, Ordering::SeqCst);
        let retry_after = retry_after.clone();
        async move {
            let mut res = Response::new(String::from("body"));
            if n == 0 {
                *res.status_mut() = StatusCode::TOO_MANY_REQUESTS;
                if let Some(v) = retry_after {
                    res.headers_mut().insert("retry-after", v.parse().unwrap());
                }
            }
            Ok::<_, Infallible>(res)
        }
    });
    (hits, svc)
}

fn get(host: &str) -> Request<()> {
    Request::get(format!("http://{host}/query"))
        .body(())
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_429_with_retry_after_defers_the_next_request_of_that_host() {
    let limiter = ResourceLimiter::builder().build();
    let (hits, svc) = upstream(Some("5".into()));
    let client = OutboundLimitLayer::new(limiter.clone()).layer(svc);
    let start = Instant::now();
    let first = client
        .clone()
        .oneshot(get("export.arxiv.org"))
        .await
        .unwrap();
    assert_eq!(
        first.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "returned to the caller as is"
    );
    drop(first);
    let second = client
        .clone()
        .oneshot(get("export.arxiv.org"))
        .await
        .unwrap();
    assert_eq!(second.status(), StatusCode::OK);
    assert_eq!(start.elapsed(), Duration::from_secs(5));
    assert_eq!(
        second.extensions().get::<QueueWait>(),
        Some(&QueueWait(Duration::from_secs(5)))
    );
    // Another host is not held up.
    let other = Instant::now();
    client
        .oneshot(get("eutils.ncbi.nlm.nih.gov"))
        .await
        .unwrap();
    assert_eq!(other.elapsed(), Duration::ZERO);
    assert_eq!(hits.load(Ordering::SeqCst), 3);
}

#[tokio::test(start_paused = true)]
async fn a_429_with_an_http_date_or_none_uses_that_or_one_second() {
    let in_3s = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(3));
    for (header, expected) in [(Some(in_3s), 2..=3), (None, 1..=1)] {
        let (_, svc) = upstream(header);
        let client = OutboundLimitLayer::new(ResourceLimiter::builder().build()).layer(svc);
        let start = Instant::now();
        drop(client.clone().oneshot(get("api.example")).await.unwrap());
        client.oneshot(get("api.example")).await.unwrap();
        // An HTTP-date has whole-second precision against the wall clock.
        assert!(
            expected.contains(&start.elapsed().as_secs()),
            "{:?}",
            start.elapsed()
        );
    }
}

#[tokio::test(start_paused = true)]
async fn refusals_are_errors_that_downcast_to_acquire_error() {
    // Cooling down after the 429 (1 s: no Retry-After, longer than the 200 ms pacing), and no
    // queue to wait in: refused at once.
    let limiter = ResourceLimiter::builder()
        .key(
            "api.example",
            ResourceLimits::public_api().max_queue_depth(0),
        )
        .build();
    let (_, svc) = upstream(None);
    let client = OutboundLimitLayer::new(limiter).layer(svc);
    drop(client.clone().oneshot(get("api.example")).await.unwrap());
    let err = client
        .clone()
        .oneshot(get("api.example"))
        .await
        .unwrap_err();
    let err = err.downcast::<AcquireError>().unwrap();
    assert_eq!(
        *err,
        AcquireError::UpstreamRateLimited {
            retry_after: Duration::from_secs(1)
        }
    );

    // Two in flight, none may queue: the third is refused.
    let limiter = ResourceLimiter::builder()
        .key(
            "api.example",
            ResourceLimits::default()
                .max_concurrent(std::num::NonZeroUsize::new(2).unwrap())
                .max_queue_depth(0),
        )
        .build();
    let ok = tower::service_fn(|_req: Request<()>| async {
        Ok::<_, Infallible>(Response::new(String::new()))
    });
    let client = OutboundLimitLayer::new(limiter).layer(ok);
    let _a = client.clone().oneshot(get("api.example")).await.unwrap();
    let _b = client.clone().oneshot(get("api.example")).await.unwrap();
    let err = client.oneshot(get("api.example")).await.unwrap_err();
    // Nothing measured yet: two running calls of unknown hold (1 s prior), 2 side by side.
    assert_eq!(
        *err.downcast::<AcquireError>().unwrap(),
        AcquireError::QueueFull {
            depth: 0,
            retry_after: Duration::from_millis(500)
        }
    );
}

#[tokio::test(start_paused = true)]
async fn the_place_is_held_until_the_body_is_dropped() {
    let limiter = ResourceLimiter::builder()
        .key(
            "h",
            ResourceLimits::default().max_concurrent(std::num::NonZeroUsize::MIN),
        )
        .build();
    let svc = tower::service_fn(|_req: Request<()>| async {
        Ok::<_, Infallible>(Response::new(String::from("x")))
    });
    let client = OutboundLimitLayer::new(limiter.clone())
        .key_fn(|_uri: &http::Uri| "h".to_owned())
        .layer(svc);
    let response = client.oneshot(get("anything")).await.unwrap();
    assert_eq!(limiter.in_flight("h"), 1);
    drop(response);
    assert_eq!(limiter.in_flight("h"), 0);
}

/// An upstream that fails its first `failures` requests with `status` (or a transport error
/// when `status` is None), then answers 200.
fn flaky(
    failures: usize,
    status: Option<StatusCode>,
) -> (
    Arc<AtomicUsize>,
    impl tower::Service<
        Request<()>,
        Response = Response<String>,
        Error = std::io::Error,
        Future = impl Send,
    > + Clone
    + Send
    + 'static,
) {
    let hits = Arc::new(AtomicUsize::new(0));
    let counter = hits.clone();
    let svc = tower::service_fn(move |_req: Request<()>| {
        let n = counter.fetch_add(1, Ordering::SeqCst);
        async move {
            if n < failures {
                match status {
                    Some(s) => {
                        let mut res = Response::new(String::new());
                        *res.status_mut() = s;
                        Ok(res)
                    }
                    None => Err(std::io::Error::other("connection reset")),
                }
            } else {
                Ok(Response::new(String::from("ok")))
            }
        }
    });
    (hits, svc)
}

fn request(method: http::Method) -> Request<()> {
    Request::builder()
        .method(method)
        .uri("http://api.example/x")
        .body(())
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_safe_call_that_failed_is_retried_once_and_nothing_else_is() {
    let limiter = || ResourceLimiter::builder().build();
    // GET after a 503: retried once, succeeds.
    let (hits, svc) = flaky(1, Some(StatusCode::SERVICE_UNAVAILABLE));
    let client = OutboundLimitLayer::new(limiter()).retry_once().layer(svc);
    let res = client.oneshot(request(http::Method::GET)).await.unwrap();
    assert_eq!(
        (res.status(), hits.load(Ordering::SeqCst)),
        (StatusCode::OK, 2)
    );
    // GET after a transport error: retried once.
    let (hits, svc) = flaky(1, None);
    let client = OutboundLimitLayer::new(limiter()).retry_once().layer(svc);
    assert!(client.oneshot(request(http::Method::GET)).await.is_ok());
    assert_eq!(hits.load(Ordering::SeqCst), 2);
    // At most once: two failures in a row come back as the second failure.
    let (hits, svc) = flaky(2, Some(StatusCode::BAD_GATEWAY));
    let client = OutboundLimitLayer::new(limiter()).retry_once().layer(svc);
    let res = client.oneshot(request(http::Method::GET)).await.unwrap();
    assert_eq!(
        (res.status(), hits.load(Ordering::SeqCst)),
        (StatusCode::BAD_GATEWAY, 2)
    );
    // A write is never retried.
    let (hits, svc) = flaky(1, Some(StatusCode::SERVICE_UNAVAILABLE));
    let client = OutboundLimitLayer::new(limiter()).retry_once().layer(svc);
    let res = client.oneshot(request(http::Method::POST)).await.unwrap();
    assert_eq!(
        (res.status(), hits.load(Ordering::SeqCst)),
        (StatusCode::SERVICE_UNAVAILABLE, 1)
    );
    // A 429 is never retried (the cooldown handles it).
    let (hits, svc) = flaky(1, Some(StatusCode::TOO_MANY_REQUESTS));
    let client = OutboundLimitLayer::new(limiter()).retry_once().layer(svc);
    let res = client.oneshot(request(http::Method::GET)).await.unwrap();
    assert_eq!(
        (res.status(), hits.load(Ordering::SeqCst)),
        (StatusCode::TOO_MANY_REQUESTS, 1)
    );
    // No time left before the deadline: no retry.
    let (hits, svc) = flaky(1, Some(StatusCode::SERVICE_UNAVAILABLE));
    let client = OutboundLimitLayer::new(limiter()).retry_once().layer(svc);
    let mut req = request(http::Method::GET);
    req.extensions_mut()
        .insert(stormgate::deadline::Deadline(Instant::now()));
    let res = client.oneshot(req).await.unwrap();
    assert_eq!(
        (res.status(), hits.load(Ordering::SeqCst)),
        (StatusCode::SERVICE_UNAVAILABLE, 1)
    );
    // Off by default.
    let (hits, svc) = flaky(1, Some(StatusCode::SERVICE_UNAVAILABLE));
    let client = OutboundLimitLayer::new(limiter()).layer(svc);
    client.oneshot(request(http::Method::GET)).await.unwrap();
    assert_eq!(hits.load(Ordering::SeqCst), 1);
}

/// Every release path of the outbound limiter around tower-test's mock client, one place on
/// one key: a request that runs holds the place until its response is dropped; one that waits
/// and is dropped leaves the queue and never runs; one the full queue refuses never runs; one
/// dropped while the upstream works gives its place to the next at once.
#[tokio::test(start_paused = true)]
async fn every_release_path_gives_the_place_back_once() {
    let limiter = ResourceLimiter::builder()
        .key(
            "h",
            ResourceLimits::default()
                .max_concurrent(std::num::NonZeroUsize::MIN)
                .max_queue_depth(1),
        )
        .build();
    let (mock, mut handle) = tower_test::mock::pair::<Request<()>, Response<String>>();
    let client = OutboundLimitLayer::new(limiter.clone())
        .key_fn(|_uri: &http::Uri| "h".to_owned())
        .layer(mock);
    // The first runs; the second waits in the queue; the third finds it full.
    let first = tokio::spawn(client.clone().oneshot(get("a")));
    let (_, respond) = handle.next_request().await.expect("the first runs");
    assert_eq!(limiter.in_flight("h"), 1);
    let second = tokio::spawn(client.clone().oneshot(get("b")));
    tokio::task::yield_now().await;
    let refused = client.clone().oneshot(get("c")).await.unwrap_err();
    assert!(
        matches!(
            refused.downcast_ref::<AcquireError>(),
            Some(AcquireError::QueueFull { .. })
        ),
        "{refused}"
    );

    // The waiter goes away: it leaves the queue and never runs.
    second.abort();
    assert!(second.await.unwrap_err().is_cancelled());
    respond.send_response(Response::new(String::from("one")));
    let response = first.await.unwrap().unwrap();
    assert_eq!(
        limiter.in_flight("h"),
        1,
        "held until the response is dropped"
    );
    drop(response);
    assert_eq!(limiter.in_flight("h"), 0);

    // One dropped while the upstream works gives its place to the next at once.
    let working = tokio::spawn(client.clone().oneshot(get("d")));
    let (req, _respond) = handle.next_request().await.expect("it runs");
    assert_eq!(req.uri().host(), Some("d"), "the dropped waiter never ran");
    let next = tokio::spawn(client.clone().oneshot(get("e")));
    tokio::task::yield_now().await;
    assert_eq!(limiter.in_flight("h"), 1);
    working.abort();
    assert!(working.await.unwrap_err().is_cancelled());
    let (req, respond) = handle.next_request().await.expect("the next runs now");
    assert_eq!(req.uri().host(), Some("e"));
    respond.send_response(Response::new(String::from("e")));
    drop(next.await.unwrap().unwrap());
    assert_eq!(limiter.in_flight("h"), 0);
}
