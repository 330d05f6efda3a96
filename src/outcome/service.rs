use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use axum::body::Body;
use axum::response::Response;
use http::{Request, StatusCode};
use pin_project_lite::pin_project;
use tower::{BoxError, Service};

use super::Outcome;
use super::body::{ObservedBody, Observers, Pending};
use crate::answer::{Framing, Scan, Scanned};
use crate::call::Unread;
use crate::call::{Calls, SessionId};

/// Reports how each request call ends. Built by [`OutcomeLayer`](super::OutcomeLayer).
#[derive(Clone)]
pub struct Observed<S> {
    inner: S,
    observers: Observers,
    /// A POST no classify layer read is logged once per layer.
    unread: Arc<Unread>,
}

impl<S> Observed<S> {
    pub(crate) fn new(inner: S, observers: Observers, unread: Arc<Unread>) -> Self {
        Observed {
            inner,
            observers,
            unread,
        }
    }
}

impl<S: fmt::Debug> fmt::Debug for Observed<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Observed")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S, ResBody> Service<Request<Body>> for Observed<S>
where
    S: Service<Request<Body>, Response = http::Response<ResBody>>,
    ResBody: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    type Response = Response;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let queue_wait = req
            .extensions()
            .get::<super::QueueWait>()
            .map_or(std::time::Duration::ZERO, |w| w.0);
        let pending = match req.extensions().get::<Calls>() {
            Some(calls) => Pending::new(calls, queue_wait, self.observers.clone()),
            None => {
                self.unread.check(&req, "OutcomeLayer");
                None
            }
        };
        ResponseFuture {
            future: self.inner.call(req),
            pending,
        }
    }
}

pin_project! {
    /// Response future of [`Observed`]. Dropped before the answer: its calls were cancelled.
    pub struct ResponseFuture<F> {
        #[pin]
        future: F,
        pending: Option<Pending>,
    }
}

impl<F, ResBody, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<http::Response<ResBody>, E>>,
    ResBody: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    type Output = Result<Response, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let result = ready!(this.future.poll(cx));
        let Some(mut pending) = this.pending.take() else {
            return Poll::Ready(result.map(|r| r.map(Body::new)));
        };
        let response = match result {
            Ok(response) => response,
            Err(e) => {
                pending.settle_all(Outcome::Error, 0);
                return Poll::Ready(Err(e));
            }
        };
        let status = response.status();
        if let Some(id) = response
            .headers()
            .get(&crate::protocol::SESSION_ID)
            .and_then(|v| v.to_str().ok())
            .filter(|v| status.is_success() && !v.is_empty())
        {
            pending.minted(&SessionId::new(crate::call::bounded(id)));
        }
        let scan = if status.is_server_error() {
            pending.settle_all(Outcome::Error, 0);
            None
        } else if status.is_client_error() {
            pending.settle_all(Outcome::ClientError, 0);
            None
        } else if let Some(framing) = Framing::of(response.headers()) {
            Some(Scan::new(framing))
        } else {
            pending.settle_all(
                if status == StatusCode::ACCEPTED || status.is_success() {
                    Outcome::Ok
                } else {
                    Outcome::Error
                },
                0,
            );
            None
        };
        Poll::Ready(Ok(match scan {
            Some(scan) => {
                response.map(|b| Body::new(ObservedBody::new(b, Scanned::new(scan, pending))))
            }
            None => response.map(Body::new),
        }))
    }
}
