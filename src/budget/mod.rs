//! The adaptive global budget and the per-tenant shares of it.
//!
//! [`Budget`] is one shared state with three faces:
//!
//! * an [`Admission`]: each tool, resource or prompt call is charged its weight ([`Call::cost`]) against a
//!   weighted-cost token bucket (`Gcra`, lock-free) whose rate is the current budget, and
//!   against its tenant's share; a call refused by a later stage gets its charge back;
//! * an [`Observer`]: every finished call's service time and outcome feed the tick's sample;
//! * a ticker: every `sample_interval` the [`Controller`] smooths the tick (EWMA), moves the
//!   budget (multiplicative decrease when unhealthy, additive steps after `recover_after`
//!   healthy ticks), re-rates the bucket live, refreshes learned tool weights and re-splits
//!   the budget among active tenants (`allocate`).
//!
//! Tenants: each active tenant's share is its weighted max-min fair part of the budget (a
//! tenant that asks for less than its share keeps what it asks for, the rest is lent to the
//! others, so one tenant alone can use it all), and `min_budget` per second is guaranteed to
//! every tenant even when the global budget is spent: such calls are still charged to the
//! global bucket, so the others feel them.
//!
//! The budget is a facade over parts chained in this order, each ticked in turn by the
//! ticker ([`Budget::spawn_ticker`]): the global budget with its controller (`global.rs`), the
//! tenants' shares (`tenants.rs`, split by `allocate` in `shares.rs`), fixed mode's limits
//! (`fixed.rs`) and the cluster's leases (a gate of [`distributed`](crate::distributed)'s). A
//! call's charges to them are one list (`taking.rs`), taken in order and given back together.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! use stormgate::Call;
//! use stormgate::admit::Admission;
//! use stormgate::budget::{Budget, BudgetConfig};
//! use stormgate::valid::Positive;
//!
//! let mut config = BudgetConfig::default();
//! config.stable_budget = Positive::new(100.0).unwrap();
//! let budget = Budget::builder(config).build();
//! let _ticker = budget.spawn_ticker();
//! assert!(budget.admit(&Call::request("tools/call").with_tool("cache_get")).is_ok());
//! assert_eq!(budget.current(), 100.0);
//! # }
//! ```

mod census;
mod controller;
mod fair;
mod fixed;
mod gcra;
mod global;
mod sampler;
mod shares;
mod taking;
mod tenants;
mod trend;

use crate::valid::Positive;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::time::Instant;

pub use controller::{BudgetConfig, Health};
pub use shares::TenantConfig;
// The controller's pure core, public for tests/budget.rs's scenarios, not an API a service
// builds on: hidden from the docs.
#[doc(hidden)]
pub use controller::{Controller, TickStats};

use crate::admit::{Admission, AdmitLayer};
use crate::call::{Call, Tenant};
use crate::charges::ChargedTo;
use crate::clients::{ClientKeys, Judge};
use crate::cost::{CostConfig, Costs};
use crate::distributed::{LeaseGate, SharedBudget};
use crate::error::ConfigError;
use crate::metrics;
use crate::outcome::{Observation, Observer};
use crate::policy::{Mode, Policy, Switch};
use crate::rejection::{Reason, Rejection, Scope};
use crate::snapshot::{Live, Read};
use arc_swap::ArcSwap;
use fixed::Fixed;
use global::Global;
use taking::{Bucket, Charged, GLOBAL, Ledger, Refusal, TENANT, Taking};
use tenants::{Newcomer, TenantState, Tenants};

/// The shared budget state. A cheap handle: clones share everything.
#[derive(Clone)]
pub struct Budget {
    inner: Arc<Inner>,
}

struct Inner {
    epoch: Instant,
    switch: Switch,
    /// The policy last applied to the buckets (see [`Budget::apply_policy`]).
    applied: ArcSwap<Policy>,
    /// The settings, swapped whole by a reload.
    settings: Live<Settings>,
    global: Global,
    tenants: Tenants,
    fixed: Fixed,
    /// The cluster's leases (inert unless the budget is shared).
    leases: LeaseGate,
    costs: Arc<Costs>,
    /// Who a call's client is, for the census and the fair shares (see
    /// [`BudgetBuilder::sessions`]).
    client_keys: ClientKeys,
    /// Each client's recent demand, for the fair shares inside the shared buckets.
    clients: fair::Clients,
    /// `stormgate_budget_rejected_total` by reason.
    rejected: metrics::RefusalCounts,
}

/// Everything a reload may change.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    config: BudgetConfig,
    tenants: TenantConfig,
    min_budget: f64,
    max_weight: u32,
}

