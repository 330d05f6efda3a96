//! The tenants' shares of the global budget, their fair parts and guaranteed minimums; the
//! split itself is [`allocate`] (in `tenant.rs`).
//!
//! Each active tenant's share is its weighted max-min fair part of the budget (a tenant that
//! asks for less than its share keeps what it asks for, the rest is lent to the others, so one
//! tenant alone can use it all), and `min_budget` per second is guaranteed to every tenant even
//! when the global budget is spent. Tenants live in the one [`Bounded`] store: at most
//! `max_tenants` of them, the others sharing [`OVERFLOW`]'s entry; a tenant idle for
//! `idle_ticks` and not in use is forgotten at the next [`tick`](Tenants::tick), which
//! re-splits the budget among those active.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use super::Settings;
use super::fair;
use super::fixed;
use super::gcra::{Gcra, interval_for_rate};
use super::shares::allocate;
use crate::bounded::Bounded;
use crate::bounded::OVERFLOW;
use crate::call::Tenant;
use crate::distributed::{LeaseGate, TenantLease};
use crate::metrics;
use crate::stats::Ewma;

/// One tenant's buckets and demand.
pub(super) struct TenantState {
    /// Its name (as [`Tenant`] holds it: the one string, shared), for its weight, its metric
    /// labels and its lease.
    name: Tenant,
    /// Cost admitted this tick.
    pub(super) admitted: AtomicU64,
    /// Its share of the global budget.
    pub(super) share: Gcra,
    /// Its guaranteed minimum.
    pub(super) guaranteed: Gcra,
    /// Its bucket in fixed mode.
    pub(super) fixed: Gcra,
    /// Cost asked this tick, admitted or not.
    pub(super) demand: AtomicU64,
    tick: Mutex<TenantTick>,
    /// Its key among the clients' groups.
    pub(super) group: u64,
    /// Its share's fair parts among its sessions.
    pub(super) fair: fair::Part,
    /// Whether its demand is light (at most `fair::LIGHT` of its weighted part of the global
    /// budget), set every tick.
    under_share: AtomicBool,
    /// Its lease of its cluster-wide share (none unless the budget is shared).
    pub(super) lease: TenantLease,
}

impl std::fmt::Debug for TenantState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TenantState")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

struct TenantTick {
    demand: Ewma,
    idle: u32,
    allocation: f64,
}

/// Every tenant's share, bounded.
pub(super) struct Tenants {
    map: Bounded<Arc<TenantState>>,
    /// Rate a tenant not seen before starts with, until the next tick sizes its share.
    newcomer_rate: AtomicU64,
    /// Tenants active at the last tick.
    active: AtomicUsize,
    /// The per-tenant gauges' bounded label values.
    labels: Arc<metrics::Labels>,
}

/// What a newcomer's buckets are made from.
pub(super) struct Newcomer<'a> {
    /// The settings in force.
    pub(super) settings: &'a Settings,
    /// The fixed-mode tenant limit, if set.
    pub(super) fixed_rate: Option<f64>,
    /// Now, ns from the budget's epoch.
    pub(super) now: u64,
    /// The clients' demands, for its group key.
    pub(super) clients: &'a fair::Clients,
    /// The cluster's leases, for its lease.
    pub(super) leases: &'a LeaseGate,
}

impl Tenants {
    /// None yet; a newcomer starts at `rate` until the first tick.
    pub(super) fn new(rate: f64, labels: Arc<metrics::Labels>) -> Self {
        Tenants {
            map: Bounded::new(),
            newcomer_rate: AtomicU64::new(rate.to_bits()),
            active: AtomicUsize::new(0),
            labels,
        }
    }

    /// Tenants tracked now.
    pub(super) fn len(&self) -> usize {
        self.map.len()
    }

    /// Tenants active at the last tick.
    pub(super) fn active(&self) -> usize {
        self.active.load(Ordering::Relaxed)
    }

    /// A tenant's current share of the budget, cost units per second.
    pub(super) fn allocation(&self, tenant: &Tenant) -> Option<f64> {
        self.find(tenant).map(|t| {
            t.tick
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .allocation
        })
    }

    /// Calls `f` on every tenant.
    pub(super) fn for_each(&self, mut f: impl FnMut(&TenantState)) {
        self.map.for_each(|t| f(t));
    }

