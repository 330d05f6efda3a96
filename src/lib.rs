//! # stormgate
//!
//! Composable [tower] layers that protect MCP (Model Context Protocol) tool servers on axum
//! from request storms made by LLM agents.
//!
//! An agent unsure it has "enough context" fires a hundred varied calls at one search tool,
//! retries every timeout with a new query, and drains a database pool other tenants share.
//! Each call looks normal, so plain QPS limits miss it. stormgate reads what each call *is*
//! (method, tool, resource, tenant, session) and answers excess with one JSON-RPC error that
//! tells the agent exactly when to come back.
//!
//! ## The pieces
//!
//! * [`classify`]: reads the MCP POST body once (bounded) and attaches [`Calls`] to the
//!   request; bodies over the limit get 413 with a JSON-RPC error.
//! * [`admit`]: applies a non-waiting [`Admission`](admit::Admission) to each call and owns
//!   the rejection contract (single requests, batches, notifications).
//! * [`budget`]: the adaptive global budget (an EWMA controller over a lock-free weighted-cost
//!   bucket) with per-tenant shares and a guaranteed minimum; [`cost`]: tool weights.
//! * [`entropy`]: per-session Shannon entropy, health, storm score and session budgets.
//! * [`fifo`]: the per-resource FIFO limiter (pacing, concurrency, bounded queue, cooldowns),
//!   inbound per tool and outbound per host; the only stage that waits.
//! * [`deadline`]: whole-round deadlines; its layer cuts a call still running at its own.
//! * [`distributed`] (feature `redis`): the global and tenant budgets shared by a cluster
//!   through leased windows in Redis.
//! * [`outcome`]: service time and outcome of every call, learned once for every stage.
//! * [`Rejection`]: the one refusal every layer returns, rendered as described in
//!   [`rejection`].
//! * [`control`]: the whole stack from one configuration, its kill switch and live reloads,
//!   with one settings snapshot per request; [`stack`]: that stack as one tower layer over
//!   any MCP service.
//! * [`valid`]: the configuration's numbers and durations, which cannot hold a value out of
//!   their range.
//! * [`gateway`]: the stack in front of any streamable-HTTP MCP server, in any language: a
//!   streaming proxy to the upstream (what the `stormgate` binary serves); [`serve`]: serving
//!   with a bounded graceful drain on SIGTERM / SIGINT.
//!
//! The layers, [`control::Control`] and the configuration types need no feature, and no
//! feature is on by default. What an operator runs is behind one each, all on in the
//! `stormgate` binary (the workspace's `cli/` package): `gateway` ([`gateway::Proxy`]), `tls`,
//! `serve`, `admin` (`Control::admin_router`), `watch` (`Control::watch_file`,
//! `reload_on_sighup`), `toml` (`Config::from_toml`, `load`, reloads from text) and
//! `prometheus` (`metrics::prometheus_builder`); `redis` shares budgets across nodes.
//!
//! The order of the stack, outermost first: classify, budget, session guard, FIFO limiter,
//! deadlines, outcome, the MCP service (docs/budgets.md builds the whole stack by hand, in code).
//!
//! ## What is public, and for what
//!
//! * **To build a stack**: each stage's layer and its builder ([`classify::ClassifyLayer`],
//!   [`admit::AdmitLayer`], [`budget::Budget`], [`entropy::SessionGuard`],
//!   [`breaker::CircuitBreakers`], [`idempotency::IdempotencyLayer`],
//!   [`fifo::FifoLimitLayer`], [`fifo::OutboundLimitLayer`], [`deadline::DeadlineLayer`],
//!   [`outcome::OutcomeLayer`]), or all of them at once: [`control::Control`] and
//!   [`stack::StackLayer`]. A stage's `reconfigure` is for a stage built alone; a control
//!   reloads its own.
//! * **To name what they return**: the services and futures of each module, the shared
//!   [`response::ResponseFuture`] and the shared body wrapper [`watched::Watched`].
//! * **To extend them**: [`admit::Admission`] (a check of your own, with its refund through
//!   [`charges::Charges`]), [`call::Identify`] (your identity scheme), [`outcome::Observer`]
//!   (told of every outcome), [`clients::Judge`] (who a client is, sealed: the guard).
//! * **To read what they learned**: [`Call`] and [`Calls`] (what the classifier read, its
//!   names [`Tenant`], [`SessionId`], [`Name`] and [`RequestId`]),
//!   [`extensions`] (what a stage writes on a request or answer for the others),
//!   [`control::View`] (read-only views of a control), [`metrics`] (metric names).
//! * **To configure them**: the configuration types (`#[non_exhaustive]`, built by `Default`,
//!   their constructors or serde), whose numbers and durations are [`valid`] types, and
//!   [`ConfigError`] / [`ControlError`].
//! * **What a refusal is**: [`Rejection`], [`Reason`], [`Scope`], [`RejectionFormat`].
//! * **The MCP wire**: [`mcp`] (header names, protocol revisions, the tools' output schemas
//!   learned from `tools/list`).
//!
//! Everything else is crate-private; the test hooks are behind the `test-util` feature.
//!
//! ```
//! use std::time::Duration;
//! use axum::{Router, routing::post};
//! use stormgate::{Call, Reason, Rejection, Scope};
//! use stormgate::{admit::AdmitLayer, classify::ClassifyLayer};
//!
//! let app: Router = Router::new()
//!     .route("/mcp", post(|| async { "{}" }))
//!     // Inner layers first: axum applies the last `.layer` outermost.
//!     .layer(AdmitLayer::new(|call: &Call| {
//!         if call.tool.as_deref() == Some("sql_scan") && call.tenant.as_str() == "anonymous" {
//!             Err(Rejection::new(Reason::TenantBudgetExceeded, Scope::Tenant, Duration::from_secs(1)))
//!         } else {
//!             Ok(())
//!         }
//!     }))
//!     .layer(ClassifyLayer::new());
//! ```

