//! The FIFO limiter around an outbound HTTP client, keyed by host.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::SystemTime;

use http::{Request, Response, StatusCode, header};
use tower::{BoxError, Layer, Service, ServiceExt};

use super::body::LeaseBody;
use super::{QueueWait, ResourceLimiter, parse_retry_after};

type KeyFn = Arc<dyn Fn(&http::Uri) -> String + Send + Sync>;

/// Limits an outbound HTTP client per upstream (seed 000: `rateLimitGroup` defaults to the
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
}

impl OutboundLimitLayer {
    /// Keyed by the request URI's host (`"unknown"` when it has none).
    pub fn new(limiter: ResourceLimiter) -> Self {
        OutboundLimitLayer {
            limiter,
            key: Arc::new(|uri: &http::Uri| uri.host().unwrap_or("unknown").to_owned()),
        }
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
        }
    }
}

/// The outbound FIFO limiter. Built by [`OutboundLimitLayer`].
pub struct OutboundLimit<S> {
    inner: S,
    limiter: ResourceLimiter,
    key: KeyFn,
}

impl<S: Clone> Clone for OutboundLimit<S> {
    fn clone(&self) -> Self {
        OutboundLimit {
            inner: self.inner.clone(),
            limiter: self.limiter.clone(),
            key: self.key.clone(),
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

/// Response future of [`OutboundLimit`].
pub type OutboundFuture<T> = Pin<Box<dyn Future<Output = Result<T, BoxError>> + Send>>;

impl<S, B, RB> Service<Request<B>> for OutboundLimit<S>
where
    S: Service<Request<B>, Response = Response<RB>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Into<BoxError>,
    B: Send + 'static,
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
        Box::pin(async move {
            let lease = acquire.await?;
            let queue_wait = lease.queue_wait();
            let response = inner.oneshot(req).await.map_err(Into::into)?;
            if response.status() == StatusCode::TOO_MANY_REQUESTS {
                ::metrics::counter!(crate::metrics::UPSTREAM_RATE_LIMITED, "key" => key.clone())
                    .increment(1);
                let retry_after = response
                    .headers()
                    .get(header::RETRY_AFTER)
                    .and_then(|v| parse_retry_after(v, SystemTime::now()));
                limiter.report_upstream_rate_limit(&key, retry_after);
            }
            let mut response = response.map(|b| LeaseBody::new(b, vec![lease]));
            response.extensions_mut().insert(QueueWait(queue_wait));
            Ok(response)
        })
    }
}
