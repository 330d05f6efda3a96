//! The whole stack as one tower [`Layer`], over any MCP service (an axum `Router`, rmcp's
//! `StreamableHttpService`, or your own `Service<Request<axum::body::Body>>`).
//!
//! [`Control::layer`](crate::control::Control::layer) builds it from one configuration; its
//! stages, outermost first: classify, idempotency, budget, session guard, circuit breakers,
//! FIFO limiter, deadlines, outcome observation. In mode `off` with `off = "pass_through"` the stack steps
//! aside whole and each request goes to the MCP service untouched.
//!
//! ```
//! use stormgate::control::{Config, Control};
//! use tower::{Layer, ServiceBuilder, service_fn};
//!
//! let control = Control::new(Config::default()).unwrap();
//! let mcp = service_fn(|_req: http::Request<axum::body::Body>| async {
//!     Ok::<_, std::convert::Infallible>(http::Response::new(axum::body::Body::from("{}")))
//! });
//! let _protected = ServiceBuilder::new().layer(control.layer()).service(mcp);
//! ```

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use axum::body::Body;
use axum::response::Response;
use http::Request;
use pin_project_lite::pin_project;
use tower::{Layer, Service};

use crate::admit::{Admit, AdmitLayer};
use crate::breaker::CircuitBreakers;
use crate::budget::Budget;
use crate::classify::{Classify, ClassifyLayer};
use crate::deadline::{DeadlineLayer, Deadlines};
use crate::entropy::SessionGuard;
use crate::fifo::{FifoLimit, FifoLimitLayer};
use crate::idempotency::{IdempotencyLayer, Idempotent};
use crate::outcome::{Observed, OutcomeLayer};
use crate::policy::Switch;

/// The whole stack as one layer. Built by [`Control::layer`](crate::control::Control::layer).
#[derive(Clone)]
pub struct StackLayer {
    pub(crate) classify: ClassifyLayer,
    pub(crate) idempotency: IdempotencyLayer,
    /// The budget, the session guard and the circuit breakers, in that order, as one stage.
    pub(crate) admissions: AdmitLayer<Admissions>,
    pub(crate) fifo: FifoLimitLayer,
    pub(crate) outcome: OutcomeLayer,
    pub(crate) switch: Switch,
}

/// The stages of [`StackService`] around `S`, outermost first.
pub type Protected<S> = Classify<Idempotent<Admit<FifoLimit<Deadlines<Observed<S>>>, Admissions>>>;

/// The stack's admitting stages, in order: the budget, the session guard, the circuit
/// breakers (one stage: a call charged by all or by none).
pub type Admissions = (Budget, SessionGuard, CircuitBreakers);

impl<S: Clone> Layer<S> for StackLayer {
    type Service = StackService<S>;

    fn layer(&self, inner: S) -> StackService<S> {
        let bare = inner.clone();
        let inner = self
            .fifo
            .layer(DeadlineLayer::new().layer(self.outcome.layer(inner)));
        StackService {
            stages: self
                .classify
                .layer(self.idempotency.layer(self.admissions.layer(inner))),
            bare,
            switch: self.switch.clone(),
            route: Route::Protected,
        }
    }
}

impl std::fmt::Debug for StackLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StackLayer").finish_non_exhaustive()
    }
}

/// Which way the next request goes, chosen when the service is readied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    Protected,
    /// Mode `off` with `off = "pass_through"`: straight to the MCP service.
    Bare,
}

/// The service [`StackLayer`] makes of `S`: every request through the [`Protected`] stages,
/// or, while the policy [passes through](crate::control::Policy::passes_through), straight to
/// `S` untouched. The way is chosen in `poll_ready` from the policy then, and only that way is
/// readied.
#[derive(Clone)]
pub struct StackService<S> {
    stages: Protected<S>,
    bare: S,
    switch: Switch,
    route: Route,
}

impl<S: std::fmt::Debug> std::fmt::Debug for StackService<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StackService")
            .field("inner", &self.bare)
            .finish_non_exhaustive()
    }
}

impl<S, B, ResBody> Service<Request<B>> for StackService<S>
where
    S: Service<Request<Body>, Response = http::Response<ResBody>> + Clone,
    Protected<S>: Service<Request<B>, Response = Response, Error = S::Error>,
    B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<tower::BoxError>,
    ResBody: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    ResBody::Error: Into<tower::BoxError>,
{
    type Response = Response;
    type Error = S::Error;
    type Future = ResponseFuture<<Protected<S> as Service<Request<B>>>::Future, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.route = if self.switch.load().passes_through() {
            Route::Bare
        } else {
            Route::Protected
        };
        match self.route {
            Route::Protected => self.stages.poll_ready(cx),
            Route::Bare => self.bare.poll_ready(cx),
        }
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        match self.route {
            Route::Protected => ResponseFuture {
                way: Way::Protected {
                    future: self.stages.call(req),
                },
            },
            Route::Bare => {
                // Keep the readied service for this request; the clone waits for the next
                // poll_ready.
                let clone = self.bare.clone();
                let mut bare = std::mem::replace(&mut self.bare, clone);
                ResponseFuture {
                    way: Way::Bare {
                        future: bare.call(req.map(Body::new)),
                    },
                }
            }
        }
    }
}

pin_project! {
    /// Response future of [`StackService`].
    pub struct ResponseFuture<F, G> {
        #[pin]
        way: Way<F, G>,
    }
}

pin_project! {
    #[project = WayProj]
    enum Way<F, G> {
        // Through the stages.
        Protected {
            #[pin]
            future: F,
        },
        // Passed through untouched.
        Bare {
            #[pin]
            future: G,
        },
    }
}

impl<F, G, ResBody, E> Future for ResponseFuture<F, G>
where
    F: Future<Output = Result<Response, E>>,
    G: Future<Output = Result<http::Response<ResBody>, E>>,
    ResBody: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    ResBody::Error: Into<tower::BoxError>,
{
    type Output = Result<Response, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().way.project() {
            WayProj::Protected { future } => future.poll(cx),
            WayProj::Bare { future } => {
                Poll::Ready(ready!(future.poll(cx)).map(|r| r.map(Body::new)))
            }
        }
    }
}
