use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use http::Request;
use tokio::time::Instant;
use tower::{BoxError, Service};

use super::layer::Admission;
use crate::call::Calls;
use crate::call::Unread;
use crate::mcp::verdict::{self, Verdict};
use crate::rejection::Rejection;
use crate::response::ResponseFuture;

/// Applies an [`Admission`] to every request call. Built by [`AdmitLayer`](super::AdmitLayer).
pub struct Admit<S, A> {
    inner: S,
    admission: Arc<A>,
    /// A POST no classify layer read is logged once per layer.
    unread: Arc<Unread>,
}

impl<S, A> Admit<S, A> {
    pub(crate) fn new(inner: S, admission: Arc<A>, unread: Arc<Unread>) -> Self {
        Admit {
            inner,
            admission,
            unread,
        }
    }
}

impl<S: Clone, A> Clone for Admit<S, A> {
    fn clone(&self) -> Self {
        Admit {
            inner: self.inner.clone(),
            admission: self.admission.clone(),
            unread: self.unread.clone(),
        }
    }
}

impl<S: fmt::Debug, A> fmt::Debug for Admit<S, A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Admit")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S, A, ResBody> Service<Request<Body>> for Admit<S, A>
where
    S: Service<Request<Body>, Response = http::Response<ResBody>> + Clone,
    S::Future: Send + 'static,
    A: Admission,
    ResBody: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    type Response = axum::response::Response;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    // Admission is decided here, before `call` returns: the readied inner service is called
    // in place, not cloned (a clone of the rest of the stack per call would be reference
    // counts written on every worker, and an allocation for axum's boxed route).
    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let Some(calls) = req.extensions().get::<Calls>() else {
            self.unread.check(&req, "AdmitLayer");
            return ResponseFuture::inner(self.inner.call(req));
        };
        let mut rejected: Vec<(usize, Rejection)> = Vec::new();
        // One clock reading for every admission of the request, if it has work to admit.
        let mut now = None;
        for (i, call) in calls.iter().enumerate() {
            if !call.is_chargeable() {
                continue;
            }
            let now = *now.get_or_insert_with(Instant::now);
            match self.admission.admit_at(call, now) {
                Ok(permit) => {
                    // Given back if a later stage refuses the call or it never runs.
                    let admission = self.admission.clone();
                    call.charges().push(move || admission.refund(permit));
                }
                Err(rejection) => rejected.push((i, rejection)),
            }
        }
        match verdict::apply(req, &rejected) {
            Verdict::Answer(response) => ResponseFuture::own(response),
            Verdict::Forward { request, merge } => {
                ResponseFuture::merged(self.inner.call(request), merge)
            }
        }
    }
}
