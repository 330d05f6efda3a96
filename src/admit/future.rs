//! The admit layer's response future.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use axum::body::Body;
use axum::response::Response;
use pin_project_lite::pin_project;
use tower::BoxError;

use crate::mcp::verdict::{self, Merge};

pin_project! {
    /// Response future of [`Admit`](super::Admit).
    pub struct ResponseFuture<F> {
        #[pin]
        state: State<F>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        Rejected {
            response: Option<Response>,
        },
        Running {
            #[pin]
            future: F,
            // Answers to refused batch elements, to merge into the inner answer.
            merge: Option<Merge>,
        },
    }
}

impl<F> ResponseFuture<F> {
    pub(super) fn rejected(response: Response) -> Self {
        ResponseFuture {
            state: State::Rejected {
                response: Some(response),
            },
        }
    }

    pub(super) fn admitted(future: F, merge: Option<Merge>) -> Self {
        ResponseFuture {
            state: State::Running { future, merge },
        }
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
        match self.project().state.project() {
            StateProj::Rejected { response } => {
                Poll::Ready(Ok(response.take().expect("polled after completion")))
            }
            StateProj::Running { future, merge } => {
                let response = ready!(future.poll(cx))?.map(Body::new);
                Poll::Ready(Ok(match merge.take() {
                    None => response,
                    Some(m) => verdict::merge(response, m),
                }))
            }
        }
    }
}
