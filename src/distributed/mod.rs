//! Budgets shared by a cluster of nodes through Redis (feature `redis`).
//!
//! Without it, N nodes each admitting the whole budget admit up to N times it. With it, the
//! global budget and each tenant's share hold across the cluster, without a Redis round trip
//! per call:
//!
//! * **Leased windows.** Time is cut into windows of `lease_window` (500 ms) on *Redis's*
//!   clock (`TIME`, read inside the script), so every node agrees on them. The cluster may
//!   spend `rate x lease_window` units per window. A node asks Redis for a lease (a slice of
//!   the current window, sized from its recent demand with 50% headroom), and admission spends
//!   it locally, lock-free, never waiting. When the lease runs below a quarter of the last
//!   grant, or the window nears its end (the next window is prefetched), the node sends one
//!   request in the background: never more than one in flight per budget per node. One Lua
//!   script, atomic, grants at most what is left of the window, and at most
//!   `limit / nodes` per request, so one node cannot take a whole window from the others.
//! * **Unused leases expire** at their window's end: a window's counter only concerns that
//!   window, so nothing has to be returned. Returning would save little (a lease is sized
//!   for the window it is spent in) and adds a way to over-issue (a return whose answer is
//!   lost, then retried). A lease granted but never received (its answer timed out) is also
//!   lost. Both can only under-use the budget, never over-issue it.
//! * **The shared rate.** Each node's controller keeps deciding its own budget and proposes
//!   it with each request, on every tick that decreases it, and at least every 750 ms. The
//!   global rate is the **minimum of the proposals fresher than `proposal_ttl` (1 s)**: a
//!   decrease by any node applies to every grant from the moment it reaches Redis (its next
//!   tick, 100 ms), and to every admission once the leases granted before it have expired:
//!   within `lease_window + min(timeout, lease_window / 10)` (550 ms by default), so within
//!   one second for windows up to 900 ms. A node that stops (crashes) stops binding the
//!   others when its proposal is a second old. A tenant's rate is the **maximum** of the
//!   fresh proposals of its share (the node that sees most of its demand knows its share
//!   best), fresh meaning within `max(proposal_ttl, 2 x lease_window)` (a tenant's proposal
//!   is refreshed by its requests, not by the tick); the global lease still caps the sum.
//! * **Keys** all carry the cluster's `prefix` as their hash tag, so every script call touches
//!   one slot and works on Redis Cluster: `{stormgate}:global:windows` (hash: window index ->
//!   units granted), `{stormgate}:global:proposals` (hash: node -> "rate time_us"), and the
//!   same under `{stormgate}:tenant:<name>`. One call can thus lease the global budget and a
//!   tenant's share together: a request sent for one takes the other along when it is below
//!   half its last grant. Every key expires on its own when no node uses it.
//! * **What stays local.** The local GCRA buckets still smooth each node's admissions; the
//!   guaranteed per-tenant minimum is per node; session windows and the session guard stay
//!   local (an MCP session is sticky to one node); the kill switch's fixed limits are per
//!   node.
//! * **Failures** ([`FailureMode`]). Every Redis call gives up after `timeout` (50 ms);
//!   admission never waits for Redis at all. A failed call puts the node in its failure mode
//!   at once (`open`: local limits only; `local`, the default: local buckets at budget /
//!   `expected_nodes`; `closed`: refuse with `shared_budget_unavailable`); a background task
//!   reconnects 25 ms, 50 ms, ... apart (at most `max_backoff`), and the node is back in
//!   shared mode as soon as Redis answers.
//!
//! ```no_run
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! use std::time::Duration;
//! use stormgate::budget::{Budget, BudgetConfig};
//! use stormgate::distributed::{DistributedConfig, SharedBudget, SharedMode};
//!
//! let mut config = DistributedConfig::default();
//! config.url = "redis://127.0.0.1:6379".into();
//! let shared = SharedBudget::new(config).unwrap();
//! shared.ready(Duration::from_secs(1)).await; // optional: admission works in the meantime
//! let mut config = BudgetConfig::default();
//! config.stable_budget = stormgate::valid::Positive::new(1000.0).unwrap();
//! let budget = Budget::builder(config)
//!     .shared(shared.clone())
//!     .build();
//! let _ticker = budget.spawn_ticker();
//! assert_eq!(shared.mode(), SharedMode::Shared);
//! # }
//! ```
//!
//! With [`Control`](crate::control::Control), a `[distributed]` section in the configuration
//! does the same.
//!
//! The budget reaches its leases through one gate (`gate.rs`), built with and without the
//! feature: without it, or for a budget that is not shared, the gate lets every call through
//! and spends nothing, so the budget has no code of its own for either case.

mod config;
mod gate;
#[cfg(feature = "redis")]
mod lease;
#[cfg(feature = "redis")]
mod shared;
#[cfg(feature = "redis")]
mod store;

pub use config::{DistributedConfig, FailureMode};
pub(crate) use gate::{LeaseGate, Leased, TenantLease};
#[cfg(feature = "redis")]
pub use shared::{SharedBudget, SharedMode, SharedStats};

/// The budget shared with a cluster through Redis: with the feature `redis` only. Without it
/// this type cannot be made, so [`BudgetBuilder::shared`](crate::budget::BudgetBuilder::shared)
/// cannot be called and [`Budget::shared`](crate::budget::Budget::shared) is always `None`.
#[cfg(not(feature = "redis"))]
#[derive(Debug, Clone)]
pub struct SharedBudget {
    never: std::convert::Infallible,
}
