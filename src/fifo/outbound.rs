//! The FIFO limiter around an outbound HTTP client, keyed by host.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::SystemTime;

use std::time::Duration;

use http::{Method, Request, Response, StatusCode, header};
use tower::{BoxError, Layer, Service, ServiceExt};

use super::body::{LeaseBody, Leases};
use super::{QueueWait, ResourceLimiter, parse_retry_after};
use crate::extensions::Deadline;

type KeyFn = Arc<dyn Fn(&http::Uri) -> String + Send + Sync>;

/// Limits an outbound HTTP client per upstream (the key, its rate-limit group, defaults to the
/// host), and feeds upstream 429s back into the key's cooldown by itself.
///
/// Requests wait in the key's FIFO queue; a refusal is an error that downcasts to
/// [`AcquireError`](super::AcquireError). A `429 Too Many Requests` answer reports
/// `Retry-After` (either form; 1 s when absent) to
/// [`ResourceLimiter::report_upstream_rate_limit`] and is returned to the caller as is. The
/// place is held until the response body ends.
pub struct OutboundLimitLayer {
    limiter: ResourceLimiter,
    key: KeyFn,
    retry_once: bool,
}

impl OutboundLimitLayer {
    /// Keyed by the request URI's host (`"unknown"` when it has none).
    pub fn new(limiter: ResourceLimiter) -> Self {
        OutboundLimitLayer {
            limiter,
            key: Arc::new(|uri: &http::Uri| uri.host().unwrap_or("unknown").to_owned()),
            retry_once: false,
        }
    }

    /// Retries a failed call once, and only when that cannot repeat a side effect (never a
    /// blind retry): a bodiless safe request (GET, HEAD, OPTIONS, TRACE) whose answer was a
    /// 5xx or a transport error, and only while its [`Deadline`](crate::extensions::Deadline)
    /// (when the request carries one) has time left. Never a 429 (the cooldown handles those),
    /// never a write. The retry keeps the call's place. Off by default.
    pub fn retry_once(mut self) -> Self {
        self.retry_once = true;
        self
    }

    /// Keyed by `key(uri)` instead, e.g. to make several hosts share one quota.
    pub fn key_fn(mut self, key: impl Fn(&http::Uri) -> String + Send + Sync + 'static) -> Self {
        self.key = Arc::new(key);
        self
    }
}

impl Clone for OutboundLimitLayer {
    fn clone(&self) -> Self {
        OutboundLimitLayer {
            limiter: self.limiter.clone(),
            key: self.key.clone(),
            retry_once: self.retry_once,
        }
    }
}

impl fmt::Debug for OutboundLimitLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OutboundLimitLayer")
            .field("limiter", &self.limiter)
            .finish_non_exhaustive()
    }
}

impl<S> Layer<S> for OutboundLimitLayer {
    type Service = OutboundLimit<S>;

    fn layer(&self, inner: S) -> OutboundLimit<S> {
        OutboundLimit {
            inner,
            limiter: self.limiter.clone(),
            key: self.key.clone(),
            retry_once: self.retry_once,
        }
    }
}

/// The outbound FIFO limiter. Built by [`OutboundLimitLayer`].
pub struct OutboundLimit<S> {
    inner: S,
    limiter: ResourceLimiter,
    key: KeyFn,
    retry_once: bool,
}

impl<S: Clone> Clone for OutboundLimit<S> {
    fn clone(&self) -> Self {
        OutboundLimit {
            inner: self.inner.clone(),
            limiter: self.limiter.clone(),
            key: self.key.clone(),
            retry_once: self.retry_once,
        }
    }
}

impl<S: fmt::Debug> fmt::Debug for OutboundLimit<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OutboundLimit")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

/// A copy of a bodiless safe request (GET, HEAD, OPTIONS, TRACE), or `None`.
fn retry_copy<B: Default>(req: &Request<B>) -> Option<Request<B>> {
    let safe = [Method::GET, Method::HEAD, Method::OPTIONS, Method::TRACE];
    let bodiless = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .is_none_or(|v| v == "0")
        && !req.headers().contains_key(header::TRANSFER_ENCODING);
    if !safe.contains(req.method()) || !bodiless {
        return None;
    }
    let mut copy = Request::new(B::default());
    *copy.method_mut() = req.method().clone();
    *copy.uri_mut() = req.uri().clone();
    *copy.version_mut() = req.version();
    *copy.headers_mut() = req.headers().clone();
    Some(copy)
}

/// Response future of [`OutboundLimit`].
pub type OutboundFuture<T> = Pin<Box<dyn Future<Output = Result<T, BoxError>> + Send>>;

impl<S, B, RB> Service<Request<B>> for OutboundLimit<S>
where
    S: Service<Request<B>, Response = Response<RB>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Into<BoxError>,
    B: Default + Send + 'static,
    RB: Send + 'static,
{
    type Response = Response<LeaseBody<RB>>;
    type Error = BoxError;
    type Future = OutboundFuture<Self::Response>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        // Readiness is taken after the wait, on a clone, so none is held while queued.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let key = (self.key)(req.uri());
        let acquire = self.limiter.acquire(&key, None);
        let limiter = self.limiter.clone();
        let inner = self.inner.clone();
        // A copy to retry with, for the requests a retry cannot harm.
        let again = self.retry_once.then(|| retry_copy(&req)).flatten();
        let deadline = req.extensions().get::<Deadline>().copied();
        Box::pin(async move {
            let lease = acquire.await?;
            let queue_wait = lease.queue_wait();
            let first = inner.clone().oneshot(req).await.map_err(Into::into);
            let failed = match &first {
                Err(_) => true,
                Ok(res) => res.status().is_server_error(),
            };
            let time_left = deadline.is_none_or(|d| d.remaining() > Duration::ZERO);
            let response = match again {
                Some(again) if failed && time_left => {
                    ::metrics::counter!(crate::metrics::UPSTREAM_RETRIES, "key" => key.clone())
                        .increment(1);
                    inner.oneshot(again).await.map_err(Into::into)?
                }
                _ => first?,
            };
            if response.status() == StatusCode::TOO_MANY_REQUESTS {
                ::metrics::counter!(crate::metrics::UPSTREAM_RATE_LIMITED, "key" => key.clone())
                    .increment(1);
                let retry_after = response
                    .headers()
                    .get(header::RETRY_AFTER)
                    .and_then(|v| parse_retry_after(v, SystemTime::now()));
                limiter.report_upstream_rate_limit(&key, retry_after);
            }
            let mut response = response.map(|b| LeaseBody::new(b, Leases::new(vec![lease])));
            response.extensions_mut().insert(QueueWait(queue_wait));
            Ok(response)
        })
    }
}
