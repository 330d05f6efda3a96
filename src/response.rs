//! The one response future the stages share.
//!
//! A stage that answers without waiting has three ways to end a call: pass it on (the inner
//! service's answer, its body made axum's [`Body`], with the refusals the stage gave some
//! elements of a batch merged in), answer it itself (a refusal, a kept answer), or, for a call
//! that must wait first, a boxed future doing the wait and the call. The admission layer, the
//! FIFO limiter, the idempotency layer and the gateway's Host check are each some of these;
//! [`ResponseFuture`] is all of them, so they map bodies and merge batches one way.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use axum::body::Body;
use axum::response::Response;
use pin_project_lite::pin_project;
use tower::BoxError;

use crate::mcp::verdict::{self, Merge};

/// A call's wait and run as one boxed future: what a stage that queues calls returns.
pub(crate) type Waiting<E> = Pin<Box<dyn Future<Output = Result<Response, E>> + Send>>;

pin_project! {
    /// Response future of [`Admit`](crate::admit::Admit),
    /// [`FifoLimit`](crate::fifo::FifoLimit), [`Idempotent`](crate::idempotency::Idempotent)
    /// and the gateway's `HostCheck`: the inner service's answer (`F`, failing with `E`), an
    /// answer of the stage's own, or a call that waits.
    ///
    /// Only calls that wait are boxed; the others are polled in place.
    pub struct ResponseFuture<F, E> {
        #[pin]
        state: State<F, E>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, E> {
        // Passed on: the inner answer, with the stage's answers to some elements of a batch
        // (boxed: rare, and every future of the stack carries this one's size).
        Inner {
            #[pin]
            future: F,
            merge: Option<Box<Merge>>,
        },
        // The stage's own answer, until taken.
        Own {
            response: Option<Response>,
        },
        // A call that waits, then runs.
        Waiting {
            future: Waiting<E>,
        },
    }
}

impl<F, E> ResponseFuture<F, E> {
    /// The inner service's answer, untouched but for its body's type.
    pub(crate) fn inner(future: F) -> Self {
        Self::merged(future, None)
    }

    /// The inner service's answer with `merge` (the stage's answers to some elements of a
    /// batch) merged into it.
    pub(crate) fn merged(future: F, merge: Option<Merge>) -> Self {
        ResponseFuture {
            state: State::Inner {
                future,
                merge: merge.map(Box::new),
            },
        }
    }

    /// The stage's own answer: the inner service is never called.
    pub(crate) fn own(response: Response) -> Self {
        ResponseFuture {
            state: State::Own {
                response: Some(response),
            },
        }
    }

    /// A call that waits first.
    pub(crate) fn waiting(future: Waiting<E>) -> Self {
        ResponseFuture {
            state: State::Waiting { future },
        }
    }
}

impl<F, E> std::fmt::Debug for ResponseFuture<F, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let way = match &self.state {
            State::Inner { .. } => "inner",
            State::Own { .. } => "own",
            State::Waiting { .. } => "waiting",
        };
        f.debug_struct("ResponseFuture").field("way", &way).finish()
    }
}

impl<F, E, ResBody> Future for ResponseFuture<F, E>
where
    F: Future<Output = Result<http::Response<ResBody>, E>>,
    ResBody: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    type Output = Result<Response, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProj::Inner { future, merge } => {
                let response = ready!(future.poll(cx))?.map(Body::new);
                Poll::Ready(Ok(match merge.take() {
                    None => response,
                    Some(m) => verdict::merge(response, *m),
                }))
            }
            StateProj::Own { response } => {
                Poll::Ready(Ok(response.take().expect("polled after completion")))
            }
            StateProj::Waiting { future } => future.as_mut().poll(cx),
        }
    }
}
