//! Read-only views of the stages a [`Control`](super::Control) runs: what they hold now,
//! never a way to change them behind the configuration's back (a change goes through the
//! control's one change path).

use std::sync::Arc;

use crate::breaker::{BreakerConfig, BreakerState, CircuitBreakers};
use crate::budget::{Budget, BudgetConfig, Health, TenantConfig};
use crate::call::{SessionId, Tenant};
use crate::classify::ClassifyLayer;
use crate::entropy::{SessionConfig, SessionGuard, SessionSummary};
use crate::fifo::{ResourceLimiter, ResourceLimits};
use crate::idempotency::{IdempotencyConfig, IdempotencyLayer};
use crate::schemas::ToolSchemas;

/// A read-only view of one stage of a [`Control`](super::Control).
#[derive(Debug, Clone, Copy)]
pub struct View<'a, T>(pub(super) &'a T);

impl<'a> View<'a, Budget> {
    /// The budget now, in cost units per second.
    pub fn current(&self) -> f64 {
        self.0.current()
    }

    /// The controller's view after the last tick.
    pub fn health(&self) -> Health {
        self.0.health()
    }

    /// The settings in force: the budget's and the tenants'.
    pub fn config(&self) -> (BudgetConfig, TenantConfig) {
        self.0.config()
    }

    /// A tenant's current share of the budget, cost units per second.
    pub fn allocation(&self, tenant: &Tenant) -> Option<f64> {
        self.0.allocation(tenant)
    }

    /// Tenants tracked now.
    pub fn tenant_count(&self) -> usize {
        self.0.tenant_count()
    }

    /// A tool's healthy latency as the controller learned it, in seconds.
    pub fn tool_baseline(&self, tool: &str) -> Option<f64> {
        self.0.tool_baseline(tool)
    }

    /// The cluster's shared budget, if any (feature `redis`).
    pub fn shared(&self) -> Option<&'a crate::distributed::SharedBudget> {
        self.0.shared()
    }
}

impl View<'_, SessionGuard> {
    /// The settings in force.
    pub fn config(&self) -> Arc<SessionConfig> {
        self.0.config()
    }

    /// Sessions tracked now.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether no session is tracked.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether `session` has its own state (the MCP server accepted it).
    pub fn is_tracked(&self, session: &SessionId) -> bool {
        self.0.is_tracked(session)
    }

    /// The current storm score, entropy and budget factor of a session.
    pub fn summary(&self, id: &SessionId) -> Option<SessionSummary> {
        self.0.summary(id)
    }

    /// The same for a tenant's unverified pool, if it has one.
    pub fn unverified(&self, tenant: &Tenant) -> Option<SessionSummary> {
        self.0.unverified(tenant)
    }

    /// Tenants with an unverified pool now.
    pub fn pools(&self) -> usize {
        self.0.pools()
    }

    /// The N sessions with the highest storm score at the last sweep.
    pub fn top(&self) -> Vec<SessionSummary> {
        self.0.top()
    }
}

impl View<'_, CircuitBreakers> {
    /// The settings in force.
    pub fn config(&self) -> Arc<BreakerConfig> {
        self.0.config()
    }

    /// The state of a tool's breaker, if it has one yet.
    pub fn state(&self, tool: &str) -> Option<BreakerState> {
        self.0.state(tool)
    }
}

impl View<'_, IdempotencyLayer> {
    /// The settings in force.
    pub fn config(&self) -> Arc<IdempotencyConfig> {
        self.0.config()
    }
}

impl View<'_, ResourceLimiter> {
    /// The limits `key` runs under.
    pub fn limits(&self, key: &str) -> ResourceLimits {
        self.0.limits(key)
    }

    /// Whether `key` has limits of its own.
    pub fn is_configured(&self, key: &str) -> bool {
        self.0.is_configured(key)
    }

    /// Waiters queued on `key` now.
    pub fn queue_depth(&self, key: &str) -> usize {
        self.0.queue_depth(key)
    }

    /// Calls in flight on `key` now.
    pub fn in_flight(&self, key: &str) -> usize {
        self.0.in_flight(key)
    }

    /// Distinct keys tracked.
    pub fn key_count(&self) -> usize {
        self.0.key_count()
    }
}

impl View<'_, ClassifyLayer> {
    /// The tools the `tools/list` answers passing through declared an `outputSchema` for.
    pub fn tool_schemas(&self) -> Arc<ToolSchemas> {
        self.0.tool_schemas()
    }

    /// Bytes reserved now by the bodies being read.
    pub fn buffered_bytes(&self) -> usize {
        self.0.buffered_bytes()
    }
}
