//! The adaptive global budget and the per-tenant shares of it (seed 003 sections 3.1, 3.2,
//! 4.1, 4.2).
//!
//! [`Budget`] is one shared state with three faces:
//!
//! * an [`Admission`]: each tool, resource or prompt call is charged its weight ([`Call::cost`]) against a
//!   weighted-cost token bucket ([`Gcra`], lock-free) whose rate is the current budget, and
//!   against its tenant's share; a call refused by a later stage gets its charge back;
//! * an [`Observer`]: every finished call's service time and outcome feed the tick's sample;
//! * a ticker: every `sample_interval` the [`Controller`] smooths the tick (EWMA), moves the
//!   budget (multiplicative decrease when unhealthy, additive steps after `recover_after`
//!   healthy ticks), re-rates the bucket live, refreshes learned tool weights and re-splits
//!   the budget among active tenants ([`allocate`]).
//!
//! Tenants: each active tenant's share is its weighted max-min fair part of the budget (a
//! tenant that asks for less than its share keeps what it asks for, the rest is lent to the
//! others, so one tenant alone can use it all), and `min_budget` per second is guaranteed to
//! every tenant even when the global budget is spent: such calls are still charged to the
//! global bucket, so the others feel them.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! use stormgate::Call;
//! use stormgate::admit::Admission;
//! use stormgate::budget::{Budget, BudgetConfig};
//!
//! let budget = Budget::builder(BudgetConfig { stable_budget: 100.0, ..Default::default() }).build();
//! let _ticker = budget.spawn_ticker();
//! assert!(budget.admit(&Call::request("tools/call").with_tool("cache_get")).is_ok());
//! assert_eq!(budget.current(), 100.0);
//! # }
//! ```

mod census;
mod controller;
mod fair;
mod gcra;
mod sampler;
mod shared;
mod tenant;
mod trend;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use arc_swap::ArcSwap;
use dashmap::DashMap;
use tokio::time::Instant;

pub use crate::stats::Ewma;
pub use controller::{BudgetConfig, Controller, Health, TickStats};
pub use gcra::{Gcra, RESERVE, gcra_check, interval_for_rate};
pub use tenant::{DEMAND_HEADROOM, TenantConfig, allocate};

use crate::admit::{Admission, AdmitLayer};
use crate::call::{Call, Tenant};
use crate::cost::{CostConfig, Costs};
use crate::entropy::{ClientKeys, SessionGuard};
use crate::error::ConfigError;
use crate::metrics;
use crate::outcome::{Observation, Observer};
use crate::policy::{Mode, Policy, Switch};
use crate::rejection::{Reason, Rejection, Scope};
use sampler::Sampler;
use shared::Leased;
use trend::{Phase, Trend};

/// The tenant that tenants past `max_tenants` share.
pub const OVERFLOW_TENANT: &str = "~overflow";

/// The shared budget state. A cheap handle: clones share everything.
#[derive(Clone)]
pub struct Budget {
    inner: Arc<Inner>,
}

struct Inner {
    epoch: Instant,
    switch: Switch,
    labels: Arc<metrics::Labels>,
    /// The global bucket of fixed mode.
    fixed_global: Gcra,
    /// The settings, swapped whole by a reload.
    settings: ArcSwap<Settings>,
    global: Gcra,
    sampler: Sampler,
    controller: Mutex<Controller>,
    health: Mutex<Health>,
    /// The cuts and recoveries logged.
    trend: Mutex<Trend>,
    tenants: DashMap<Tenant, Arc<TenantState>>,
    /// Rate a tenant not seen before starts with, until the next tick sizes its share.
    newcomer_rate: AtomicU64,
    costs: Arc<Costs>,
    /// Who a call's client is, for the census and the fair shares (see
    /// [`BudgetBuilder::sessions`]).
    client_keys: ClientKeys,
    /// Each client's recent demand, for the fair shares inside the shared buckets.
    clients: fair::Clients,
    /// Without tenants: the global budget's fair parts.
    fair: fair::Part,
    /// Tenants active at the last tick.
    tenants_active: std::sync::atomic::AtomicUsize,
    /// The cluster's leases (feature `redis`).
    #[cfg(feature = "redis")]
    shared: Option<crate::distributed::SharedBudget>,
}

