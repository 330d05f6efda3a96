//! The admit layer's response future.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use axum::body::Body;
use axum::response::Response;
use pin_project_lite::pin_project;
use tower::BoxError;

use crate::mcp::reply;

type Merge = Pin<Box<dyn Future<Output = Response> + Send>>;

pin_project! {
    /// Response future of [`Admit`](super::Admit).
    pub struct ResponseFuture<F, P> {
        #[pin]
        state: State<F, P>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, P> {
        Rejected {
            response: Option<Response>,
        },
        Running {
            #[pin]
            future: F,
            permits: Vec<P>,
            // Answers to refused batch elements, to merge into the inner answer.
            merge: Option<Vec<Vec<u8>>>,
        },
        // Only for batches mixing refused and admitted elements; boxed off the hot path.
        Merging {
            merge: Merge,
        },
    }
}

impl<F, P> ResponseFuture<F, P> {
    pub(super) fn rejected(response: Response) -> Self {
        ResponseFuture {
            state: State::Rejected {
                response: Some(response),
            },
        }
    }

    pub(super) fn admitted(future: F, permits: Vec<P>, merge: Option<Vec<Vec<u8>>>) -> Self {
        ResponseFuture {
            state: State::Running {
                future,
                permits,
                merge,
            },
        }
    }
}

impl<F, P, ResBody, E> Future for ResponseFuture<F, P>
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
                StateProj::Running {
                    future,
                    permits,
                    merge,
                } => {
                    let response = ready!(future.poll(cx))?.map(Body::new);
                    permits.clear();
                    match merge.take() {
                        None => return Poll::Ready(Ok(response)),
                        Some(elements) => this.state.set(State::Merging {
                            merge: Box::pin(reply::merge(response, elements)),
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
