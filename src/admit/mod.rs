//! The admit layer: a non-waiting admission check per call, with the rejection contract.
//!
//! An [`Admission`] decides, for each request [`Call`](crate::Call) of a classified body, to
//! admit it (returning a permit, kept in the call's [`Charges`](crate::charges::Charges)) or
//! to refuse it with a [`Rejection`](crate::Rejection). [`AdmitLayer`] applies it and owns
//! everything the rejection contract requires, so every non-waiting stage of stormgate (and
//! yours) is just an `Admission`:
//!
//! * a refused call never reaches the inner service: nothing half-executed;
//! * a single refused request is answered at once: HTTP 200, a JSON-RPC error echoing its id,
//!   `Retry-After` in whole seconds rounded up;
//! * in a batch, each refused element gets its own answer element; the admitted elements (and
//!   every notification, response and invalid element, exactly as sent) are forwarded as a
//!   smaller batch, and the answers are merged into the inner service's answer;
//! * notifications and client responses are never checked, charged or answered with an error;
//! * requests that were not classified (non-MCP routes, GET, DELETE) pass unchecked; a POST
//!   that reached the layer without passing a [`ClassifyLayer`](crate::classify::ClassifyLayer)
//!   (the stack built in the wrong order) passes too, and the layer logs a warning the first
//!   time it sees one (so do [`FifoLimitLayer`](crate::fifo::FifoLimitLayer),
//!   [`OutcomeLayer`](crate::outcome::OutcomeLayer) and
//!   [`IdempotencyLayer`](crate::idempotency::IdempotencyLayer)).
//!
//! Several admissions make one stage as a tuple, `AdmitLayer::new((a, b))` or `(a, b, c)`: in
//! order, a call charged by all or by none (what those before a refusal took is given back at
//! once), at the cost of one stage. The whole stack admits its budget, session guard and
//! circuit breakers so.
//!
//! A stage admits a request's calls at one instant: [`Admit`] reads the clock once (when the
//! request has a call to admit) and gives it to [`Admission::admit_at`], and a tuple gives it
//! to each of its admissions. An admission that reads the clock (stormgate's budget, guard
//! and breakers do) overrides `admit_at` to use it, and its `admit` calls `admit_at` with
//! `Instant::now()`; the default `admit_at` calls `admit`.
//!
//! Admission stages charge budgets, they do not hold capacity. What a call was charged is given
//! back when a later stage refuses it or the MCP server rejects it without running it (see
//! [`charges`](crate::charges)); otherwise it is kept.
//!
//! ```
//! use std::time::Duration;
//! use axum::{Router, routing::post};
//! use stormgate::{Call, Reason, Rejection, Scope};
//! use stormgate::admit::AdmitLayer;
//! use stormgate::classify::ClassifyLayer;
//!
//! // Refuse every call of the `drop_table` tool.
//! let deny = AdmitLayer::new(|call: &Call| match call.tool.as_deref() {
//!     Some("drop_table") => Err(Rejection::new(
//!         Reason::CircuitOpen,
//!         Scope::Tool,
//!         Duration::from_secs(60),
//!     )),
//!     _ => Ok(()),
//! });
//! let app: Router = Router::new()
//!     .route("/mcp", post(|| async { "{}" }))
//!     .layer(deny)
//!     .layer(ClassifyLayer::new()); // outermost: classify first
//! ```
//!
//! Two admissions as one stage, in order; a call is charged by both or by neither:
//!
//! ```
//! use stormgate::Call;
//! use stormgate::admit::AdmitLayer;
//! use stormgate::budget::{Budget, BudgetConfig};
//!
//! let budget = Budget::builder(BudgetConfig::default()).build();
//! let no_drops = |call: &Call| match call.tool.as_deref() {
//!     Some("drop_table") => Err(stormgate::Rejection::new(
//!         stormgate::Reason::CircuitOpen,
//!         stormgate::Scope::Tool,
//!         std::time::Duration::from_secs(60),
//!     )),
//!     _ => Ok(()),
//! };
//! let _one_stage = AdmitLayer::new((no_drops, budget.clone()));
//! ```

mod layer;
mod service;
mod several;

pub use layer::{Admission, AdmitLayer};
pub use service::Admit;
