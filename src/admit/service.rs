use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use http::{HeaderValue, Request, header};
use tower::{BoxError, Service};

use super::future::ResponseFuture;
use super::layer::Admission;
use crate::call::{Call, Calls};
use crate::mcp::reply;
use crate::rejection::Rejection;

/// Applies an [`Admission`] to every request call. Built by [`AdmitLayer`](super::AdmitLayer).
pub struct Admit<S, A> {
    inner: S,
    admission: Arc<A>,
}

impl<S, A> Admit<S, A> {
    pub(crate) fn new(inner: S, admission: Arc<A>) -> Self {
        Admit { inner, admission }
    }
}

impl<S: Clone, A> Clone for Admit<S, A> {
    fn clone(&self) -> Self {
        Admit {
            inner: self.inner.clone(),
            admission: self.admission.clone(),
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
    type Future = ResponseFuture<S::Future, A::Permit>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<Body>) -> Self::Future {
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let Some(calls) = req.extensions().get::<Calls>() else {
            return ResponseFuture::admitted(inner.call(req), Vec::new(), None);
        };
        let mut permits = Vec::new();
        let mut rejected: Vec<(usize, Rejection)> = Vec::new();
        for (i, call) in calls.iter().enumerate() {
            if !call.is_chargeable() {
                continue;
            }
            match self.admission.admit(call) {
                Ok(permit) => permits.push(permit),
                Err(rejection) => {
                    ::metrics::counter!(
                        crate::metrics::REJECTED,
                        "reason" => rejection.reason().as_str(),
                        "scope" => rejection.scope().as_str(),
                    )
                    .increment(1);
                    rejected.push((i, rejection));
                }
            }
        }
        if rejected.is_empty() {
            return ResponseFuture::admitted(inner.call(req), permits, None);
        }
        if rejected.len() == calls.len() {
            return ResponseFuture::rejected(reply::rejection_response(calls, &rejected));
        }
        // A batch with refused and forwardable elements: forward the rest, merge the answers.
        let elements = reply::rejection_elements(calls, &rejected);
        let remaining = without(calls, &rejected);
        let body = remaining.body.clone();
        req.headers_mut()
            .insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
        req.extensions_mut().insert(remaining);
        *req.body_mut() = Body::from(body);
        ResponseFuture::admitted(inner.call(req), permits, Some(elements))
    }
}

/// `calls` without the `rejected` elements: a new batch body of the others' exact bytes.
fn without(calls: &Calls, rejected: &[(usize, Rejection)]) -> Calls {
    let mut skip = rejected.iter().map(|(i, _)| *i).peekable();
    let kept: Vec<usize> = (0..calls.len())
        .filter(|i| {
            if skip.peek() == Some(i) {
                skip.next();
                false
            } else {
                true
            }
        })
        .collect();
    let raws: Vec<bytes::Bytes> = kept.iter().map(|&i| calls.raw(i)).collect();
    let body = bytes::Bytes::from(reply::join_array(&raws));
    let mut offset = 1;
    let list: Vec<Call> = kept
        .iter()
        .zip(&raws)
        .map(|(&i, raw)| {
            let mut call = calls.calls[i].clone();
            call.span = offset..offset + raw.len();
            offset += raw.len() + 1;
            call
        })
        .collect();
    Calls {
        calls: list,
        batch: true,
        body,
        format: calls.format.clone(),
    }
}