/// Everything a reload may change.
#[derive(Debug, Clone)]
struct Settings {
    config: BudgetConfig,
    tenants: TenantConfig,
    min_budget: f64,
    max_weight: u32,
}

impl Settings {
    fn new(config: BudgetConfig, tenants: TenantConfig, costs: &CostConfig) -> Self {
        Settings {
            min_budget: tenants.min_budget(config.stable_budget),
            max_weight: costs.max_possible_weight(),
            config,
            tenants,
        }
    }
}

struct TenantState {
    /// Cost admitted this tick.
    admitted: AtomicU64,
    share: Gcra,
    guaranteed: Gcra,
    /// The tenant's bucket in fixed mode.
    fixed: Gcra,
    demand: AtomicU64,
    tick: Mutex<TenantTick>,
    /// Its key among the clients' groups.
    group: u64,
    /// Its share's fair parts among its sessions.
    fair: fair::Part,
    /// Whether its demand is light (at most `fair::LIGHT` of its weighted part of the global
    /// budget), set every tick.
    under_share: AtomicBool,
    /// The tenant's lease of its cluster-wide share (feature `redis`).
    #[cfg(feature = "redis")]
    lease: Option<Arc<crate::distributed::ScopeLease>>,
}

struct TenantTick {
    demand: Ewma,
    idle: u32,
    allocation: f64,
}

impl std::fmt::Debug for Budget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Budget")
            .field("config", &self.inner.settings.load().config)
            .field("current", &self.current())
            .field("tenants", &self.inner.tenants.len())
            .finish()
    }
}

/// Builds a [`Budget`].
#[derive(Debug, Clone)]
pub struct BudgetBuilder {
    config: BudgetConfig,
    tenants: TenantConfig,
    costs: CostConfig,
    switch: Switch,
    labels: Arc<metrics::Labels>,
    sessions: Option<SessionGuard>,
    #[cfg(feature = "redis")]
    shared: Option<crate::distributed::SharedBudget>,
}

impl BudgetBuilder {
    /// The session guard whose clients the controller's health census counts: a session the
    /// MCP server accepted is one client, and the calls on every other id of a tenant are
    /// one more (its unverified pool), so ids a client makes up weigh as one client. Without
    /// it every session id counts as a client. [`Control`](crate::control::Control) sets it.
    pub fn sessions(mut self, sessions: SessionGuard) -> Self {
        self.sessions = Some(sessions);
        self
    }

    /// Shares the global budget and the tenants' shares with the other nodes of a cluster
    /// through Redis (feature `redis`; see [`distributed`](crate::distributed)): in adaptive
    /// mode every call also spends from this node's leases, and the controller's budget is
    /// this node's proposal for the cluster's rate. One `SharedBudget` per `Budget`.
    #[cfg(feature = "redis")]
    pub fn shared(mut self, shared: crate::distributed::SharedBudget) -> Self {
        self.shared = Some(shared);
        self
    }

    /// Per-tenant settings (default: enabled, min_budget 1% of stable).
    pub fn tenants(mut self, tenants: TenantConfig) -> Self {
        self.tenants = tenants;
        self
    }

    /// Tool weights (default: every tool weighs 1).
    pub fn costs(mut self, costs: CostConfig) -> Self {
        self.costs = costs;
        self
    }

    /// The kill switch to follow (default: always adaptive).
    pub fn switch(mut self, switch: Switch) -> Self {
        self.switch = switch;
        self
    }

