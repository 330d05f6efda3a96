//! The whole stack as one tower [`Layer`], over any MCP service (an axum `Router`, rmcp's
//! `StreamableHttpService`, or your own `Service<Request<axum::body::Body>>`).
//!
//! [`Control::layer`](crate::control::Control::layer) builds it from one configuration; its
//! stages, outermost first: classify, idempotency, budget, session guard, circuit breakers,
//! FIFO limiter, deadlines, outcome observation. In mode `off` with `off = "pass_through"` the stack steps
//! aside whole: each request is marked to be let by, the classifier does not read it, and no
//! stage finds calls in it to count, charge or judge.
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

use std::task::{Context, Poll};

use http::Request;
use tower::{Layer, Service};

use crate::admit::{Admit, AdmitLayer};
use crate::breaker::CircuitBreakers;
use crate::budget::Budget;
use crate::call::Bypassed;
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
        let inner = self
            .fifo
            .layer(DeadlineLayer::new().layer(self.outcome.layer(inner)));
        StackService {
            stages: self
                .classify
                .layer(self.idempotency.layer(self.admissions.layer(inner))),
            switch: self.switch.clone(),
            bypass: false,
        }
    }
}

impl std::fmt::Debug for StackLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StackLayer").finish_non_exhaustive()
    }
}

/// The service [`StackLayer`] makes of `S`: every request through the [`Protected`] stages,
/// which let it by untouched while the policy
/// [passes through](crate::control::Policy::passes_through) (chosen in `poll_ready` from the
/// policy then). One service is held, not a second copy of `S` for that way: axum clones the
/// service for every request, and a clone of an MCP service can cost allocations.
#[derive(Clone)]
pub struct StackService<S> {
    stages: Protected<S>,
    switch: Switch,
    /// The policy passed through when the service was last readied.
    bypass: bool,
}

impl<S: std::fmt::Debug> std::fmt::Debug for StackService<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StackService")
            .field("stages", &self.stages)
            .finish_non_exhaustive()
    }
}

impl<S, B> Service<Request<B>> for StackService<S>
where
    Protected<S>: Service<Request<B>>,
{
    type Response = <Protected<S> as Service<Request<B>>>::Response;
    type Error = <Protected<S> as Service<Request<B>>>::Error;
    type Future = <Protected<S> as Service<Request<B>>>::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.bypass = self.switch.peek().passes_through();
        self.stages.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        if self.bypass {
            req.extensions_mut().insert(Bypassed);
        }
        self.stages.call(req)
    }
}
