//! [`SharedBudget`]: one node's view of the cluster's budget: its leases, its connection,
//! its mode (shared or fallback) and the background work that keeps them.

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use tokio::runtime::Handle;
use tokio::sync::Notify;

use super::lease::{Lease, Sizer, Spend, Target, WindowClock};
use super::store::{Combine, LeaseCall, Reply, Store, StoreError};
use super::{DistributedConfig, FailureMode};
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
    /// This node's proposed rate, f64 bits.
    proposal: AtomicU64,
}

impl ScopeLease {
    fn new(tag: &str, combine: Combine, label: &'static str, rate: f64) -> Self {
        ScopeLease {
            lease: Lease::new(),
            sizer: Mutex::new(Sizer::default()),
            window_key: format!("{{{tag}}}:windows"),
            proposals_key: format!("{{{tag}}}:proposals"),
            combine,
            label,
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

    /// Gives back units spent from window `window` (a later stage refused the call).
    pub(crate) fn refund(&self, window: u64, units: u64) {
        self.lease.refund(window, units);
    }
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

/// One node's share of a cluster-wide budget held in Redis (seed 003 sections 3.3 and 5.1).
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

/// Escapes a tenant name for a key's hash tag: `{` and `}` would end the tag early.
fn escape(name: &str) -> String {
    name.replace('%', "%25")
        .replace('{', "%7B")
        .replace('}', "%7D")
}

impl SharedBudget {
    /// A node of the cluster described by `config`: validates it and starts connecting in the
    /// background on the current tokio runtime (an error outside one). It is in
    /// [`SharedMode::Fallback`] until Redis first answers; [`ready`](Self::ready) waits for
    /// that.
    pub fn new(config: DistributedConfig) -> Result<Self, String> {
        config.validate()?;
        let handle = Handle::try_current()
            .map_err(|_| "distributed: must be started inside a tokio runtime".to_owned())?;
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
                    &format!("{prefix}:global"),
                    Combine::Min,
                    "global",
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
        }
    }

    fn now_us(&self) -> u64 {
        u64::try_from(self.inner.epoch.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    /// The global lease.
    pub(crate) fn global(&self) -> &Arc<ScopeLease> {
        &self.inner.global
    }

    /// A new lease for tenant `name`'s share.
    pub(crate) fn tenant(&self, name: &str, rate: f64) -> Arc<ScopeLease> {
        let tag = format!("{}:tenant:{}", self.inner.prefix, escape(name));
        Arc::new(ScopeLease::new(&tag, Combine::Max, "tenant", rate))
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
            f64::from(c.expected_nodes.unwrap_or_else(|| self.nodes()).max(1))
        } else {
            1.0
        }
    }

    /// Whether the mode changed since the last call (the budget then re-rates its buckets).
    pub(crate) fn take_change(&self) -> bool {
        self.inner.changed.swap(false, Ordering::AcqRel)
    }

    /// Spends `cost` units of `scope`'s lease for the current window: `Ok(Some(window))` to
    /// refund into, `Ok(None)` when admitted on credit (claimed from Redis whatever happens
    /// next, so nothing to refund), or `Err(wait_ns)`. Never waits: when the lease runs low,
    /// or the window nears its end, it starts the scope's one request in the background.
    pub(crate) fn spend(&self, scope: &Arc<ScopeLease>, cost: u64) -> Result<Option<u64>, u64> {
        let now = self.now_us();
        let timeout_us = u64::try_from(self.inner.config.timeout.as_micros()).unwrap_or(0);
        let Some(window) = self.inner.clock.index(now) else {
            return Err(timeout_us * 1_000);
        };
        let until_end = self.inner.clock.until_end(window, now);
        let spent = scope.lease.spend(window, cost);
        let margin = timeout_us.min(self.inner.clock.window_us() / 10);
        if let Some(target) = scope.lease.wants(window, until_end, margin) {
            self.request(scope, target, window);
        }
        match spent {
            Spend::Leased => Ok(Some(window)),
            Spend::Credit => Ok(None),
            Spend::Short { exhausted: true } => Err(until_end.max(1) * 1_000),
            Spend::Short { exhausted: false } => Err(until_end.clamp(1, timeout_us) * 1_000),
        }
    }

    fn request(&self, scope: &Arc<ScopeLease>, target: Target, window: u64) {
        if !scope.lease.begin_request() {
            return;
        }
        let this = self.clone();
        let scope = scope.clone();
        self.inner.handle.spawn(async move {
            this.lease(&scope, target, window).await;
            scope.lease.end_request();
        });
    }

    async fn lease(&self, scope: &ScopeLease, target: Target, window: u64) {
        let inner = &*self.inner;
        let sent = self.now_us();
        let debt = scope.lease.take_debt();
        let span = match target {
            Target::Current => inner.clock.until_end(window, sent),
            Target::Next => inner.clock.window_us(),
        };
        let demand = scope.lease.take_demand();
        let want = scope
            .sizer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .size(demand, sent, span, 1)
            + debt;
        inner.lease_requests.fetch_add(1, Ordering::Relaxed);
        ::metrics::counter!(metrics::SHARED_LEASE_REQUESTS, "scope" => scope.label).increment(1);
        if let Some(reply) = self.call(scope, want, target == Target::Next).await {
            let credit = reply.granted.saturating_sub(debt);
            scope.lease.grant(reply.window, credit, reply.exhausted);
            inner.granted.fetch_add(reply.granted, Ordering::Relaxed);
            ::metrics::counter!(metrics::SHARED_GRANTED, "scope" => scope.label)
                .increment(reply.granted);
        }
    }

    /// One script call for `scope`: counts it, learns the clock, the shared rate and the
    /// mode from the answer.
    async fn call(&self, scope: &ScopeLease, want: u64, next: bool) -> Option<Reply> {
        let inner = &*self.inner;
        let c = &inner.config;
        let sent = self.now_us();
        let rate = scope.proposal();
        let call = LeaseCall {
            window_key: &scope.window_key,
            proposals_key: &scope.proposals_key,
            node: &inner.node,
            want,
            rate,
            window_us: inner.clock.window_us(),
            ttl_us: u64::try_from(c.proposal_ttl.as_micros()).unwrap_or(u64::MAX),
            combine: scope.combine,
            next,
        };
        inner.round_trips.fetch_add(1, Ordering::Relaxed);
        match inner.store.lease(&call).await {
            Ok(reply) => {
                inner.clock.observe(sent, reply.redis_us);
                if std::ptr::eq(scope, &*inner.global) {
                    let shared = reply.rate_milli as f64 / 1000.0;
                    inner.rate.store(shared.to_bits(), Ordering::Relaxed);
                    inner.nodes.store(reply.nodes, Ordering::Relaxed);
                    if let Some(rate) = rate {
                        inner.published_at.store(sent, Ordering::Relaxed);
                        inner.published.store(rate.to_bits(), Ordering::Relaxed);
                    }
                    ::metrics::gauge!(metrics::SHARED_RATE).set(shared);
                }
                self.set_mode(SharedMode::Shared);
                Some(reply)
            }
            Err(e) => {
                self.failed(&e);
                None
            }
        }
    }

    fn failed(&self, _error: &StoreError) {
        self.inner.errors.fetch_add(1, Ordering::Relaxed);
        ::metrics::counter!(metrics::SHARED_REDIS_ERRORS).increment(1);
        self.set_mode(SharedMode::Fallback);
        self.inner.down.notify_one();
    }

    fn set_mode(&self, mode: SharedMode) {
        let value = if mode == SharedMode::Shared {
            SHARED
        } else {
            FALLBACK
        };
        if self.inner.mode.swap(value, Ordering::AcqRel) != value {
            self.inner.changed.store(true, Ordering::Release);
            self.emit_mode();
        }
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
            this.call(&this.inner.global, 0, false).await;
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
            Ok(()) => shared.call(&shared.inner.global, 0, false).await.is_some(),
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
