//! The admit layer's response future.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use axum::body::Body;
use axum::response::Response;
use pin_project_lite::pin_project;
use tower::BoxError;

use super::Admission;
use crate::mcp::verdict::{self, Merge, RefusedCalls};

type Merging = Pin<Box<dyn Future<Output = Response> + Send>>;

pin_project! {
    /// Response future of [`Admit`](super::Admit).
    pub struct ResponseFuture<F, A: Admission> {
        #[pin]
        state: State<F, A>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, A: Admission> {
        Rejected {
            response: Option<Response>,
        },
        Running {
            #[pin]
            future: F,
            admission: Arc<A>,
            // Each admitted call's position in the body and its permit.
            permits: Vec<(u32, A::Permit)>,
            // Answers to refused batch elements, to merge into the inner answer.
            merge: Option<Merge>,
        },
        // Only for batches mixing refused and admitted elements; boxed off the hot path.
        Merging {
            merge: Merging,
        },
    }
}

impl<F, A: Admission> ResponseFuture<F, A> {
    pub(super) fn rejected(response: Response) -> Self {
        ResponseFuture {
            state: State::Rejected {
                response: Some(response),
            },
        }
    }

    pub(super) fn admitted(
        future: F,
        admission: Arc<A>,
        permits: Vec<(u32, A::Permit)>,
        merge: Option<Merge>,
    ) -> Self {
        ResponseFuture {
            state: State::Running {
                future,
                admission,
                permits,
                merge,
            },
        }
    }
}

impl<F, A, ResBody, E> Future for ResponseFuture<F, A>
where
    A: Admission,
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
                    admission,
                    permits,
                    merge,
                } => {
                    let response = ready!(future.poll(cx))?.map(Body::new);
                    let refused = RefusedCalls::of(&response);
                    for (seq, permit) in permits.drain(..) {
                        if refused.contains(&seq) {
                            admission.refund(permit);
                        }
                    }
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
