//! Per-tenant shares of the global budget: weights, a guaranteed minimum, and borrowing.

use crate::valid::{NonNegative, Positive};
use std::collections::BTreeMap;
use std::num::{NonZeroU32, NonZeroUsize};

use serde::{Deserialize, Serialize};

/// Per-tenant budget settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct TenantConfig {
    /// Whether tenants get shares at all. Default true.
    pub enabled: bool,
    /// Cost units per second every active tenant is guaranteed, even when the global budget is
    /// spent (normal business must not starve). Default 1% of the stable budget (stormgate's
    /// choice).
    pub min_budget: Option<NonNegative>,
    /// Share weight per tenant name; tenants not listed weigh 1.
    pub weights: BTreeMap<String, Positive>,
    /// Tenants tracked at most; past it, new tenants share one overflow tenant. Default 10 000.
    pub max_tenants: NonZeroUsize,
    /// Ticks without demand after which a tenant is idle and its share is lent to the others
    /// (and its state may be dropped). Default 50 (5 s at 100 ms).
    pub idle_ticks: NonZeroU32,
}

impl Default for TenantConfig {
    fn default() -> Self {
        TenantConfig {
            enabled: true,
            min_budget: None,
            weights: BTreeMap::new(),
            max_tenants: NonZeroUsize::new(10_000).unwrap(),
            idle_ticks: NonZeroU32::new(50).unwrap(),
        }
    }
}

impl TenantConfig {
    /// The guaranteed minimum in effect for a stable budget.
    pub fn min_budget(&self, stable_budget: f64) -> f64 {
        self.min_budget
            .map_or(stable_budget * 0.01, NonNegative::get)
    }

    /// A tenant's share weight.
    pub fn weight(&self, tenant: &str) -> f64 {
        self.weights.get(tenant).map_or(1.0, |w| w.get())
    }
}

/// Headroom over a tenant's measured demand in its allocation, so a light tenant whose demand
/// is rising is not throttled by its own lagging estimate.
pub(crate) const DEMAND_HEADROOM: f64 = 1.5;

/// Splits `budget` among tenants by weighted max-min fairness (water-filling): a tenant that
/// wants less than its weighted share gets what it wants (with [`DEMAND_HEADROOM`]), and what
/// it leaves is split among the others by weight, so one tenant alone may use everything.
/// When every tenant has what it wants, the rest is split among all by weight: the whole
/// budget is always allocated. Returns each tenant's allocation, in input order.
pub(crate) fn allocate(budget: f64, tenants: &[(f64, f64)]) -> Vec<f64> {
    let mut alloc = vec![0.0; tenants.len()];
    let mut open: Vec<usize> = (0..tenants.len()).collect();
    let mut remaining = budget.max(0.0);
    let mut done = vec![false; tenants.len()];
    loop {
        let total_weight: f64 = open.iter().map(|&i| tenants[i].0).sum();
        if open.is_empty() || total_weight <= 0.0 {
            break;
        }
        let mut satisfied = Vec::new();
        for &i in &open {
            let share = remaining * tenants[i].0 / total_weight;
            let want = tenants[i].1 * DEMAND_HEADROOM;
            if want <= share {
                satisfied.push(i);
            }
        }
        if satisfied.is_empty() {
            for &i in &open {
                alloc[i] = remaining * tenants[i].0 / total_weight;
            }
            return alloc;
        }
        for &i in &satisfied {
            alloc[i] = tenants[i].1 * DEMAND_HEADROOM;
            remaining -= alloc[i];
            done[i] = true;
        }
        // A mask, not `satisfied.contains`: that made a tick quadratic in the tenants.
        open.retain(|&i| !done[i]);
    }
    // Everyone has what it asks for: the rest is split by weight too, so a tenant whose demand
    // jumps can use the idle budget before the next tick measures it.
    let total_weight: f64 = tenants.iter().map(|t| t.0).sum();
    if remaining > 0.0 && total_weight > 0.0 {
        for (a, t) in alloc.iter_mut().zip(tenants) {
            *a += remaining * t.0 / total_weight;
        }
    }
    alloc
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_lone_tenant_gets_everything_and_weights_split_the_rest() {
        assert_eq!(allocate(1000.0, &[(1.0, 1e9)]), [1000.0]);
        assert_eq!(allocate(900.0, &[(2.0, 1e9), (1.0, 1e9)]), [600.0, 300.0]);
        assert_eq!(allocate(1000.0, &[]), Vec::<f64>::new());
        // Both satisfied with 15: the other 970 is split too.
        assert_eq!(
            allocate(1000.0, &[(1.0, 10.0), (1.0, 10.0)]),
            [500.0, 500.0]
        );
    }

    proptest! {
        /// Never more than the budget; each tenant gets at least min(demand, its share).
        #[test]
        fn allocations_are_fair_and_within_budget(
            budget in 1.0f64..1e6,
            tenants in proptest::collection::vec((0.1f64..10.0, 0.0f64..1e6), 1..20),
        ) {
            let a = allocate(budget, &tenants);
            let total: f64 = a.iter().sum();
            prop_assert!(total <= budget * (1.0 + 1e-9));
            let weights: f64 = tenants.iter().map(|t| t.0).sum();
            for (i, &(w, demand)) in tenants.iter().enumerate() {
                let share = budget * w / weights;
                prop_assert!(a[i] + 1e-6 >= demand.min(share), "{i}: {} < min({demand}, {share})", a[i]);
            }
        }
    }
}

/// The examples of this module's documentation, run.
#[cfg(test)]
mod examples {
    #[test]
    fn the_hog_gets_what_the_light_tenants_leave() {
        use crate::budget::shares::allocate;

        // One hog and three light tenants (demand 10 each) share 1000: each light tenant gets its
        // demand with headroom, the hog the rest.
        let a = allocate(
            1000.0,
            &[(1.0, 5000.0), (1.0, 10.0), (1.0, 10.0), (1.0, 10.0)],
        );
        assert_eq!(a, vec![955.0, 15.0, 15.0, 15.0]);
    }
}