impl Settings {
    fn new(config: BudgetConfig, tenants: TenantConfig, costs: &CostConfig) -> Self {
        Settings {
            min_budget: tenants.min_budget(config.stable_budget.get()),
            max_weight: costs.max_possible_weight(),
            config,
            tenants,
        }
    }
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
    sessions: Option<Arc<dyn Judge>>,
    /// The cluster's leases (set by `shared`, feature `redis`).
    leases: LeaseGate,
}

impl BudgetBuilder {
    /// Shares the global budget and the tenants' shares with the other nodes of a cluster
    /// through Redis (feature `redis`; see [`distributed`](crate::distributed)): in adaptive
    /// mode every call also spends from this node's leases, and the controller's budget is
    /// this node's proposal for the cluster's rate. One `SharedBudget` per `Budget`.
    pub fn shared(mut self, shared: SharedBudget) -> Self {
        self.leases = LeaseGate::of(shared);
        self
    }

    /// The session guard whose clients the controller's health census counts: a session the
    /// MCP server accepted is one client, and the calls on every other id of a tenant are
    /// one more (its unverified pool), so ids a client makes up weigh as one client. Without
    /// it every session id counts as a client. [`Control`](crate::control::Control) sets it.
    pub fn sessions(mut self, sessions: impl Judge) -> Self {
        self.sessions = Some(Arc::new(sessions));
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
        self.costs.validate()?;
        Ok(self.build_unchecked())
    }

    /// Builds; panics on invalid settings (use [`try_build`](Self::try_build) for input).
    pub fn build(self) -> Budget {
        self.try_build().unwrap_or_else(|e| panic!("{e}"))
    }