    /// The tenant's state, if tracked.
    pub(super) fn find(&self, tenant: &Tenant) -> Option<Arc<TenantState>> {
        self.map.get(tenant.key())
    }

    /// The tenant's state, made from `new` if it is not tracked yet; past `max_tenants`, the
    /// [`OVERFLOW`]'s.
    pub(super) fn insert(&self, tenant: &Tenant, new: Newcomer<'_>) -> Arc<TenantState> {
        let key = tenant.key();
        let cap = new.settings.tenants.max_tenants;
        self.map
            .get_or_insert(key, cap.get(), || self.newcomer(tenant.clone(), &new))
            .unwrap_or_else(|| {
                let overflow = Tenant::new(OVERFLOW);
                let key = overflow.key();
                self.map
                    .get_or_insert(key, usize::MAX, || self.newcomer(overflow, &new))
                    .unwrap_or_else(|| unreachable!("an uncapped insert always stores"))
            })
    }

    fn newcomer(&self, name: Tenant, new: &Newcomer<'_>) -> Arc<TenantState> {
        let st = new.settings;
        let rate = f64::from_bits(self.newcomer_rate.load(Ordering::Relaxed));
        // The guaranteed minimum is part of the budget: never more than a newcomer's share
        // of it, and it starts empty (a new tenant has no savings to spend).
        let min = st.min_budget.min(rate);
        let w = st.max_weight;
        // A tenant's bucket holds the configured burst, as the global one does.
        let burst = st.config.burst(w) as u64;
        Arc::new(TenantState {
            lease: new.leases.tenant(name.as_str(), rate.max(min)),
            group: new.clients.group(name.as_str()),
            name,
            admitted: AtomicU64::new(0),
            share: Gcra::new(interval_for_rate(rate.max(min)), burst),
            guaranteed: Gcra::empty(
                new.now,
                interval_for_rate(min),
                (min as u64).max(u64::from(w)),
            ),
            fixed: fixed::bucket(new.fixed_rate.unwrap_or(rate), w),
            demand: AtomicU64::new(0),
            fair: fair::Part::new(rate.max(min)),
            // A newcomer has asked nothing yet: under its part until its first tick says
            // otherwise, so its first calls meet the reserve, not the others' debt (its
            // guaranteed minimum starts empty, and the reserve is bounded: newcomers together
            // never pass the budget and its burst, tests/hostile.rs).
            under_share: AtomicBool::new(true),
            tick: Mutex::new(TenantTick {
                demand: Ewma::new(st.config.alpha.get()),
                idle: 0,
                allocation: rate,
            }),
        })
    }

    /// Whether a call of `tenant` may spend the global bucket's reserve: fair at every level,
    /// a client's part of the global budget is its part of its tenant's, and its tenant's is
    /// its part of the global budget; so a call is light globally when its tenant is light
    /// among several active tenants, or its session is light within its tenant's share
    /// (`session_under`), whatever the tenant's other sessions ask. One tenant of twelve
    /// sessions fares as twelve tenants of one.
    pub(super) fn under(&self, tenant: &TenantState, session_under: bool) -> bool {
        session_under || (self.active() > 1 && tenant.under_share.load(Ordering::Relaxed))
    }

