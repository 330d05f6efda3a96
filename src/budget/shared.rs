//! The budget's hook into the cluster's shared leases (feature `redis`); without the feature
//! every function here is a no-op, so the budget's code reads the same either way.

use super::{Budget, TenantState};
use crate::rejection::{Reason, Rejection, Scope};

/// What an admitted call spent from the cluster's leases, to refund.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Leased {
    #[cfg(feature = "redis")]
    spent: crate::distributed::Spent,
}

/// A refusal before it is a [`Rejection`]: reason, scope, wait in nanoseconds.
type Refusal = (Reason, Scope, u64);

#[cfg(feature = "redis")]
impl Budget {
    /// Whether this call spends leases: re-rates the global bucket when the shared mode has
    /// changed, and refuses with `shared_budget_unavailable` in `closed` fallback.
    pub(super) fn shared_gate(&self, now: u64) -> Result<bool, Rejection> {
        use crate::distributed::Gate;
        let Some(shared) = &self.inner.shared else {
            return Ok(false);
        };
        if shared.take_change() {
            // At once, not at the next tick: the global bucket bounds this node's total.
            let policy = self.inner.switch.load();
            let rate = if policy.features.adaptive_budget {
                self.current()
            } else {
                self.inner.settings.load().config.stable_budget
            };
            self.inner
                .global
                .set_interval(now, super::interval_for_rate(rate / shared.divisor()));
        }
        match shared.gate() {
            Gate::Shared => Ok(true),
            Gate::Local => Ok(false),
            Gate::Closed(wait) => Err(Self::reject(
                Reason::SharedBudgetUnavailable,
                Scope::Global,
                wait,
            )),
        }
    }

    /// Spends `cost` from the global lease, then from the tenant's.
    pub(super) fn take_leases(
        &self,
        leasing: bool,
        tenant: Option<&TenantState>,
        cost: u64,
    ) -> Result<Leased, Refusal> {
        use crate::distributed::Refused;
        let (true, Some(shared)) = (leasing, &self.inner.shared) else {
            return Ok(Leased::default());
        };
        match shared.spend(tenant.and_then(|t| t.lease.as_ref()), cost) {
            Ok(spent) => Ok(Leased { spent }),
            Err(Refused::Global(wait)) => Err((Reason::GlobalBudgetExceeded, Scope::Global, wait)),
            Err(Refused::Tenant(wait)) => Err((Reason::TenantBudgetExceeded, Scope::Tenant, wait)),
        }
    }

    /// Gives a refused call's leased cost back to this node's leases (lost if the window has
    /// ended).
    pub(super) fn refund_leases(&self, leased: Leased, tenant: Option<&TenantState>, cost: u64) {
        if let Some(shared) = &self.inner.shared {
            let lease = tenant.and_then(|t| t.lease.as_deref());
            shared.refund(lease, leased.spent, cost);
        }
    }

    /// What the local rates are divided by now (`local` fallback: the node count).
    pub(super) fn divisor(&self) -> f64 {
        self.inner.shared.as_ref().map_or(1.0, |s| s.divisor())
    }

    /// Proposes this tick's budget to the cluster.
    pub(super) fn shared_tick(&self, rate: f64) {
        if let Some(shared) = &self.inner.shared {
            shared.tick(rate);
        }
    }

    /// A lease for a new tenant's share, proposing `rate` until the next split.
    pub(super) fn tenant_lease(
        &self,
        name: &str,
        rate: f64,
    ) -> Option<std::sync::Arc<crate::distributed::ScopeLease>> {
        self.inner.shared.as_ref().map(|s| s.tenant(name, rate))
    }
}

#[cfg(not(feature = "redis"))]
impl Budget {
    pub(super) fn shared_gate(&self, _now: u64) -> Result<bool, Rejection> {
        Ok(false)
    }

    pub(super) fn take_leases(
        &self,
        _leasing: bool,
        _tenant: Option<&TenantState>,
        _cost: u64,
    ) -> Result<Leased, Refusal> {
        Ok(Leased::default())
    }

    pub(super) fn refund_leases(&self, _: Leased, _: Option<&TenantState>, _: u64) {}

    pub(super) fn divisor(&self) -> f64 {
        1.0
    }

    pub(super) fn shared_tick(&self, _rate: f64) {}
}