    /// Labels the per-tenant gauges with these bounded label values (default: its own, capped
    /// at 100).
    pub fn labels(mut self, labels: Arc<metrics::Labels>) -> Self {
        self.labels = labels;
        self
    }

    /// Validates every setting.
    pub fn try_build(self) -> Result<Budget, ConfigError> {
        self.config.validate()?;
        self.tenants.validate()?;
        self.costs.validate()?;
        Ok(self.build_unchecked())
    }

    /// Builds; panics on invalid settings (use [`try_build`](Self::try_build) for input).
    pub fn build(self) -> Budget {
        self.try_build().unwrap_or_else(|e| panic!("{e}"))
    }

    fn build_unchecked(self) -> Budget {
        let settings = Settings::new(self.config, self.tenants, &self.costs);
        let burst = settings.config.burst(settings.max_weight);
        let stable = settings.config.stable_budget;
        let budget = Budget {
            inner: Arc::new(Inner {
                epoch: Instant::now(),
                fixed_global: Gcra::new(interval_for_rate(stable), burst as u64),
                switch: self.switch,
                labels: self.labels,
                global: Gcra::new(interval_for_rate(stable), burst as u64),
                sampler: Sampler::new(),
                controller: Mutex::new(Controller::new(settings.config.clone())),
                health: Mutex::new(Health {
                    budget: stable,
                    ..Health::default()
                }),
                trend: Mutex::new(Trend::default()),
                tenants: DashMap::new(),
                newcomer_rate: AtomicU64::new(stable.to_bits()),
                costs: Arc::new(Costs::new(self.costs)),
                client_keys: ClientKeys::default(),
                clients: fair::Clients::new(),
                fair: fair::Part::default(),
                tenants_active: std::sync::atomic::AtomicUsize::new(0),
                settings: ArcSwap::from_pointee(settings),
                #[cfg(feature = "redis")]
                shared: self.shared,
            }),
        };
        if let Some(sessions) = self.sessions {
            budget.inner.client_keys.follow(sessions);
        }
        budget.apply_policy();
        #[cfg(feature = "redis")]
        if let Some(shared) = &budget.inner.shared {
            shared.global().propose(stable); // until the first tick
        }
        budget
    }
}

fn burst_for(rate: f64, max_weight: u32) -> u64 {
    // A tenth of a second of the rate, and never less than one call of the heaviest tool.
    (rate / 10.0).max(f64::from(max_weight)).max(1.0) as u64
}

impl Budget {
    /// A builder with these global settings.
    pub fn builder(config: BudgetConfig) -> BudgetBuilder {
        BudgetBuilder {
            config,
            tenants: TenantConfig::default(),
            costs: CostConfig::default(),
            switch: Switch::default(),
            labels: Arc::default(),
            sessions: None,
            #[cfg(feature = "redis")]
            shared: None,
        }
    }