    fn build_unchecked(self) -> Budget {
        let settings = Settings::new(self.config, self.tenants, &self.costs);
        let burst = settings.config.burst(settings.max_weight) as u64;
        let stable = settings.config.stable_budget;
        let budget = Budget {
            inner: Arc::new(Inner {
                epoch: Instant::now(),
                applied: ArcSwap::new(self.switch.load()),
                switch: self.switch,
                global: Global::new(&settings.config, burst),
                tenants: Tenants::new(stable.get(), self.labels),
                fixed: Fixed::new(stable.get(), burst),
                leases: self.leases,
                costs: Arc::new(Costs::new(self.costs)),
                client_keys: ClientKeys::default(),
                clients: fair::Clients::new(),
                rejected: metrics::RefusalCounts::by_reason(metrics::BUDGET_REJECTED),
                settings: Live::new(settings),
            }),
        };
        if let Some(sessions) = self.sessions {
            budget.inner.client_keys.follow(sessions);
        }
        budget.apply_policy();
        budget.inner.leases.start(stable.get()); // until the first tick
        budget
    }
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
            leases: LeaseGate::default(),
        }
    }

    fn now(&self) -> u64 {
        self.at(Instant::now())
    }

    /// `instant` in the budget's time: nanoseconds since its epoch.
    fn at(&self, instant: Instant) -> u64 {
        crate::stats::ns(instant.saturating_duration_since(self.inner.epoch))
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
        self.inner.global.health()
    }

    /// The tool weight table (give it to [`ClassifyLayer::costs`](crate::classify::ClassifyLayer::costs)).
    pub fn costs(&self) -> Arc<Costs> {
        self.inner.costs.clone()
    }

    /// The gate to the cluster's leases (inert unless the budget is shared).
    pub(crate) fn leases(&self) -> &LeaseGate {
        &self.inner.leases
    }

    /// The cluster's shared budget this budget spends leases of, if any (feature `redis`).
    pub fn shared(&self) -> Option<&SharedBudget> {
        self.inner.leases.shared()
    }

    /// Tenants tracked now.
    pub fn tenant_count(&self) -> usize {
        self.inner.tenants.len()
    }

    /// A tenant's current share of the budget, cost units per second.
    pub fn allocation(&self, tenant: &Tenant) -> Option<f64> {
        self.inner.tenants.allocation(tenant)
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

    /// The tenant's state, tracked from now on if it was not.
    fn tenant(&self, tenant: &Tenant) -> Arc<TenantState> {
        let inner = &*self.inner;
        if let Some(t) = inner.tenants.find(tenant) {
            return t;
        }
        let st = inner.settings.load();
        let new = Newcomer {
            settings: &st,
            fixed_rate: inner.switch.load().fixed.tenant_rate.map(Positive::get),
            now: self.now(),
            clients: &inner.clients,
            leases: &inner.leases,
        };
        inner.tenants.insert(tenant, new)
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
        let burst = settings.config.burst(settings.max_weight) as u64;
        inner.global.reconfigure(config, burst);
        inner.fixed.global.set_burst(burst);
        inner.settings.store(Arc::new(settings));
        inner.costs.reconfigure(costs.clone());
        self.apply_policy();
    }

    /// The settings `call` runs under (its request's snapshot's).
    fn settings_of<'a>(&self, call: &'a Call) -> Read<'a, Settings> {
        self.inner.settings.read(call.snapshot())
    }

    /// The budget's settings `call` runs under.
    #[cfg(test)]
    pub(crate) fn config_of(&self, call: &Call) -> BudgetConfig {
        self.settings_of(call).config.clone()
    }

    /// The budget's settings cell, for a control's snapshots.
    pub(crate) fn cell(&self) -> &Live<Settings> {
        &self.inner.settings
    }

    /// Applies the current policy at once: re-rates the fixed-mode buckets, and pins the global
    /// bucket at the stable budget while `adaptive_budget` is off. The control handle calls it
    /// on every flip; the first call after a flip of a switch set by hand
    /// ([`Switch::set`]) does too.
    pub(crate) fn apply_policy(&self) {
        let inner = &*self.inner;
        let policy = inner.switch.load();
        inner.applied.store(policy.clone());
        let st = inner.settings.load();
        let now = self.now();
        inner
            .fixed
            .apply(now, &policy, st.max_weight, &inner.tenants);
        inner.global.apply(now, &policy, &st.config);
    }

    /// Ends the current tick: smooths it, moves the budget, re-rates the buckets, refreshes
    /// learned weights and re-splits the budget among tenants. [`spawn_ticker`] calls it every
    /// `sample_interval`.
    ///
    /// [`spawn_ticker`]: Budget::spawn_ticker
    pub(crate) fn tick_now(&self) -> Health {
        let inner = &*self.inner;
        let now = self.now();
        let policy = inner.switch.load();
        let st = inner.settings.load();
        // In `local` fallback the node keeps budget / nodes (1 otherwise).
        let divisor = self.leases().divisor();
        let health = inner
            .global
            .tick(now, inner.epoch.elapsed(), &policy, &st.config, divisor);
        let rate = inner.global.rate(&policy, &st.config);
        inner.costs.refresh();
        let mut clients = inner.clients.active(now);
        if st.tenants.enabled {
            inner
                .tenants
                .tick(now, health.budget / divisor, &st, &mut clients);
        } else {
            inner.global.share(rate / divisor, clients.into_values());
        }
        self.leases().tick(rate);
        policy.mode.emit(); // re-sent every tick: the exporter drops gauges left idle
        health
    }

    /// Ticks every `sample_interval` until the last [`Budget`] handle is dropped (or the
    /// returned task is aborted).
    pub fn spawn_ticker(&self) -> tokio::task::JoinHandle<()> {
        let weak: Weak<Inner> = Arc::downgrade(&self.inner);
        let every = self.inner.settings.load().config.sample_interval;
        tokio::spawn(async move {
            let mut interval = tokio::time::interval_at(Instant::now() + every.get(), every.get());
            interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                interval.tick().await;
                let Some(inner) = weak.upgrade() else {
                    return;
                };
                Budget { inner }.tick_now();
            }
        })
    }

    fn reject(&self, refusal: Refusal) -> Rejection {
        let Refusal {
            reason,
            scope,
            wait,
        } = refusal;
        self.inner.rejected.count(reason);
        Rejection::new(reason, scope, Duration::from_nanos(wait))
    }

    /// Where a charge list's scopes are.
    fn ledger(&self) -> Ledger<'_> {
        Ledger {
            fixed: &self.inner.fixed.global,
            global: &self.inner.global.bucket,
            leases: self.leases(),
        }
    }
}

/// What an admitted call was charged, to give back if a later stage refuses it.
#[derive(Debug)]
pub struct BudgetPermit {
    charged: Charged,
    /// The sampler's part that counted the call's cost, which its refund is given back to.
    part: usize,
}