    /// Ends the tick: forgets idle tenants, re-splits `budget` among the active ones (their
    /// sessions' demands in `clients`), sets their fair parts, guaranteed minimums, lease
    /// proposals and gauges.
    pub(super) fn tick(
        &self,
        now: u64,
        budget: f64,
        st: &Settings,
        clients: &mut HashMap<u64, Vec<f64>>,
    ) {
        let secs = st.config.sample_interval.get().as_secs_f64();
        let idle_ticks = st.tenants.idle_ticks;
        let mut active = Vec::with_capacity(self.map.len());
        self.map.retain(|t| {
            let demand = t.demand.swap(0, Ordering::Relaxed) as f64 / secs;
            let mut tick = t.tick.lock().unwrap_or_else(PoisonError::into_inner);
            tick.demand.update(demand);
            tick.idle = if demand > 0.0 { 0 } else { tick.idle + 1 };
            if tick.idle > idle_ticks.get() && Arc::strong_count(t) == 1 {
                return false; // idle and not in use: forget it
            }
            if tick.idle <= idle_ticks.get() {
                let weight = st.tenants.weight(t.name.as_str());
                active.push((t.clone(), weight, tick.demand.value().unwrap_or(0.0)));
            }
            true
        });
        let wants: Vec<(f64, f64)> = active.iter().map(|(_, w, d)| (*w, *d)).collect();
        let shares = allocate(budget, &wants);
        let total_weight: f64 = wants.iter().map(|(w, _)| w).sum();
        self.active.store(active.len(), Ordering::Relaxed);
        // The guaranteed minimums together never pass the budget.
        let min = st.min_budget.min(budget / active.len().max(1) as f64);
        for ((t, weight, _), share) in active.iter().zip(shares) {
            let rate = share.max(min);
            t.guaranteed.set_interval(now, interval_for_rate(min));
            let (label, _) = self.labels.tenant_of(&t.name);
            let consumed = t.admitted.swap(0, Ordering::Relaxed) as f64 / secs;
            ::metrics::gauge!(metrics::TENANT_CONSUMPTION, "tenant" => label.clone()).set(consumed);
            ::metrics::gauge!(metrics::TENANT_ALLOCATION, "tenant" => label).set(rate);
            t.share.set_interval(now, interval_for_rate(rate));
            t.share.set_burst(st.config.burst(st.max_weight) as u64);
            // Fair shares: its sessions' of its rate, and its own of the global budget.
            let sessions = clients
                .get_mut(&t.group)
                .map_or(&mut [][..], |d| &mut d[..]);
            t.fair.set(rate, sessions);
            let weighted = budget * weight / total_weight.max(f64::MIN_POSITIVE);
            t.lease.propose(rate);
            let mut tick = t.tick.lock().unwrap_or_else(PoisonError::into_inner);
            tick.allocation = rate;
            let demand = tick.demand.value().unwrap_or(0.0);
            t.under_share.store(
                active.len() > 1 && demand <= fair::LIGHT * weighted,
                Ordering::Relaxed,
            );
        }
        let newcomer = budget / (active.len() + 1) as f64;
        self.newcomer_rate
            .store(newcomer.to_bits(), Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::shares::DEMAND_HEADROOM;
    use crate::budget::{BudgetConfig, TenantConfig};
    use crate::cost::CostConfig;
    use crate::valid::Positive;
    use proptest::prelude::*;

    /// Bisection for the `x` with `sum(given(x)) = total`, `given` non-decreasing in `x`.
    fn water(total: f64, hi: f64, given: impl Fn(f64) -> f64) -> f64 {
        let (mut lo, mut hi) = (0.0, hi);
        for _ in 0..200 {
            let mid = (lo + hi) / 2.0;
            if given(mid) < total {
                lo = mid
            } else {
                hi = mid
            }
        }
        hi
    }

    /// Each tenant's share of `budget` by its definition: every tenant gets what it wants
    /// (its demand with headroom) up to one water level per unit of weight; when all wants
    /// fit, the rest is split by weight on top.
    fn shares(budget: f64, tenants: &[(f64, f64)]) -> Vec<f64> {
        let wants: Vec<(f64, f64)> = tenants
            .iter()
            .map(|&(w, d)| (w, d * DEMAND_HEADROOM))
            .collect();
        let sum: f64 = wants.iter().map(|t| t.1).sum();
        let weights: f64 = wants.iter().map(|t| t.0).sum();
        if sum <= budget {
            return wants
                .iter()
                .map(|&(w, d)| d + (budget - sum) * w / weights)
                .collect();
        }
        let x = water(budget, budget, |x| {
            wants.iter().map(|&(w, d)| d.min(x * w)).sum()
        });
        wants.iter().map(|&(w, d)| d.min(x * w)).collect()
    }

    /// The max-min level of `rate` among `demands` by its definition; when all fit, the
    /// heaviest demand or the equal split.
    fn level(rate: f64, demands: &[f64]) -> f64 {
        let n = demands.len() as f64;
        if demands.iter().sum::<f64>() <= rate {
            return demands.iter().copied().fold(0.0, f64::max).max(rate / n);
        }
        water(rate, rate, |l| demands.iter().map(|&d| d.min(l)).sum())
    }

    proptest! {
        /// Fair at every level, against the definition: after a tick, a session may spend
        /// the global reserve exactly when it uses at most `LIGHT` of its max-min part of its
        /// tenant's share (beside another session of it), or its tenant uses at most `LIGHT`
        /// of its weighted part of the budget (beside another tenant).
        #[test]
        fn a_session_is_light_by_its_part_of_its_tenants_part(
            budget in 100.0f64..10_000.0,
            tenants in proptest::collection::vec(
                (1u32..4, proptest::collection::vec(0u32..2_000, 1..6)),
                1..6,
            ),
        ) {
            let mut config = TenantConfig::default();
            for (t, (weight, _)) in tenants.iter().enumerate() {
                config.weights.insert(format!("t{t}"), Positive::new(f64::from(*weight)).unwrap());
            }
            let settings = Settings::new(BudgetConfig::default(), config, &CostConfig::default());
            let secs = settings.config.sample_interval.get().as_secs_f64();
            // A tenant's demand as its tick reads it: the whole units asked within the tick.
            let fed = |d: u32| (f64::from(d) * secs) as u64;
            let all = Tenants::new(budget, Arc::new(metrics::Labels::default()));
            let clients = fair::Clients::new();
            let leases = LeaseGate::default();
            let now = 0;
            let mut states = Vec::new();
            for (t, (_, sessions)) in tenants.iter().enumerate() {
                let name = Tenant::new(format!("t{t}"));
                let new = Newcomer { settings: &settings, fixed_rate: None, now, clients: &clients, leases: &leases };
                let state = all.insert(&name, new);
                let mut usages = Vec::new();
                for (s, &demand) in sessions.iter().enumerate() {
                    // Asked `demand` units/s: a first call that reads so.
                    let usage = clients.get((t * 100 + s) as u64, state.group, now).unwrap();
                    let cost = fair::Clients::first_ask(f64::from(demand));
                    fair::Clients::ask(&usage, now, (cost, f64::INFINITY), &state.fair);
                    state.demand.fetch_add(fed(demand), Ordering::Relaxed);
                    usages.push(usage);
                }
                states.push((state, usages));
            }
            all.tick(now, budget, &settings, &mut clients.active(now));

            let totals: Vec<(f64, f64)> = tenants
                .iter()
                .map(|(w, s)| {
                    let units: u64 = s.iter().map(|&d| fed(d)).sum();
                    (f64::from(*w), units as f64 / secs)
                })
                .collect();
            let weights: f64 = totals.iter().map(|t| t.0).sum();
            let parts = shares(budget, &totals);
            let min = settings.min_budget.min(budget / tenants.len() as f64);
            let close = |a: f64, b: f64| (a - b).abs() <= 1e-6 * a.abs().max(b.abs()).max(1.0);
            for (t, ((_, sessions), (state, usages))) in tenants.iter().zip(&states).enumerate() {
                let (weight, total) = totals[t];
                let demands: Vec<f64> = sessions.iter().map(|&d| f64::from(d)).collect();
                let tenant_part = fair::LIGHT * budget * weight / weights;
                let session_part = fair::LIGHT * level(parts[t].max(min), &demands);
                let tenant_light = tenants.len() > 1 && total <= tenant_part;
                for (s, usage) in usages.iter().enumerate() {
                    let d = demands[s];
                    if close(d, session_part) || close(total, tenant_part) {
                        continue; // on a boundary: rounding decides
                    }
                    let session_light = sessions.len() > 1 && d <= session_part;
                    let standing = fair::Clients::ask(usage, now, (0.0, f64::INFINITY), &state.fair);
                    // Beyond its share: above its fair level itself, with no margin.
                    let session_fair = session_part / fair::LIGHT;
                    if !close(d, session_fair) {
                        prop_assert_eq!(standing.beyond, d > session_fair, "tenant {} session {}", t, s);
                    }
                    let got = all.under(state, standing.light);
                    prop_assert_eq!(
                        got,
                        session_light || tenant_light,
                        "tenant {} session {}: {} units/s of a part {}, tenant {} of {}",
                        t, s, d, session_part, total, tenant_part
                    );
                }
            }
        }
    }
}
