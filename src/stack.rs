//! The whole stack as one tower [`Layer`], over any MCP service (an axum `Router`, rmcp's
//! `StreamableHttpService`, or your own `Service<Request<axum::body::Body>>`).
//!
//! [`Control::layer`](crate::control::Control::layer) builds it from one configuration; its
//! stages, outermost first: classify, idempotency, budget, session guard, circuit breakers,
//! FIFO limiter, outcome observation.
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

use tower::Layer;

use crate::admit::{Admit, AdmitLayer};
use crate::breaker::CircuitBreakers;
use crate::budget::Budget;
use crate::classify::{Classify, ClassifyLayer};
use crate::entropy::SessionGuard;
use crate::fifo::{FifoLimit, FifoLimitLayer};
use crate::idempotency::{IdempotencyLayer, Idempotent};
use crate::outcome::{Observed, OutcomeLayer};

/// The whole stack as one layer. Built by [`Control::layer`](crate::control::Control::layer).
#[derive(Clone)]
pub struct StackLayer {
    pub(crate) classify: ClassifyLayer,
    pub(crate) idempotency: IdempotencyLayer,
    pub(crate) budget: AdmitLayer<Budget>,
    pub(crate) sessions: AdmitLayer<SessionGuard>,
    pub(crate) breakers: AdmitLayer<CircuitBreakers>,
    pub(crate) fifo: FifoLimitLayer,
    pub(crate) outcome: OutcomeLayer,
}

/// The service [`StackLayer`] makes of `S`.
pub type StackService<S> = Classify<
    Idempotent<Admit<Admit<Admit<FifoLimit<Observed<S>>, CircuitBreakers>, SessionGuard>, Budget>>,
>;

impl<S> Layer<S> for StackLayer {
    type Service = StackService<S>;

    fn layer(&self, inner: S) -> StackService<S> {
        let inner = self.fifo.layer(self.outcome.layer(inner));
        let inner = self.sessions.layer(self.breakers.layer(inner));
        self.classify
            .layer(self.idempotency.layer(self.budget.layer(inner)))
    }
}

impl std::fmt::Debug for StackLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StackLayer").finish_non_exhaustive()
    }
}
