//! The admit layer's response future.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use axum::body::Body;
use axum::response::Response;
use pin_project_lite::pin_project;
use tower::BoxError;

use crate::mcp::verdict::{self, Merge};

type Merging = Pin<Box<dyn Future<Output = Response> + Send>>;

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
        // Only for batches mixing refused and admitted elements; boxed off the hot path.
        Merging {
            merge: Merging,
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
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Rejected { response } => {
                    return Poll::Ready(Ok(response.take().expect("polled after completion")));
                }
                StateProj::Running { future, merge } => {
                    let response = ready!(future.poll(cx))?.map(Body::new);
                    match merge.take() {
                        None => return Poll::Ready(Ok(response)),
                        Some(m) => this.state.set(State::Merging {
                            merge: Box::pin(verdict::merge(response, m)),
                        }),
                    }
                }
                StateProj::Merging { merge } => {
                    return Poll::Ready(Ok(ready!(merge.as_mut().poll(cx))));
                }
            }
        }
    }
}
