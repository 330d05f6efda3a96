//! The FIFO layer's response future.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use axum::body::Body;
use axum::response::Response;
use pin_project_lite::pin_project;
use tower::BoxError;

type Waiting<E> = Pin<Box<dyn Future<Output = Result<Response, E>> + Send>>;

pin_project! {
    /// Response future of [`FifoLimit`](super::FifoLimit) (and of
    /// [`Idempotent`](crate::idempotency::Idempotent)).
    ///
    /// Calls that wait are boxed (the wait, the inner call and the lease-holding body are one
    /// state machine); calls with nothing to limit pass through unboxed.
    pub struct ResponseFuture<F, E> {
        #[pin]
        state: State<F, E>,
    }
}

pin_project! {
    #[project = Proj]
    enum State<F, E> {
        Passthrough {
            #[pin]
            future: F,
        },
        Limited {
            future: Waiting<E>,
        },
    }
}

impl<F, E> ResponseFuture<F, E> {
    pub(crate) fn passthrough(future: F) -> Self {
        ResponseFuture {
            state: State::Passthrough { future },
        }
    }

    pub(crate) fn limited(future: Waiting<E>) -> Self {
        ResponseFuture {
            state: State::Limited { future },
        }
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
            Proj::Passthrough { future } => {
                Poll::Ready(Ok(ready!(future.poll(cx))?.map(Body::new)))
            }
            Proj::Limited { future } => future.as_mut().poll(cx),
        }
    }
}
