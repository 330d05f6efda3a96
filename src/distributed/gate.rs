//! The budget's gate to the cluster's leases: whether a call spends them, what it spent (to
//! refund), and the budget's proposals of its rates. Built without the feature `redis`, or
//! for a budget that is not shared, the gate is inert: every call passes and spends nothing
//! (without the feature every type here is zero-sized), so the budget reads the same either
//! way.

#[cfg(feature = "redis")]
use std::sync::Arc;

use super::SharedBudget;
#[cfg(feature = "redis")]
use super::shared::{Gate, Refused, ScopeLease, Spent};
use crate::rejection::Scope;

/// A budget's gate to its cluster's leases. See the [module docs](self).
#[derive(Debug, Clone, Default)]
pub(crate) struct LeaseGate {
    #[cfg(feature = "redis")]
    shared: Option<SharedBudget>,
}

/// One tenant's lease of its cluster-wide share (none when the budget is not shared).
#[derive(Debug, Default)]
pub(crate) struct TenantLease {
    #[cfg(feature = "redis")]
    lease: Option<Arc<ScopeLease>>,
}

/// What an admitted call spent from the cluster's leases, to refund.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Leased {
    #[cfg(feature = "redis")]
    spent: Spent,
}

#[cfg_attr(not(feature = "redis"), allow(unused_variables))]
impl LeaseGate {
    /// Whether this call spends leases; `Err` with the nanoseconds to wait in `closed`
    /// fallback. When the shared mode has changed since the last call, first calls `rerate`
    /// with what the local rates are divided by now (at once, not at the next tick: the global
    /// bucket bounds this node's total).
    pub(crate) fn open(&self, rerate: impl FnOnce(f64)) -> Result<bool, u64> {
        #[cfg(feature = "redis")]
        if let Some(shared) = &self.shared {
            if shared.take_change() {
                rerate(shared.divisor());
            }
            return match shared.gate() {
                Gate::Shared => Ok(true),
                Gate::Local => Ok(false),
                Gate::Closed(wait) => Err(wait),
            };
        }
        Ok(false)
    }

    /// Spends `cost` from the global lease, then from the tenant's `lease` if given; on a
    /// refusal (the lease's scope and the nanoseconds to wait) nothing stays spent.
    pub(crate) fn spend(
        &self,
        lease: Option<&TenantLease>,
        cost: u64,
    ) -> Result<Leased, (Scope, u64)> {
        #[cfg(feature = "redis")]
        if let Some(shared) = &self.shared {
            return match shared.spend(lease.and_then(|t| t.lease.as_ref()), cost) {
                Ok(spent) => Ok(Leased { spent }),
                Err(Refused::Global(wait)) => Err((Scope::Global, wait)),
                Err(Refused::Tenant(wait)) => Err((Scope::Tenant, wait)),
            };
        }
        Ok(Leased::default())
    }

    /// Gives a refused call's leased cost back to this node's leases (lost if the window has
    /// ended).
    pub(crate) fn refund(&self, lease: Option<&TenantLease>, leased: Leased, cost: u64) {
        #[cfg(feature = "redis")]
        if let Some(shared) = &self.shared {
            shared.refund(lease.and_then(|t| t.lease.as_deref()), leased.spent, cost);
        }
    }

    /// What the local rates are divided by now: the node count in `local` fallback, else 1.
    pub(crate) fn divisor(&self) -> f64 {
        #[cfg(feature = "redis")]
        if let Some(shared) = &self.shared {
            return shared.divisor();
        }
        1.0
    }

    /// Proposes the budget's first rate, until its first tick.
    pub(crate) fn start(&self, rate: f64) {
        #[cfg(feature = "redis")]
        if let Some(shared) = &self.shared {
            shared.global().propose(rate);
        }
    }

    /// The budget's tick: proposes this tick's `rate` to the cluster.
    pub(crate) fn tick(&self, rate: f64) {
        #[cfg(feature = "redis")]
        if let Some(shared) = &self.shared {
            shared.tick(rate);
        }
    }

    /// A lease for a new tenant `name`'s share, proposing `rate` until the next split.
    pub(crate) fn tenant(&self, name: &str, rate: f64) -> TenantLease {
        TenantLease {
            #[cfg(feature = "redis")]
            lease: self.shared.as_ref().map(|s| s.tenant(name, rate)),
        }
    }
}

#[cfg_attr(not(feature = "redis"), allow(unused_variables))]
impl TenantLease {
    /// Sets the rate this node proposes for the tenant's share (sent with its next request).
    pub(crate) fn propose(&self, rate: f64) {
        #[cfg(feature = "redis")]
        if let Some(lease) = &self.lease {
            lease.propose(rate);
        }
    }
}

impl LeaseGate {
    /// The gate to `shared`'s leases.
    pub(crate) fn of(shared: SharedBudget) -> Self {
        #[cfg(feature = "redis")]
        return LeaseGate {
            shared: Some(shared),
        };
        #[cfg(not(feature = "redis"))]
        match shared.never {}
    }

    /// The shared budget, if any.
    pub(crate) fn shared(&self) -> Option<&SharedBudget> {
        #[cfg(feature = "redis")]
        return self.shared.as_ref();
        #[cfg(not(feature = "redis"))]
        None
    }
}
