//! [`SharedBudget`]: one node's view of the cluster's budget: its leases, its connection,
//! its mode (shared or fallback) and the background work that keeps them.

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use tokio::runtime::Handle;
use tokio::sync::Notify;

use super::lease::{Lease, Sizer, Spend, Target, WindowClock};
use super::store::{Combine, LeaseCall, Reply, ScopeCall, Store, StoreError};
use super::{DistributedConfig, FailureMode};
use crate::error::ControlError;
use crate::metrics;

/// Whether a node is spending shared leases or running in its failure mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SharedMode {
    /// Redis answers: admission spends leases granted by Redis.
    Shared,
    /// Redis did not answer the last call (or has not yet): the configured
    /// [`FailureMode`] applies until a reconnection succeeds.
    Fallback,
}

impl SharedMode {
    /// The `mode` label of `stormgate_shared_mode`.
    pub const fn as_str(self) -> &'static str {
        match self {
            SharedMode::Shared => "shared",
            SharedMode::Fallback => "fallback",
        }
    }
}

/// Counters of one node's dealings with Redis, since it started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SharedStats {
    /// Calls to the lease script (lease requests and proposal refreshes), answered or not:
    /// the node's Redis round trips.
    pub round_trips: u64,
    /// Of those, lease requests.
    pub lease_requests: u64,
    /// Cost units granted by Redis.
    pub granted: u64,
    /// Calls that failed (no connection, timeout, error) and connection attempts that
    /// failed.
    pub errors: u64,
    /// `NOSCRIPT` answers retried as `EVAL`.
    pub noscript: u64,
    /// Calls admitted on credit: the first call of a window the node had no lease for yet
    /// (claimed with the next request; at most one per window and lease).
    pub credits: u64,
}

/// One scope's lease on this node (the global budget, or one tenant's share), with the keys
/// and proposal that go with it.
#[derive(Debug)]
pub(crate) struct ScopeLease {
    lease: Lease,
    sizer: Mutex<Sizer>,
    window_key: String,
    proposals_key: String,
    combine: Combine,
    label: &'static str,
    /// How long a proposal counts, µs.
    ttl_us: u64,
    /// This node's proposed rate, f64 bits.
    proposal: AtomicU64,
}

impl ScopeLease {
    /// A scope whose keys are `<base>:windows` and `<base>:proposals`.
    fn new(base: &str, combine: Combine, label: &'static str, ttl: Duration, rate: f64) -> Self {
        ScopeLease {
            lease: Lease::new(),
            sizer: Mutex::new(Sizer::default()),
            window_key: format!("{base}:windows"),
            proposals_key: format!("{base}:proposals"),
            combine,
            label,
            ttl_us: u64::try_from(ttl.as_micros()).unwrap_or(u64::MAX),
            proposal: AtomicU64::new(rate.to_bits()),
        }
    }

    /// Sets the rate this node proposes for the scope (sent with its next request).
    pub(crate) fn propose(&self, rate: f64) {
        let rate = if rate.is_finite() { rate.max(0.0) } else { 0.0 };
        self.proposal.store(rate.to_bits(), Ordering::Relaxed);
    }

    /// The rate proposed, `None` before the first.
    fn proposal(&self) -> Option<f64> {
        Some(f64::from_bits(self.proposal.load(Ordering::Relaxed))).filter(|r| !r.is_nan())
    }

    /// This scope's part of a lease call, asking for `want` units.
    fn call(&self, want: u64) -> ScopeCall<'_> {
        ScopeCall {
            window_key: &self.window_key,
            proposals_key: &self.proposals_key,
            want,
            rate: self.proposal(),
            combine: self.combine,
            ttl_us: self.ttl_us,
        }
    }
}

/// The windows an admitted call spent its leases from (`None`: nothing to refund: no such
/// lease, or admitted on credit).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Spent {
    global: Option<u64>,
    tenant: Option<u64>,
}

/// Which lease refused a call, and the nanoseconds until it could be admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// The global lease.
    Global(u64),
    /// The tenant's lease.
    Tenant(u64),
}

/// What admission does now.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Gate {
    /// Spend leases.
    Shared,
    /// Local limits only (`open` or `local`).
    Local,
    /// Refuse; retry after this many nanoseconds.
    Closed(u64),
}

/// One node's share of a cluster-wide budget held in Redis.
/// A cheap handle; give it to [`BudgetBuilder::shared`](crate::budget::BudgetBuilder::shared)
/// (one `SharedBudget` per `Budget`). See the [module docs](crate::distributed).
#[derive(Clone)]
pub struct SharedBudget {
    inner: Arc<Inner>,
}

