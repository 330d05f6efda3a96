//! Fixed mode's limits: a global one and one per tenant, set by the kill switch
//! ([`FixedLimits`](crate::policy::FixedLimits)), each a plain bucket at its rate; nothing here
//! learns or ticks.

use std::sync::Arc;

use super::gcra::{Gcra, interval_for_rate};
use super::taking::{Bucket, Refusal, Taking};
use super::tenants::{TenantState, Tenants};
use crate::policy::Policy;
use crate::rejection::{Reason, Scope};

/// Fixed mode's global limit (the tenants' are in their states).
pub(super) struct Fixed {
    /// The global bucket.
    pub(super) global: Gcra,
}

/// A bucket of `rate` per second holding a tenth of a second of it, and never less than one
/// call of the heaviest tool (`max_weight`).
pub(super) fn bucket(rate: f64, max_weight: u32) -> Gcra {
    Gcra::new(interval_for_rate(rate), burst(rate, max_weight))
}

fn burst(rate: f64, max_weight: u32) -> u64 {
    (rate / 10.0).max(f64::from(max_weight)).max(1.0) as u64
}

fn rerate(bucket: &Gcra, now: u64, rate: f64, max_weight: u32) {
    bucket.set_interval(now, interval_for_rate(rate));
    bucket.set_burst(burst(rate, max_weight));
}

impl Fixed {
    /// At `rate` (the stable budget until the switch sets one), holding `burst`.
    pub(super) fn new(rate: f64, burst: u64) -> Self {
        Fixed {
            global: Gcra::new(interval_for_rate(rate), burst),
        }
    }

    /// Re-rates the buckets whose limit `policy` sets.
    pub(super) fn apply(&self, now: u64, policy: &Policy, max_weight: u32, tenants: &Tenants) {
        if let Some(rate) = policy.fixed.global_rate {
            rerate(&self.global, now, rate.get(), max_weight);
        }
        if let Some(rate) = policy.fixed.tenant_rate {
            tenants.for_each(|t| rerate(&t.fixed, now, rate.get(), max_weight));
        }
    }
}

/// Charges a call to the limits `policy` sets: the global one, then its tenant's (looked up
/// only then).
pub(super) fn admit(
    taking: &mut Taking<'_>,
    policy: &Policy,
    tenant: impl FnOnce() -> Arc<TenantState>,
) -> Result<(), Refusal> {
    const REASON: Reason = Reason::FixedLimitExceeded;
    if policy.fixed.global_rate.is_some() {
        taking.take(Bucket::FixedGlobal, false, (REASON, Scope::Global))?;
    }
    if policy.fixed.tenant_rate.is_some() {
        taking.charge_tenant(tenant());
        taking.take(Bucket::FixedTenant, false, (REASON, Scope::Tenant))?;
    }
    Ok(())
}
