//! The classify layer's response future.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use http::Request;
use http::request::Parts;
use http_body_util::{LengthLimitError, Limited};
use pin_project_lite::pin_project;
use tokio::time::Sleep;
use tower::{BoxError, Service};

use super::buffering::Reservation;
use super::copies::Copies;
use super::gather::Gather;
use super::layer::Settings;
use super::service::{classified, too_large, too_slow, unreadable};
use crate::answer::Framing;
use crate::call::Calls;
use crate::schemas::{ToolSchemas, tool_list_body};
use crate::snapshot::Snapshot;

pin_project! {
    /// Response future of [`Classify`](super::Classify): reads the body, then runs the inner
    /// service.
    pub struct ResponseFuture<S, B>
    where
        S: Service<Request<Body>>,
        B: http_body::Body,
        B::Error: Into<BoxError>,
    {
        #[pin]
        state: State<S, B>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, B>
    where
        S: Service<Request<Body>>,
        B: http_body::Body,
        B::Error: Into<BoxError>,
    {
        Collecting {
            #[pin]
            collect: Gather<Limited<B>>,
            // The body deadline, from the first poll that found the body still coming (when
            // the server first polls the request, at its head). Made then, not before: most
            // bodies are whole at the first poll, and a timer costs a clock read to make.
            timeout: Option<Pin<Box<Sleep>>>,
            parts: Option<Parts>,
            inner: Option<S>,
            // Where `inner` is handed back once called.
            copies: Arc<Copies<S>>,
            shared: Arc<Settings>,
            // The settings of every stage the request runs under, taken at its head.
            snapshot: Option<Arc<Snapshot>>,
            // This body's share of the buffering cap, given back once it is read.
            reservation: Option<Reservation>,
        },
        Calling {
            #[pin]
            future: S::Future,
            // Set for a `tools/list`: its answer is learned from.
            learn: Option<Arc<ToolSchemas>>,
        },
        Done {
            response: Option<Response>,
        },
    }
}

impl<S, B> ResponseFuture<S, B>
where
    S: Service<Request<Body>>,
    B: http_body::Body,
    B::Error: Into<BoxError>,
{
    pub(super) fn call(future: S::Future) -> Self {
        ResponseFuture {
            state: State::Calling {
                future,
                learn: None,
            },
        }
    }

    pub(super) fn done(response: Response) -> Self {
        ResponseFuture {
            state: State::Done {
                response: Some(response),
            },
        }
    }

    pub(super) fn collect(
        collect: Gather<Limited<B>>,
        parts: Parts,
        inner: S,
        copies: Arc<Copies<S>>,
        shared: Arc<Settings>,
        snapshot: Option<Arc<Snapshot>>,
        reservation: Reservation,
    ) -> Self {
        ResponseFuture {
            state: State::Collecting {
                collect,
                timeout: None,
                parts: Some(parts),
                inner: Some(inner),
                copies,
                shared,
                snapshot,
                reservation: Some(reservation),
            },
        }
    }
}

impl<S, B, ResBody> Future for ResponseFuture<S, B>
where
    S: Service<Request<Body>, Response = http::Response<ResBody>> + Clone,
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<BoxError>,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    type Output = Result<Response, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Collecting {
                    collect,
                    timeout,
                    parts,
                    inner,
                    copies,
                    shared,
                    snapshot,
                    reservation,
                } => {
                    let collected = match collect.poll(cx) {
                        Poll::Ready(collected) => collected,
                        Poll::Pending => {
                            let timeout = timeout.get_or_insert_with(|| {
                                Box::pin(tokio::time::sleep(shared.body_timeout))
                            });
                            ready!(timeout.as_mut().poll(cx));
                            return Poll::Ready(Ok(too_slow(shared.body_timeout)));
                        }
                    };
                    reservation.take();
                    let body = match collected {
                        Ok(body) => body,
                        Err(e) => {
                            let response = if e.downcast_ref::<LengthLimitError>().is_some() {
                                too_large(shared.body_limit)
                            } else {
                                unreadable()
                            };
                            return Poll::Ready(Ok(response));
                        }
                    };
                    let parts = parts.take().expect("polled after completion");
                    let request = classified(parts, body, shared, snapshot.as_ref());
                    let lists_tools = request
                        .extensions()
                        .get::<Calls>()
                        .and_then(Calls::single)
                        .is_some_and(|c| c.method.as_deref() == Some("tools/list"));
                    let learn = lists_tools.then(|| shared.schemas.clone());
                    let mut inner = inner.take().expect("polled after completion");
                    let future = inner.call(request);
                    copies.give_back(inner);
                    this.state.set(State::Calling { future, learn });
                }
                StateProj::Calling { future, learn } => {
                    let response = ready!(future.poll(cx))?;
                    let Some(schemas) = learn.take() else {
                        return Poll::Ready(Ok(response.map(Body::new)));
                    };
                    let framing = Framing::or_json(response.headers());
                    return Poll::Ready(Ok(
                        response.map(|b| Body::new(tool_list_body(b, schemas, framing)))
                    ));
                }
                StateProj::Done { response } => {
                    return Poll::Ready(Ok(response.take().expect("polled after completion")));
                }
            }
        }
    }
}