    fn now(&self) -> u64 {
        u64::try_from(self.inner.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// The settings in force: the budget's and the tenants'.
    pub fn config(&self) -> (BudgetConfig, TenantConfig) {
        let st = self.inner.settings.load();
        (st.config.clone(), st.tenants.clone())
    }

    /// The budget now, in cost units per second.
    pub fn current(&self) -> f64 {
        self.health().budget
    }

    /// The controller's view after the last tick.
    pub fn health(&self) -> Health {
        *self
            .inner
            .health
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The tool weight table (give it to [`ClassifyLayer::costs`](crate::classify::ClassifyLayer::costs)).
    pub fn costs(&self) -> Arc<Costs> {
        self.inner.costs.clone()
    }

    /// The cluster's shared budget this budget spends leases of, if any (feature `redis`).
    #[cfg(feature = "redis")]
    pub fn shared(&self) -> Option<&crate::distributed::SharedBudget> {
        self.inner.shared.as_ref()
    }

    /// Tenants tracked now.
    pub fn tenant_count(&self) -> usize {
        self.inner.tenants.len()
    }

    /// A tenant's current share of the budget, cost units per second.
    pub fn allocation(&self, tenant: &Tenant) -> Option<f64> {
        self.inner.tenants.get(tenant).map(|t| {
            t.tick
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .allocation
        })
    }

    /// The admission stage: `AdmitLayer` over this budget.
    pub fn layer(&self) -> AdmitLayer<Budget> {
        AdmitLayer::new(self.clone())
    }

    /// The observer to give to [`OutcomeLayer`](crate::outcome::OutcomeLayer): it feeds the
    /// controller and the learned tool weights.
    pub fn observer(&self) -> Arc<dyn Observer> {
        Arc::new(self.clone())
    }

    fn tenant(&self, tenant: &Tenant) -> Arc<TenantState> {
        if let Some(t) = self.inner.tenants.get(tenant) {
            return t.clone();
        }
        let st = self.inner.settings.load();
        let tenant = if self.inner.tenants.len() >= st.tenants.max_tenants {
            Tenant::new(OVERFLOW_TENANT)
        } else {
            tenant.clone()
        };
        let rate = f64::from_bits(self.inner.newcomer_rate.load(Ordering::Relaxed));
        let fixed_tenant = self.inner.switch.load().fixed.tenant_rate;
        // The guaranteed minimum is part of the budget: never more than a newcomer's share
        // of it, and it starts empty (a new tenant has no savings to spend).
        let min = st.min_budget.min(rate);
        let w = st.max_weight;
        // A tenant's bucket holds the configured burst, as the global one does.
        let burst = st.config.burst(w) as u64;
        let now = self.now();
        let group = self.inner.clients.group(tenant.as_str());
        #[cfg(feature = "redis")]
        let lease = self.tenant_lease(tenant.as_str(), rate.max(min));
        self.inner
            .tenants
            .entry(tenant)
            .or_insert_with(|| {
                Arc::new(TenantState {
                    #[cfg(feature = "redis")]
                    lease,
                    admitted: AtomicU64::new(0),
                    share: Gcra::new(interval_for_rate(rate.max(min)), burst),
                    guaranteed: Gcra::empty(
                        now,
                        interval_for_rate(min),
                        (min as u64).max(u64::from(w)),
                    ),
                    fixed: {
                        let rate = fixed_tenant.unwrap_or(rate);
                        Gcra::new(interval_for_rate(rate), burst_for(rate, w))
                    },
                    demand: AtomicU64::new(0),
                    group,
                    fair: fair::Part::default(),
                    // Earned at its first tick, if under its part: a newcomer has no savings.
                    under_share: AtomicBool::new(false),
                    tick: Mutex::new(TenantTick {
                        demand: Ewma::new(st.config.alpha),
                        idle: 0,
                        allocation: rate,
                    }),
                })
            })
            .clone()
    }

    /// Takes new settings, keeping what was learned: the controller's averages and budget
    /// (clamped to the new range), the buckets' debts, the tenants and their demand. Tool
    /// weights are the classifier's [`Costs`] table, reconfigured on its own. A new
    /// `sample_interval` applies when the ticker is next started.
    pub fn reconfigure(
        &self,
        config: BudgetConfig,
        tenants: TenantConfig,
        costs: &CostConfig,
    ) -> Result<(), ConfigError> {
        config.validate()?;
        tenants.validate()?;
        costs.validate()?;
        self.set_config(config, tenants, costs);
        Ok(())
    }

    /// [`reconfigure`](Self::reconfigure) with settings already validated.
    pub(crate) fn set_config(
        &self,
        config: BudgetConfig,
        tenants: TenantConfig,
        costs: &CostConfig,
    ) {
        let inner = &*self.inner;
        let settings = Settings::new(config.clone(), tenants, costs);
        let burst = settings.config.burst(settings.max_weight);
        inner
            .controller
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .reconfigure(config);
        inner.global.set_burst(burst as u64);
        inner.fixed_global.set_burst(burst as u64);
        inner.settings.store(Arc::new(settings));
        inner.costs.reconfigure(costs.clone());
        self.apply_policy();
    }

    /// Applies the current policy at once: re-rates the fixed-mode buckets, and pins the global
    /// bucket at the stable budget while `adaptive_budget` is off. The control handle calls it
    /// on every flip; the tick calls it too.
    pub fn apply_policy(&self) {
        let inner = &*self.inner;
        let policy = inner.switch.load();
        let st = inner.settings.load();
        let now = self.now();
        let w = st.max_weight;
        if let Some(rate) = policy.fixed.global_rate {
            inner
                .fixed_global
                .set_interval(now, interval_for_rate(rate));
            inner.fixed_global.set_burst(burst_for(rate, w));
        }
        if let Some(rate) = policy.fixed.tenant_rate {
            for t in inner.tenants.iter() {
                t.fixed.set_interval(now, interval_for_rate(rate));
                t.fixed.set_burst(burst_for(rate, w));
            }
        }
        if !policy.features.adaptive_budget {
            inner
                .global
                .set_interval(now, interval_for_rate(st.config.stable_budget));
        }
    }

    /// Ends the current tick: smooths it, moves the budget, re-rates the buckets, refreshes
    /// learned weights and re-splits the budget among tenants. [`spawn_ticker`] calls it every
    /// `sample_interval`; tests may call it directly.
    ///
    /// [`spawn_ticker`]: Budget::spawn_ticker
    pub fn tick(&self) -> Health {
        let inner = &*self.inner;
        let now = self.now();
        let interval = inner.settings.load().config.sample_interval;
        let stats = inner.sampler.take(interval);
        let health = inner
            .controller
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .tick(stats);
        // The controller keeps learning in every mode; its budget rules only while adaptive.
        let policy = inner.switch.load();
        let st = inner.settings.load();
        let rate = if policy.features.adaptive_budget {
            health.budget
        } else {
            st.config.stable_budget
        };
        // In `local` fallback the node keeps budget / nodes (1 otherwise).
        let divisor = self.divisor();
        inner
            .global
            .set_interval(now, interval_for_rate(rate / divisor));
        inner.costs.refresh();
        let mut clients = inner.clients.active(now);
        if st.tenants.enabled {
            self.split(now, health.budget / divisor, &mut clients);
        } else {
            let mut demands: Vec<f64> = clients.into_values().flatten().collect();
            inner.fair.set(rate / divisor, &mut demands);
        }
        self.shared_tick(rate);
        let before = std::mem::replace(
            &mut *inner.health.lock().unwrap_or_else(PoisonError::into_inner),
            health,
        );
        let phase = inner
            .trend
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .update(
                inner.epoch.elapsed(),
                before.budget,
                health.budget,
                st.config.stable_budget,
            );
        match phase {
            Some(Phase::Cut) => tracing::warn!(
                from = before.budget,
                to = health.budget,
                error_rate = health.error_rate,
                p99_ms = health.p99 * 1e3,
                "global budget cut: the backend looks unhealthy"
            ),
            Some(Phase::Recovering) => {
                tracing::info!(budget = health.budget, "global budget recovering")
            }
            Some(Phase::Stable) => {
                tracing::info!(budget = health.budget, "global budget back at stable")
            }
            None => {}
        }
        policy.mode.emit(); // re-sent every tick: the exporter drops gauges left idle
        ::metrics::gauge!(metrics::BUDGET).set(health.budget);
        ::metrics::gauge!(metrics::BUDGET_RATE).set(health.rate);
        ::metrics::gauge!(metrics::BUDGET_ERROR_RATE).set(health.error_rate);
        ::metrics::gauge!(metrics::BUDGET_P99).set(health.p99);
        ::metrics::gauge!(metrics::BUDGET_IN_FLIGHT).set(health.in_flight);
        health
    }

    fn split(&self, now: u64, budget: f64, clients: &mut HashMap<u64, Vec<f64>>) {
        let inner = &*self.inner;
        let st = inner.settings.load();
        let secs = st.config.sample_interval.as_secs_f64();
        let idle_ticks = st.tenants.idle_ticks;
        let mut active = Vec::with_capacity(inner.tenants.len());
        inner.tenants.retain(|name, t| {
            let demand = t.demand.swap(0, Ordering::Relaxed) as f64 / secs;
            let mut tick = t.tick.lock().unwrap_or_else(PoisonError::into_inner);
            tick.demand.update(demand);
            tick.idle = if demand > 0.0 { 0 } else { tick.idle + 1 };
            if tick.idle > idle_ticks && Arc::strong_count(t) == 1 {
                return false; // idle and not in use: forget it
            }
            if tick.idle <= idle_ticks {
                let weight = st.tenants.weight(name.as_str());
                active.push((
                    name.clone(),
                    t.clone(),
                    weight,
                    tick.demand.value().unwrap_or(0.0),
                ));
            }
            true
        });
        let wants: Vec<(f64, f64)> = active.iter().map(|(_, _, w, d)| (*w, *d)).collect();
        let shares = allocate(budget, &wants);
        let total_weight: f64 = wants.iter().map(|(w, _)| w).sum();
        inner.tenants_active.store(active.len(), Ordering::Relaxed);
        // The guaranteed minimums together never pass the budget.
        let min = st.min_budget.min(budget / active.len().max(1) as f64);
        for ((name, t, weight, _), share) in active.iter().zip(shares) {
            let rate = share.max(min);
            t.guaranteed.set_interval(now, interval_for_rate(min));
            let label = inner.labels.tenant(name.as_str());
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
            #[cfg(feature = "redis")]
            if let Some(lease) = &t.lease {
                lease.propose(rate);
            }
            let mut tick = t.tick.lock().unwrap_or_else(PoisonError::into_inner);
            tick.allocation = rate;
            let demand = tick.demand.value().unwrap_or(0.0);
            t.under_share.store(
                active.len() > 1 && demand <= fair::LIGHT * weighted,
                Ordering::Relaxed,
            );
        }
        let newcomer = budget / (active.len() + 1) as f64;
        inner
            .newcomer_rate
            .store(newcomer.to_bits(), Ordering::Relaxed);
    }

    /// Ticks every `sample_interval` until the last [`Budget`] handle is dropped (or the
    /// returned task is aborted).
    pub fn spawn_ticker(&self) -> tokio::task::JoinHandle<()> {
        let weak: Weak<Inner> = Arc::downgrade(&self.inner);
        let every = self.inner.settings.load().config.sample_interval;
        tokio::spawn(async move {
            let mut interval = tokio::time::interval_at(Instant::now() + every, every);
            interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                interval.tick().await;
                let Some(inner) = weak.upgrade() else {
                    return;
                };
                Budget { inner }.tick();
            }
        })
    }

    fn reject(reason: Reason, scope: Scope, wait_ns: u64) -> Rejection {
        ::metrics::counter!(metrics::BUDGET_REJECTED, "reason" => reason.as_str()).increment(1);
        Rejection::new(reason, scope, Duration::from_nanos(wait_ns))
    }
}

/// Which buckets an admitted call was charged to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Charge {
    /// Nothing (mode off).
    Free,
    /// The adaptive global bucket and the tenant's share, or its guaranteed minimum.
    Adaptive { guaranteed: bool },
    /// The fixed-mode buckets that are configured.
    Fixed { global: bool, tenant: bool },
}

/// What an admitted call was charged, to give back if a later stage refuses it.
#[derive(Debug)]
pub struct BudgetPermit {
    tenant: Option<Arc<TenantState>>,
    cost: u64,
    charge: Charge,
    leased: Leased,
}

impl std::fmt::Debug for TenantState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TenantState").finish_non_exhaustive()
    }
}