impl Budget {
    /// Adaptive admission: the global bucket, the tenant's share and the cluster's leases,
    /// each spending its reserve only on light clients' calls. The call's charges record its
    /// client and whether it was admitted beyond its fair share (its client asks more than its
    /// fair part, and its tenant is not light among several), for the resources it then waits
    /// for.
    fn admit_adaptive(
        &self,
        call: &Call,
        cost: u64,
        taking: &mut Taking<'_>,
        now: u64,
        (policy, settings): (&Policy, &Settings),
    ) -> Result<(), Refusal> {
        let inner = &*self.inner;
        let leasing = self
            .leases()
            .open(|divisor| inner.global.rerate(now, policy, &settings.config, divisor))
            .map_err(|wait| Refusal {
                reason: Reason::SharedBudgetUnavailable,
                scope: Scope::Global,
                wait,
            })?;
        let (client, allowed) = self.inner.client_keys.allowance(call);
        let ask = (cost as f64, allowed);
        // Past the clients kept, a client is never light and always beyond its share.
        let unknown = fair::Standing {
            light: false,
            beyond: true,
        };
        if !(settings.tenants.enabled && policy.features.tenant_budgets) {
            let standing = inner
                .clients
                .get(client, 0, now)
                .as_ref()
                .map_or(unknown, |u| {
                    fair::Clients::ask(u, now, ask, &inner.global.fair)
                });
            taking.take(Bucket::Global, standing.light, GLOBAL)?;
            taking.leases(leasing, false)?;
            call.charges().set_charged_to(ChargedTo {
                client,
                id: call.session.key(),
                beyond_share: standing.beyond,
            });
            return Ok(());
        }
        let tenant = self.tenant(&call.tenant);
        tenant
            .demand
            .fetch_add(cost, std::sync::atomic::Ordering::Relaxed);
        // Inside its tenant's share a light session may spend the reserve; in the global
        // bucket, a light tenant.
        let session = inner
            .clients
            .get(client, tenant.group, now)
            .as_ref()
            .map_or(unknown, |u| fair::Clients::ask(u, now, ask, &tenant.fair));
        let session_under = session.light;
        let tenant_under = inner.tenants.under(&tenant, session_under);
        // Beyond its share globally: beyond its part of its tenant's share, in a tenant not
        // light among several.
        let beyond_share = session.beyond && !inner.tenants.under(&tenant, false);
        taking.charge_tenant(tenant);
        let refused = match taking
            .take(Bucket::Share, session_under, TENANT)
            .and_then(|()| taking.take(Bucket::Global, tenant_under, GLOBAL))
            .and_then(|()| taking.leases(leasing, true))
        {
            Ok(()) => {
                call.charges().set_charged_to(ChargedTo {
                    client,
                    id: call.session.key(),
                    beyond_share,
                });
                return Ok(());
            }
            Err(refused) => refused,
        };
        // The guaranteed minimum is part of the budget: charged to the global bucket (into
        // debt if need be) and, when the budget is shared, to the cluster's global lease, so
        // the nodes' minimums together never pass the cluster's budget.
        taking
            .take(Bucket::Guaranteed, false, (refused.reason, refused.scope))
            .map_err(|min| Refusal {
                wait: refused.wait.min(min.wait),
                ..refused
            })?;
        taking.leases(leasing, false)?;
        taking.force(Bucket::Global);
        call.charges().set_charged_to(ChargedTo {
            client,
            id: call.session.key(),
            beyond_share: false,
        });
        Ok(())
    }
}

impl Admission for Budget {
    type Permit = BudgetPermit;

    fn admit(&self, call: &Call) -> Result<BudgetPermit, Rejection> {
        self.admit_at(call, Instant::now())
    }

    fn admit_at(&self, call: &Call, now: Instant) -> Result<BudgetPermit, Rejection> {
        if call.target().is_none() {
            // Protocol chatter (initialize, tools/list, ping) is not the work budgets guard,
            // and refusing `initialize` would keep a client from connecting at all.
            return Ok(BudgetPermit {
                charged: Charged::default(),
                part: 0,
            });
        }
        let now = self.at(now);
        let cost = u64::from(call.cost().max(1));
        if !Arc::ptr_eq(&self.inner.switch.peek(), &self.inner.applied.load()) {
            self.apply_policy(); // the switch was flipped by hand
        }
        let policy = self.inner.switch.of(call);
        let settings = self.settings_of(call);
        let mut taking = Taking::new(self.ledger(), now, cost);
        match policy.mode {
            Mode::Off => Ok(()),
            Mode::Fixed => fixed::admit(&mut taking, &policy, || self.tenant(&call.tenant)),
            Mode::Adaptive => {
                self.admit_adaptive(call, cost, &mut taking, now, (&policy, &settings))
            }
        }
        .map_err(|r| self.reject(r))?;
        let charged = taking.commit();
        // Measured in every mode.
        let part = self.inner.global.sampler.admitted(cost);
        if let Some(t) = charged.tenant() {
            t.admitted
                .fetch_add(cost, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(BudgetPermit { charged, part })
    }

    fn refund(&self, mut permit: BudgetPermit) {
        let cost = permit.charged.cost();
        if cost == 0 {
            return; // chatter: nothing was charged or counted
        }
        permit.charged.give_back(self.ledger(), self.now());
        self.inner.global.sampler.refunded(cost, permit.part);
    }
}

impl Budget {
    /// A tool's healthy latency as the controller learned it, in seconds.
    pub fn tool_baseline(&self, tool: &str) -> Option<f64> {
        self.inner.global.sampler.baseline(tool)
    }
}

impl Observer for Budget {
    fn observe(&self, observation: &Observation<'_>) {
        let inner = &*self.inner;
        let now = observation.at.saturating_duration_since(inner.epoch);
        inner.global.sampler.observe(
            observation,
            inner.client_keys.identify(observation.call),
            now,
            &self.settings_of(observation.call).config,
        );
        self.inner.costs.observe(observation);
    }
}