pub mod admit;
mod answer;
mod bounded;
pub mod breaker;
pub mod budget;
pub mod call;
mod canonical;
pub mod charges;
pub mod classify;
pub mod clients;
pub mod control;
pub mod cost;
pub mod deadline;
pub mod distributed;
mod duration_ms;
pub mod entropy;
mod error;
pub mod extensions;
pub mod fifo;
pub mod gateway;
pub mod idempotency;
pub mod mcp;
pub mod metrics;
mod named;
pub mod outcome;
mod policy;
mod protocol;
pub mod rejection;
pub mod response;
mod scan;
mod schemas;
#[cfg(all(unix, feature = "serve"))]
pub mod serve;
mod snapshot;
mod sse;
pub mod stack;
mod stats;
#[cfg(feature = "test-util")]
mod test_util;
pub mod valid;
pub mod watched;

pub use bounded::OVERFLOW;
pub use call::{Call, CallKind, Calls, Name, RequestId, SessionId, Tenant};
pub use error::{ConfigError, ControlError};
pub use rejection::{Reason, Rejection, RejectionFormat, Scope};

/// The README's Rust snippets, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

/// ARCHITECTURE.md's Rust snippets, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../ARCHITECTURE.md")]
struct ArchitectureDoctests;

/// The Rust snippets of each page under docs/, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../docs/identity.md")]
struct IdentityDoctests;

#[cfg(doctest)]
#[doc = include_str!("../docs/fifo.md")]
struct FifoDoctests;

#[cfg(doctest)]
#[doc = include_str!("../docs/configuration.md")]
struct ConfigurationDoctests;

#[cfg(doctest)]
#[doc = include_str!("../docs/budgets.md")]
struct BudgetsDoctests;

#[cfg(doctest)]
#[doc = include_str!("../docs/distributed.md")]
struct DistributedDoctests;

#[cfg(doctest)]
#[doc = include_str!("../docs/resilience.md")]
struct ResilienceDoctests;

#[cfg(doctest)]
#[doc = include_str!("../docs/operations.md")]
struct OperationsDoctests;

#[cfg(doctest)]
#[doc = include_str!("../docs/threat-model.md")]
struct ThreatModelDoctests;