impl Budget {
    fn admit_fixed(
        &self,
        call: &Call,
        cost: u64,
        now: u64,
        policy: &Policy,
    ) -> Result<BudgetPermit, Rejection> {
        let inner = &*self.inner;
        let refuse = |scope, wait| Self::reject(Reason::FixedLimitExceeded, scope, wait);
        let global = policy.fixed.global_rate.is_some();
        if global {
            inner
                .fixed_global
                .try_take(now, cost)
                .map_err(|w| refuse(Scope::Global, w))?;
        }
        let (tenant, charged) = match policy.fixed.tenant_rate {
            Some(_) => {
                let t = self.tenant(&call.tenant);
                if let Err(w) = t.fixed.try_take(now, cost) {
                    if global {
                        inner.fixed_global.refund(now, cost);
                    }
                    return Err(refuse(Scope::Tenant, w));
                }
                (Some(t), true)
            }
            None => (None, false),
        };
        Ok(BudgetPermit {
            tenant,
            cost,
            charge: Charge::Fixed {
                global,
                tenant: charged,
            },
            leased: Leased::default(),
        })
    }

    fn admit_adaptive(
        &self,
        call: &Call,
        cost: u64,
        now: u64,
        policy: &Policy,
    ) -> Result<BudgetPermit, Rejection> {
        let inner = &*self.inner;
        let leasing = self.shared_gate(now)?;
        let take = |bucket: &Gcra, under: bool| {
            if under {
                bucket.try_take_reserved(now, cost)
            } else {
                bucket.try_take(now, cost)
            }
        };
        let client = self.client(call);
        if !(inner.settings.load().tenants.enabled && policy.features.tenant_budgets) {
            let usage = inner.clients.get(client, 0, now);
            let under = usage
                .as_ref()
                .is_some_and(|u| fair::Clients::ask(u, now, cost as f64, &inner.fair));
            take(&inner.global, under)
                .map_err(|w| Self::reject(Reason::GlobalBudgetExceeded, Scope::Global, w))?;
            let leased = self.take_leases(leasing, None, cost).map_err(|(r, s, w)| {
                inner.global.refund(now, cost);
                Self::reject(r, s, w)
            })?;
            return Ok(BudgetPermit {
                tenant: None,
                cost,
                charge: Charge::Adaptive { guaranteed: false },
                leased,
            });
        }
        let tenant = self.tenant(&call.tenant);
        tenant.demand.fetch_add(cost, Ordering::Relaxed);
        // Inside its tenant's share a light session may spend the reserve; in the global
        // bucket, a light tenant.
        let usage = inner.clients.get(client, tenant.group, now);
        let session_under = usage
            .as_ref()
            .is_some_and(|u| fair::Clients::ask(u, now, cost as f64, &tenant.fair));
        // With one tenant active, the global bucket is contended by its sessions alone.
        let tenant_under = if inner.tenants_active.load(Ordering::Relaxed) > 1 {
            tenant.under_share.load(Ordering::Relaxed)
        } else {
            session_under
        };
        let mut leased = Leased::default();
        let refused = match take(&tenant.share, session_under) {
            Ok(()) => match take(&inner.global, tenant_under) {
                Ok(()) => match self.take_leases(leasing, Some(&tenant), cost) {
                    Ok(l) => {
                        leased = l;
                        None
                    }
                    Err(refusal) => {
                        inner.global.refund(now, cost);
                        tenant.share.refund(now, cost);
                        Some(refusal)
                    }
                },
                Err(wait) => {
                    tenant.share.refund(now, cost);
                    Some((Reason::GlobalBudgetExceeded, Scope::Global, wait))
                }
            },
            Err(wait) => Some((Reason::TenantBudgetExceeded, Scope::Tenant, wait)),
        };
        // The guaranteed minimum is part of the budget: charged to the global bucket (into
        // debt if need be) and, when the budget is shared, to the cluster's global lease, so
        // the nodes' minimums together never pass the cluster's budget.
        let guaranteed = match refused {
            None => false,
            Some((reason, scope, wait)) => match tenant.guaranteed.try_take(now, cost) {
                Ok(()) => match self.take_leases(leasing, None, cost) {
                    Ok(l) => {
                        leased = l;
                        inner.global.force_take(now, cost);
                        true
                    }
                    Err((r, s, w)) => {
                        tenant.guaranteed.refund(now, cost);
                        return Err(Self::reject(r, s, w));
                    }
                },
                Err(min_wait) => return Err(Self::reject(reason, scope, wait.min(min_wait))),
            },
        };
        Ok(BudgetPermit {
            tenant: Some(tenant),
            cost,
            charge: Charge::Adaptive { guaranteed },
            leased,
        })
    }
}