struct Inner {
    config: DistributedConfig,
    node: String,
    prefix: String,
    store: Store,
    clock: WindowClock,
    epoch: Instant,
    handle: Handle,
    global: Arc<ScopeLease>,
    mode: AtomicU8,
    /// Set on each change of mode, cleared by the budget when it re-rates its buckets.
    changed: AtomicBool,
    /// Fresh proposers of the global rate at the last answer.
    nodes: AtomicU32,
    /// The global shared rate at the last answer, f64 bits (NaN before).
    rate: AtomicU64,
    publishing: AtomicBool,
    /// When the global proposal was last sent (µs), and what it was (f64 bits).
    published_at: AtomicU64,
    published: AtomicU64,
    /// When the next reconnection attempt is due (µs).
    next_attempt: AtomicU64,
    down: Arc<Notify>,
    round_trips: AtomicU64,
    lease_requests: AtomicU64,
    granted: AtomicU64,
    errors: AtomicU64,
    credits: AtomicU64,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.down.notify_one(); // lets the reconnection task see that it is alone and stop
    }
}

impl std::fmt::Debug for SharedBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedBudget")
            .field("node", &self.inner.node)
            .field("mode", &self.mode())
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

const SHARED: u8 = 1;
const FALLBACK: u8 = 0;

impl SharedBudget {
    /// A node of the cluster described by `config`: validates it and starts connecting in the
    /// background on the current tokio runtime (an error outside one). It is in
    /// [`SharedMode::Fallback`] until Redis first answers; [`ready`](Self::ready) waits for
    /// that.
    pub fn new(config: DistributedConfig) -> Result<Self, ControlError> {
        config.validate()?;
        let handle = Handle::try_current().map_err(|_| ControlError::NoRuntime("distributed"))?;
        let store = Store::new(&config.url, config.timeout)?;
        let node = config.node_id.clone().unwrap_or_else(|| {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos());
            format!("node-{}-{nanos:08x}", std::process::id())
        });
        let prefix = config.prefix.clone();
        let down = Arc::new(Notify::new());
        let shared = SharedBudget {
            inner: Arc::new(Inner {
                clock: WindowClock::new(config.lease_window),
                global: Arc::new(ScopeLease::new(
                    &format!("{{{prefix}}}:global"),
                    Combine::Min,
                    "global",
                    config.proposal_ttl,
                    f64::NAN, // none until the budget proposes one
                )),
                config,
                node,
                prefix,
                store,
                epoch: Instant::now(),
                handle,
                mode: AtomicU8::new(FALLBACK),
                changed: AtomicBool::new(true),
                nodes: AtomicU32::new(0),
                rate: AtomicU64::new(f64::NAN.to_bits()),
                publishing: AtomicBool::new(false),
                published_at: AtomicU64::new(0),
                published: AtomicU64::new(f64::NAN.to_bits()),
                next_attempt: AtomicU64::new(0),
                down: down.clone(),
                round_trips: AtomicU64::new(0),
                lease_requests: AtomicU64::new(0),
                granted: AtomicU64::new(0),
                errors: AtomicU64::new(0),
                credits: AtomicU64::new(0),
            }),
        };
        shared.emit_mode();
        let weak = Arc::downgrade(&shared.inner);
        shared.inner.handle.spawn(reconnect(weak, down));
        Ok(shared)
    }

    /// Waits until Redis has answered (shared mode), at most `within`; returns whether it did.
    pub async fn ready(&self, within: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        while self.mode() != SharedMode::Shared {
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        true
    }

    /// The settings.
    pub fn config(&self) -> &DistributedConfig {
        &self.inner.config
    }

    /// This node's id among the proposals.
    pub fn node_id(&self) -> &str {
        &self.inner.node
    }

    /// Shared or fallback, now.
    pub fn mode(&self) -> SharedMode {
        if self.inner.mode.load(Ordering::Acquire) == SHARED {
            SharedMode::Shared
        } else {
            SharedMode::Fallback
        }
    }

    /// The cluster's global rate (cost units/s: the minimum of the fresh proposals) at
    /// Redis's last answer, `None` before one.
    pub fn shared_rate(&self) -> Option<f64> {
        Some(f64::from_bits(self.inner.rate.load(Ordering::Relaxed))).filter(|r| !r.is_nan())
    }

    /// Nodes that proposed a global rate within the proposal TTL, at Redis's last answer.
    pub fn nodes(&self) -> u32 {
        self.inner.nodes.load(Ordering::Relaxed)
    }

    /// The counters so far.
    pub fn stats(&self) -> SharedStats {
        let i = &*self.inner;
        SharedStats {
            round_trips: i.round_trips.load(Ordering::Relaxed),
            lease_requests: i.lease_requests.load(Ordering::Relaxed),
            granted: i.granted.load(Ordering::Relaxed),
            errors: i.errors.load(Ordering::Relaxed),
            noscript: i.store.noscript.load(Ordering::Relaxed),
            credits: i.credits.load(Ordering::Relaxed),
        }
    }

    fn now_us(&self) -> u64 {
        u64::try_from(self.inner.epoch.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    /// The global lease.
    pub(crate) fn global(&self) -> &Arc<ScopeLease> {
        &self.inner.global
    }

    /// A new lease for tenant `name`'s share. Its keys carry the cluster's hash tag (the
    /// name follows it, so braces in it do not matter): one script call can serve the
    /// global lease and the tenant's at once, on one Redis Cluster slot.
    pub(crate) fn tenant(&self, name: &str, rate: f64) -> Arc<ScopeLease> {
        let base = format!("{{{}}}:tenant:{name}", self.inner.prefix);
        let c = &self.inner.config;
        // A tenant's proposal is refreshed only with its requests (at least one per window
        // while it is busy), not by the tick: it counts for two windows at least.
        let ttl = c.proposal_ttl.max(c.lease_window * 2);
        Arc::new(ScopeLease::new(&base, Combine::Max, "tenant", ttl, rate))
    }

    /// What admission does now.
    pub(crate) fn gate(&self) -> Gate {
        if self.mode() == SharedMode::Shared {
            return Gate::Shared;
        }
        match self.inner.config.on_failure {
            FailureMode::Open | FailureMode::Local => Gate::Local,
            FailureMode::Closed => {
                let due = self.inner.next_attempt.load(Ordering::Relaxed);
                let wait_us = due.saturating_sub(self.now_us()).max(1_000);
                Gate::Closed(wait_us.saturating_mul(1_000))
            }
        }
    }

    /// What the local buckets' rates are divided by now: `expected_nodes` (or the nodes seen
    /// last) in `local` fallback, else 1.
    pub(crate) fn divisor(&self) -> f64 {
        let c = &self.inner.config;
        if self.mode() == SharedMode::Fallback && c.on_failure == FailureMode::Local {
            f64::from(
                c.expected_nodes
                    .map_or_else(|| self.nodes().max(1), NonZeroU32::get),
            )
        } else {
            1.0
        }
    }

    /// Whether the mode changed since the last call (the budget then re-rates its buckets).
    pub(crate) fn take_change(&self) -> bool {
        self.inner.changed.swap(false, Ordering::AcqRel)
    }

    /// Spends `cost` units from the global lease, then from `tenant`'s, for the current
    /// window. Never waits: when a lease runs low, or the window nears its end, one request in
    /// the background asks for both (each scope at most one request in flight). On a refusal
    /// nothing stays spent.
    pub(crate) fn spend(
        &self,
        tenant: Option<&Arc<ScopeLease>>,
        cost: u64,
    ) -> Result<Spent, Refused> {
        let now = self.now_us();
        let timeout_us = u64::try_from(self.inner.config.timeout.as_micros()).unwrap_or(0);
        let Some(window) = self.inner.clock.index(now) else {
            return Err(Refused::Global(timeout_us * 1_000));
        };
        let until_end = self.inner.clock.until_end(window, now);
        let wait = |short: Spend| match short {
            Spend::Short { exhausted: true } => until_end.max(1) * 1_000,
            _ => until_end.clamp(1, timeout_us) * 1_000,
        };
        let global = &self.inner.global;
        let result = match global.lease.spend(window, cost) {
            s @ Spend::Short { .. } => {
                // The tenant's lease is sized from its demand too, refused here or not.
                if let Some(t) = tenant {
                    t.lease.note_demand(cost);
                }
                Err(Refused::Global(wait(s)))
            }
            g => {
                let global_window = (g == Spend::Leased).then_some(window);
                match tenant.map(|t| t.lease.spend(window, cost)) {
                    Some(s @ Spend::Short { .. }) => {
                        if let Some(w) = global_window {
                            global.lease.refund(w, cost);
                        }
                        Err(Refused::Tenant(wait(s)))
                    }
                    t => Ok(Spent {
                        global: global_window,
                        tenant: (t == Some(Spend::Leased)).then_some(window),
                    }),
                }
            }
        };
        if let Ok(spent) = result {
            let credits = u64::from(spent.global.is_none())
                + u64::from(tenant.is_some() && spent.tenant.is_none());
            if credits > 0 {
                self.inner.credits.fetch_add(credits, Ordering::Relaxed);
            }
        }
        self.refill(tenant, window, until_end);
        result
    }

    /// Gives back what [`spend`](Self::spend) took (a later stage refused the call); lost for
    /// a window that has ended, and nothing for a call admitted on credit.
    pub(crate) fn refund(&self, tenant: Option<&ScopeLease>, spent: Spent, cost: u64) {
        if let Some(window) = spent.global {
            self.inner.global.lease.refund(window, cost);
        }
        if let (Some(window), Some(t)) = (spent.tenant, tenant) {
            t.lease.refund(window, cost);
        }
    }

    /// Sends one request for every scope that wants more, plus the other scope when it would
    /// soon (below half its last grant): one round trip serves both.
    fn refill(&self, tenant: Option<&Arc<ScopeLease>>, window: u64, until_end: u64) {
        let timeout_us = u64::try_from(self.inner.config.timeout.as_micros()).unwrap_or(0);
        let margin = timeout_us.min(self.inner.clock.window_us() / 10);
        let global = &self.inner.global;
        let wants_global = global.lease.wants(window, until_end, margin);
        let wants_tenant = tenant.and_then(|t| t.lease.wants(window, until_end, margin));
        let Some(target) = wants_global.or(wants_tenant) else {
            return;
        };
        let mut scopes = Vec::with_capacity(2);
        let mut add = |scope: &Arc<ScopeLease>, wants: bool| {
            if (wants || scope.lease.could_use(window, target)) && scope.lease.begin_request() {
                scopes.push(scope.clone());
            }
        };
        add(global, wants_global.is_some());
        if let Some(t) = tenant {
            add(t, wants_tenant.is_some());
        }
        if scopes.is_empty() {
            return;
        }
        let this = self.clone();
        self.inner.handle.spawn(async move {
            this.lease(&scopes, target, window).await;
            for scope in &scopes {
                scope.lease.end_request();
            }
        });
    }

    async fn lease(&self, scopes: &[Arc<ScopeLease>], target: Target, window: u64) {
        let inner = &*self.inner;
        let sent = self.now_us();
        let span = match target {
            Target::Current => inner.clock.until_end(window, sent),
            Target::Next => inner.clock.window_us(),
        };
        let mut debts = Vec::with_capacity(scopes.len());
        let mut calls = Vec::with_capacity(scopes.len());
        for scope in scopes {
            let debt = scope.lease.take_debt();
            let demand = scope.lease.take_demand();
            let want = scope
                .sizer
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .size(demand, sent, span, 1)
                + debt;
            debts.push(debt);
            calls.push(scope.call(want));
            ::metrics::counter!(metrics::SHARED_LEASE_REQUESTS, "scope" => scope.label)
                .increment(1);
        }
        inner.lease_requests.fetch_add(1, Ordering::Relaxed);
        let Some(reply) = self.call(calls, target == Target::Next).await else {
            return;
        };
        for ((scope, grant), debt) in scopes.iter().zip(&reply.grants).zip(debts) {
            scope.lease.grant(
                reply.window,
                grant.granted.saturating_sub(debt),
                grant.exhausted,
            );
            inner.granted.fetch_add(grant.granted, Ordering::Relaxed);
            ::metrics::counter!(metrics::SHARED_GRANTED, "scope" => scope.label)
                .increment(grant.granted);
        }
    }

    /// One script call: counts it, learns the clock, the shared rate and the mode from the
    /// answer. The global scope, when present, comes first.
    async fn call(&self, scopes: Vec<ScopeCall<'_>>, next: bool) -> Option<Reply> {
        let inner = &*self.inner;
        let sent = self.now_us();
        let global = scopes
            .first()
            .filter(|s| std::ptr::eq(s.window_key, inner.global.window_key.as_str()))
            .map(|s| s.rate);
        let call = LeaseCall {
            node: &inner.node,
            window_us: inner.clock.window_us(),
            next,
            scopes,
        };
        inner.round_trips.fetch_add(1, Ordering::Relaxed);
        match inner.store.lease(&call).await {
            Ok(reply) => {
                inner.clock.observe(sent, reply.redis_us);
                if let (Some(proposed), Some(grant)) = (global, reply.grants.first()) {
                    let shared = grant.rate_milli as f64 / 1000.0;
                    inner.rate.store(shared.to_bits(), Ordering::Relaxed);
                    inner.nodes.store(grant.nodes, Ordering::Relaxed);
                    if let Some(rate) = proposed {
                        inner.published_at.store(sent, Ordering::Relaxed);
                        inner.published.store(rate.to_bits(), Ordering::Relaxed);
                    }
                    ::metrics::gauge!(metrics::SHARED_RATE).set(shared);
                }
                if self.set_mode(SharedMode::Shared) {
                    tracing::info!(node = %inner.node, "shared budget: Redis answers, budgets shared across nodes");
                }
                Some(reply)
            }
            Err(e) => {
                self.failed(&e);
                None
            }
        }
    }

    /// Sends the global proposal alone (asking for nothing); whether Redis answered.
    async fn publish_now(&self) -> bool {
        let global = &self.inner.global;
        self.call(vec![global.call(0)], false).await.is_some()
    }

    fn failed(&self, error: &StoreError) {
        self.inner.errors.fetch_add(1, Ordering::Relaxed);
        ::metrics::counter!(metrics::SHARED_REDIS_ERRORS).increment(1);
        if self.set_mode(SharedMode::Fallback) {
            tracing::warn!(
                node = %self.inner.node,
                %error,
                on_failure = self.inner.config.on_failure.as_str(),
                "shared budget: Redis unreachable, falling back"
            );
        }
        self.inner.down.notify_one();
    }

    /// Sets the mode; whether it changed.
    fn set_mode(&self, mode: SharedMode) -> bool {
        let value = if mode == SharedMode::Shared {
            SHARED
        } else {
            FALLBACK
        };
        let changed = self.inner.mode.swap(value, Ordering::AcqRel) != value;
        if changed {
            self.inner.changed.store(true, Ordering::Release);
            self.emit_mode();
        }
        changed
    }

    /// Sets the `stormgate_shared_mode` gauges (also re-sent on every budget tick).
    pub(crate) fn emit_mode(&self) {
        let now = self.mode();
        for mode in [SharedMode::Shared, SharedMode::Fallback] {
            ::metrics::gauge!(metrics::SHARED_MODE, "mode" => mode.as_str()).set(if mode == now {
                1.0
            } else {
                0.0
            });
        }
    }

    /// The budget's tick: records `rate` as this node's global proposal, and sends it at once
    /// when it is a decrease from the last one sent, or when the last one sent is 3/4 of the
    /// proposal TTL old (so it never lapses while this node runs).
    pub(crate) fn tick(&self, rate: f64) {
        let inner = &*self.inner;
        inner.global.propose(rate);
        self.emit_mode();
        if self.mode() != SharedMode::Shared {
            return; // the reconnection loop publishes once Redis answers
        }
        let last = f64::from_bits(inner.published.load(Ordering::Relaxed));
        let age = self
            .now_us()
            .saturating_sub(inner.published_at.load(Ordering::Relaxed));
        let ttl = u64::try_from(inner.config.proposal_ttl.as_micros()).unwrap_or(u64::MAX);
        if rate < last || last.is_nan() || age >= ttl / 4 * 3 {
            self.publish();
        }
    }

    fn publish(&self) {
        if self.inner.publishing.swap(true, Ordering::AcqRel) {
            return;
        }
        let this = self.clone();
        self.inner.handle.spawn(async move {
            this.publish_now().await;
            this.inner.publishing.store(false, Ordering::Release);
        });
    }
}

/// Keeps a connection: waits until a call fails (or there is no connection), then tries
/// again 25 ms, 50 ms, 100 ms, ... apart (at most `max_backoff`), each attempt a connection
/// plus one proposal (so the clock and the shared rate are known before the first lease).
/// Ends when the last [`SharedBudget`] handle is dropped.
async fn reconnect(weak: Weak<Inner>, down: Arc<Notify>) {
    let mut attempt: u32 = 0;
    loop {
        let Some(inner) = weak.upgrade() else {
            return;
        };
        let shared = SharedBudget { inner };
        if shared.inner.store.connected() && shared.mode() == SharedMode::Shared {
            drop(shared);
            down.notified().await;
            attempt = 0;
            continue;
        }
        let ok = match shared.inner.store.connect().await {
            Ok(()) => shared.publish_now().await,
            Err(e) => {
                shared.failed(&e);
                false
            }
        };
        if ok {
            attempt = 0;
            continue;
        }
        let delay =
            Duration::from_millis(25u64 << attempt.min(16)).min(shared.inner.config.max_backoff);
        attempt += 1;
        let due = shared.now_us() + u64::try_from(delay.as_micros()).unwrap_or(u64::MAX);
        shared.inner.next_attempt.store(due, Ordering::Relaxed);
        drop(shared);
        tokio::time::sleep(delay).await;
    }
}