impl Admission for Budget {
    type Permit = BudgetPermit;

    fn admit(&self, call: &Call) -> Result<BudgetPermit, Rejection> {
        if call.target().is_none() {
            // Protocol chatter (initialize, tools/list, ping) is not the work budgets guard,
            // and refusing `initialize` would keep a client from connecting at all.
            return Ok(BudgetPermit {
                tenant: None,
                cost: 0,
                charge: Charge::Free,
                leased: Leased::default(),
            });
        }
        let now = self.now();
        let cost = u64::from(call.cost.max(1));
        let policy = self.inner.switch.load();
        let permit = match policy.mode {
            Mode::Off => BudgetPermit {
                tenant: None,
                cost,
                charge: Charge::Free,
                leased: Leased::default(),
            },
            Mode::Fixed => self.admit_fixed(call, cost, now, &policy)?,
            Mode::Adaptive => self.admit_adaptive(call, cost, now, &policy)?,
        };
        // Measured in every mode.
        self.inner.sampler.admitted(cost);
        if let Some(t) = &permit.tenant {
            t.admitted.fetch_add(cost, Ordering::Relaxed);
        }
        Ok(permit)
    }

    fn refund(&self, permit: BudgetPermit) {
        if permit.cost == 0 {
            return; // chatter: nothing was charged or counted
        }
        let now = self.now();
        let inner = &*self.inner;
        let cost = permit.cost;
        match permit.charge {
            Charge::Free => {}
            Charge::Adaptive { guaranteed } => {
                self.refund_leases(permit.leased, permit.tenant.as_deref(), cost);
                inner.global.refund(now, cost);
                if let Some(t) = &permit.tenant {
                    if guaranteed {
                        t.guaranteed.refund(now, cost);
                    } else {
                        t.share.refund(now, cost);
                    }
                }
            }
            Charge::Fixed { global, tenant } => {
                if global {
                    inner.fixed_global.refund(now, cost);
                }
                if let (true, Some(t)) = (tenant, &permit.tenant) {
                    t.fixed.refund(now, cost);
                }
            }
        }
        inner.sampler.refunded(cost);
    }
}

impl Budget {
    /// A tool's healthy latency as the controller learned it, in seconds.
    pub fn tool_baseline(&self, tool: &str) -> Option<f64> {
        self.inner.sampler.baseline(tool)
    }

    /// The client a call counts for: as the session guard judges it, else its session id.
    fn client(&self, call: &Call) -> u64 {
        self.inner.client_keys.of(call)
    }
}

impl Observer for Budget {
    fn observe(&self, observation: &Observation<'_>) {
        let inner = &*self.inner;
        let now = inner.epoch.elapsed();
        inner.sampler.observe(
            observation,
            inner.client_keys.identify(observation.call),
            now,
            &inner.settings.load().config,
        );
        self.inner.costs.observe(observation);
    }
}
