//! The core limiter: per-key FIFO queues, pacing, concurrency, windows, cooldowns.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use crate::snapshot::{Live, Part, Snapshot};
use tokio::time::{Instant, Sleep};

use super::error::AcquireError;
use super::limits::ResourceLimits;
use crate::bounded::{Bounded, OVERFLOW};
use crate::charges::ChargedTo;
use crate::metrics;

/// Default bound on distinct resource keys; past it, new keys share [`OVERFLOW`] (so a flood
/// of new names cannot grow memory).
pub const DEFAULT_MAX_KEYS: usize = 10_000;
/// The one key every tool call without a key of its own shares in the inbound layer, under the
/// default limits (`[fifo.default]`).
pub const DEFAULT_KEY: &str = "~default";
/// The longest key name tracked on its own, bytes: a longer name not configured (a client can
/// name a tool with a megabyte) shares [`OVERFLOW`], so keys hold at most `max_keys` x this
/// many bytes of names.
pub const MAX_KEY_LEN: usize = 128;
/// Cooldown after an upstream 429 that gave no Retry-After.
pub const DEFAULT_COOLDOWN: Duration = Duration::from_secs(1);
/// The hold time assumed for a key's calls before any was measured.
const UNKNOWN_HOLD: Duration = Duration::from_secs(1);
/// Weight of the newest observation in the per-key hold-time average.
const HOLD_ALPHA: f64 = 0.3;

/// A per-resource FIFO limiter: a cheap handle, clones share all state.
///
/// Each key (a rate-limit group, what other limiters call `rateLimitGroup`: any string; several
/// tools or hosts may share one) has its own [`ResourceLimits`], its own FIFO queue and its own
/// cooldown. Keys are independent: there is no global lock, only one short mutex per key.
///
/// * **Order**: waiters are served in FIFO order per key. With `max_concurrent_per_account`,
///   a waiter whose account is full is passed over by waiters of other accounts (FIFO among
///   those that can run); among the waiters of one account the order is strict.
/// * **A full queue refuses the excess**: in the inbound layer, a call within its client's
///   fair share (as the adaptive budget judged it) that finds the queue at its depth takes the
///   place of the newest waiter admitted beyond its share, else of the newest waiter of the
///   client holding the most places if that is at least two more than its own client holds;
///   the waiter is refused `queue_full` as the call would have been. Only when there is no such
///   waiter is the call refused. So clients within their share are not refused because
///   heavier ones, or one client's burst, filled the queue first. Callers of [`acquire`] carry
///   no client: first come, first served.
///
/// [`acquire`]: ResourceLimiter::acquire
/// * **Cancel safety**: dropping an [`Acquire`] future removes the waiter at once and lets the
///   next one be considered; dropping a [`Lease`] (success, error, panic, cancellation) frees
///   its slot and admits the next waiter. No background task is needed: the first waiter that
///   can run sleeps until its pacing, window or cooldown allows it.
/// * **Time** is `tokio::time::Instant`, so everything is exact under paused time.
#[derive(Clone)]
pub struct ResourceLimiter {
    inner: Arc<Inner>,
}

/// What a reload may change.
#[derive(Debug, Clone)]
struct Settings {
    configured: HashMap<String, ResourceLimits>,
    default_limits: ResourceLimits,
    max_keys: usize,
}

struct Inner {
    /// The keys, by a keyed hash of their name.
    keys: Bounded<Arc<Key>>,
    /// The key of names past `max_keys` or longer than [`MAX_KEY_LEN`], made on first use.
    overflow: std::sync::OnceLock<Arc<Key>>,
    settings: Live<Settings>,
    /// Set while the kill switch is off or per-resource limits are switched off: every caller
    /// goes through at once (still counted in flight).
    bypass: Arc<AtomicBool>,
}

impl fmt::Debug for ResourceLimiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResourceLimiter")
            .field("keys", &self.inner.keys.len())
            .field("settings", &self.inner.settings.load())
            .finish()
    }
}

/// Builds a [`ResourceLimiter`].
#[derive(Debug, Clone, Default)]
pub struct ResourceLimiterBuilder {
    configured: HashMap<String, ResourceLimits>,
    default_limits: ResourceLimits,
    max_keys: Option<usize>,
}

impl ResourceLimiterBuilder {
    /// Limits for one key.
    pub fn key(mut self, key: impl Into<String>, limits: ResourceLimits) -> Self {
        self.configured.insert(key.into(), limits);
        self
    }

    /// Limits for keys not configured one by one (default: nothing limited).
    pub fn default_limits(mut self, limits: ResourceLimits) -> Self {
        self.default_limits = limits;
        self
    }

    /// Bound on distinct keys tracked (default [`DEFAULT_MAX_KEYS`]).
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = Some(max_keys);
        self
    }

    /// The limiter.
    pub fn build(self) -> ResourceLimiter {
        ResourceLimiter {
            inner: Arc::new(Inner {
                keys: Bounded::new(),
                overflow: std::sync::OnceLock::new(),
                bypass: Arc::new(AtomicBool::new(false)),
                settings: Live::new(Settings {
                    configured: self.configured,
                    default_limits: self.default_limits,
                    max_keys: self.max_keys.unwrap_or(DEFAULT_MAX_KEYS),
                }),
            }),
        }
    }
}

impl ResourceLimiter {
    /// A builder.
    pub fn builder() -> ResourceLimiterBuilder {
        ResourceLimiterBuilder::default()
    }

    /// The limits `key` runs under.
    pub fn limits(&self, key: &str) -> ResourceLimits {
        let settings = self.inner.settings.load();
        settings
            .configured
            .get(key)
            .copied()
            .unwrap_or(settings.default_limits)
    }

    /// Whether `key` has limits of its own (configured one by one).
    pub fn is_configured(&self, key: &str) -> bool {
        self.is_configured_in(key, None)
    }

    /// [`is_configured`](Self::is_configured) under a request's snapshot.
    pub(crate) fn is_configured_in(&self, key: &str, snapshot: Option<&Snapshot>) -> bool {
        self.inner
            .settings
            .read(snapshot)
            .configured
            .contains_key(key)
    }

    /// Whether keys not configured one by one are limited, under a request's snapshot.
    pub(crate) fn default_limited_in(&self, snapshot: Option<&Snapshot>) -> bool {
        !self
            .inner
            .settings
            .read(snapshot)
            .default_limits
            .is_unlimited()
    }

    /// The limiter's entry in a snapshot taken now.
    pub(crate) fn part(&self) -> Part {
        self.inner.settings.part()
    }

    /// Takes new limits: keys already in use switch to theirs at once (waiters are
    /// reconsidered; their place in the queue, the key's pacing history and cooldown stay).
    pub fn reconfigure(
        &self,
        configured: HashMap<String, ResourceLimits>,
        default_limits: ResourceLimits,
        max_keys: usize,
    ) {
        self.inner.settings.store(Arc::new(Settings {
            configured,
            default_limits,
            max_keys,
        }));
        let now = Instant::now();
        self.each_key(|key| key.set_limits(self.limits(&key.name), now));
    }

    /// Calls `f` on every key made so far, the overflow key included.
    fn each_key(&self, mut f: impl FnMut(&Key)) {
        self.inner.keys.for_each(|key| f(key));
        if let Some(key) = self.inner.overflow.get() {
            f(key);
        }
    }

    /// The key named `name`, if made.
    fn find(&self, name: &str) -> Option<Arc<Key>> {
        match name {
            OVERFLOW => self.inner.overflow.get().cloned(),
            _ => self.inner.keys.get(self.inner.keys.key(name)),
        }
    }

    /// The key named `name`, made if new: past `max_keys`, or longer than [`MAX_KEY_LEN`],
    /// a name not configured shares [`OVERFLOW`]; configured names always have their own.
    fn key(&self, name: &str) -> Arc<Key> {
        let keys = &self.inner.keys;
        let settings = self.inner.settings.load();
        let configured = settings.configured.contains_key(name);
        if name != OVERFLOW && (configured || name.len() <= MAX_KEY_LEN) {
            let cap = if configured {
                usize::MAX
            } else {
                settings.max_keys
            };
            let made = keys.get_or_insert(keys.key(name), cap, || {
                Arc::new(Key::new(name, self.limits(name), self.inner.bypass.clone()))
            });
            if let Some(key) = made {
                return key;
            }
        }
        self.inner
            .overflow
            .get_or_init(|| {
                Arc::new(Key::new(
                    OVERFLOW,
                    self.limits(OVERFLOW),
                    self.inner.bypass.clone(),
                ))
            })
            .clone()
    }

    /// Waits for a place on `key`, in FIFO order. `account` names the caller for
    /// `max_concurrent_per_account`.
    ///
    /// Refused at once with [`AcquireError::QueueFull`] when the queue is at its depth, or
    /// [`AcquireError::UpstreamRateLimited`] when the key is cooling down for longer than the
    /// caller could wait; after `queue_timeout` with [`AcquireError::QueueTimeout`].
    pub fn acquire(&self, key: &str, account: Option<&str>) -> Acquire {
        self.acquire_until(key, account, None)
    }

    /// [`acquire`](Self::acquire) for a call with a whole-round deadline: refused at once
    /// with [`AcquireError::DeadlineExceeded`] when it could not be admitted before it, and
    /// the moment it passes while the call waits.
    pub fn acquire_until(
        &self,
        key: &str,
        account: Option<&str>,
        deadline: Option<Instant>,
    ) -> Acquire {
        let key = self.key(key);
        // The account only matters (and is only copied) where accounts are limited.
        let account = account
            .filter(|_| key.accounts_limited.load(Ordering::Relaxed))
            .map(Arc::from);
        Acquire {
            key,
            account,
            charged_to: None,
            deadline,
            state: AcquireState::Start,
        }
    }

    /// Reports that the upstream behind `key` answered 429: every later admission waits until
    /// the cooldown ends. The cooldown is `retry_after` (1 s when unknown), and never shorter
    /// than the key's pacing; it applies even to keys with no limits configured.
    pub fn report_upstream_rate_limit(&self, key: &str, retry_after: Option<Duration>) {
        let key = self.key(key);
        let now = Instant::now();
        let mut state = key.lock();
        let cooldown = retry_after
            .unwrap_or(DEFAULT_COOLDOWN)
            .max(state.limits.pacing());
        let until = now + cooldown;
        if state.cooldown_until.is_none_or(|c| c < until) {
            state.cooldown_until = Some(until);
        }
        key.pump(&mut state, now);
    }

    /// Lets every caller through at once (`true`: waiting callers are released now) or applies
    /// the limits again (`false`). The kill switch sets it (`Control`'s mode and features).
    pub(crate) fn set_bypass(&self, bypass: bool) {
        if self.inner.bypass.swap(bypass, Ordering::SeqCst) == bypass {
            return;
        }
        let now = Instant::now();
        self.each_key(|key| {
            let mut state = key.lock();
            key.pump(&mut state, now);
        });
    }

    /// Waiters queued on `key` now.
    pub fn queue_depth(&self, key: &str) -> usize {
        self.find(key).map_or(0, |k| k.lock().queue.len())
    }

    /// Calls in flight on `key` now.
    pub fn in_flight(&self, key: &str) -> usize {
        self.find(key).map_or(0, |k| k.lock().in_flight)
    }

    /// Distinct keys tracked, the overflow key included.
    pub fn key_count(&self) -> usize {
        self.inner.keys.len() + usize::from(self.inner.overflow.get().is_some())
    }
}

/// One key's state. Everything mutable is behind one short mutex.
struct Key {
    name: Arc<str>,
    /// Whether the key limits concurrency per account (read without the lock by `acquire`).
    accounts_limited: AtomicBool,
    bypass: Arc<AtomicBool>,
    state: Mutex<KeyState>,
    metrics: KeyMetrics,
}

struct KeyMetrics {
    admitted: ::metrics::Counter,
    queued: ::metrics::Counter,
    rejected_full: ::metrics::Counter,
    rejected_timeout: ::metrics::Counter,
    rejected_cooldown: ::metrics::Counter,
    depth: ::metrics::Gauge,
    wait: ::metrics::Histogram,
}

impl KeyMetrics {
    fn new(key: &str) -> Self {
        let key = key.to_owned();
        let rejected = |reason: &'static str| ::metrics::counter!(metrics::FIFO_REJECTED, "key" => key.clone(), "reason" => reason);
        KeyMetrics {
            admitted: ::metrics::counter!(metrics::FIFO_ADMITTED, "key" => key.clone()),
            queued: ::metrics::counter!(metrics::FIFO_QUEUED, "key" => key.clone()),
            rejected_full: rejected("queue_full"),
            rejected_timeout: rejected("queue_timeout"),
            rejected_cooldown: rejected("upstream_rate_limited"),
            depth: ::metrics::gauge!(metrics::FIFO_QUEUE_DEPTH, "key" => key.clone()),
            wait: ::metrics::histogram!(metrics::FIFO_QUEUE_WAIT, "key" => key),
        }
    }
}

#[derive(Default)]
struct KeyState {
    /// The key's limits; a reload swaps them.
    limits: ResourceLimits,
    in_flight: usize,
    accounts: HashMap<Arc<str>, usize>,
    last_admit: Option<Instant>,
    window: VecDeque<Instant>,
    cooldown_until: Option<Instant>,
    queue: VecDeque<u64>,
    waiters: HashMap<u64, Waiter>,
    next_id: u64,
    hold_avg: Option<Duration>,
    oldest_lease: Option<Instant>,
}

struct Waiter {
    account: Option<Arc<str>>,
    /// Whom the budget charged it to: a caller within its share may take its place.
    charged_to: Option<ChargedTo>,
    /// Its place was taken while it waited: the wait it is refused with.
    evicted: Option<Duration>,
    enqueued: Instant,
    waker: Option<Waker>,
    /// When the pump admitted it; the waiter picks its lease up at its next poll.
    granted: Option<Instant>,
    /// The time this waiter armed its timer for, so the pump does not wake it again for it.
    armed: Option<Instant>,
}

impl Key {
    fn new(name: &str, limits: ResourceLimits, bypass: Arc<AtomicBool>) -> Self {
        Key {
            name: Arc::from(name),
            accounts_limited: AtomicBool::new(limits.max_concurrent_per_account.is_some()),
            bypass,
            state: Mutex::new(KeyState {
                limits,
                ..KeyState::default()
            }),
            metrics: KeyMetrics::new(name),
        }
    }

    fn lock(&self) -> MutexGuard<'_, KeyState> {
        // No user code runs under this lock, so a poisoned lock holds consistent state.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Switches the key to new limits (a reload) and reconsiders its waiters.
    fn set_limits(&self, limits: ResourceLimits, now: Instant) {
        self.accounts_limited.store(
            limits.max_concurrent_per_account.is_some(),
            Ordering::Relaxed,
        );
        let mut state = self.lock();
        state.limits = limits;
        self.pump(&mut state, now);
    }

    fn bypassed(&self) -> bool {
        self.bypass.load(Ordering::Relaxed)
    }

    fn account_has_room(&self, state: &KeyState, account: Option<&Arc<str>>) -> bool {
        if self.bypassed() {
            return true;
        }
        match (state.limits.max_concurrent_per_account, account) {
            (Some(max), Some(a)) => state.accounts.get(a).copied().unwrap_or(0) < max.get(),
            _ => true,
        }
    }

    fn has_capacity(&self, state: &KeyState) -> bool {
        self.bypassed()
            || state
                .limits
                .max_concurrent
                .is_none_or(|max| state.in_flight < max.get())
    }

    /// The earliest instant pacing, the window and the cooldown allow an admission.
    fn ready_at(&self, state: &mut KeyState, now: Instant) -> Instant {
        if self.bypassed() {
            return now;
        }
        let mut at = now;
        let pacing = state.limits.pacing();
        if let Some(last) = state.last_admit.filter(|_| !pacing.is_zero()) {
            at = at.max(last + pacing);
        }
        if let Some(until) = state.cooldown_until {
            at = at.max(until);
        }
        if let Some(window) = state.limits.window {
            // An admission at t counts while now < t + length: the window is (now - length, now].
            while state
                .window
                .front()
                .is_some_and(|&t| t + window.length <= now)
            {
                state.window.pop_front();
            }
            let max = window.max.get() as usize;
            if state.window.len() >= max {
                at = at.max(state.window[state.window.len() - max] + window.length);
            }
        }
        at
    }

    fn admit(&self, state: &mut KeyState, account: Option<&Arc<str>>, now: Instant) {
        state.in_flight += 1;
        if state.in_flight == 1 {
            state.oldest_lease = Some(now);
        }
        if let (Some(_), Some(a)) = (state.limits.max_concurrent_per_account, account) {
            *state.accounts.entry(a.clone()).or_insert(0) += 1;
        }
        state.last_admit = Some(now);
        if state.limits.window.is_some() {
            state.window.push_back(now);
        }
        self.metrics.admitted.increment(1);
    }

    fn release(&self, state: &mut KeyState, account: Option<&Arc<str>>) {
        state.in_flight -= 1;
        if state.in_flight == 0 {
            state.oldest_lease = None;
        }
        if let Some(a) = account
            && let Some(n) = state.accounts.get_mut(a)
        {
            *n -= 1;
            if *n == 0 {
                state.accounts.remove(a);
            }
        }
    }

    /// Admits waiters in FIFO order while they can run; wakes the first one that must wait
    /// for time so it arms its timer. Returns that waiter and the instant it waits for.
    fn pump(&self, state: &mut KeyState, now: Instant) -> Option<(u64, Instant)> {
        loop {
            if !self.has_capacity(state) {
                return None;
            }
            let pos = state
                .queue
                .iter()
                .position(|id| self.account_has_room(state, state.waiters[id].account.as_ref()))?;
            let id = state.queue[pos];
            let at = self.ready_at(state, now);
            if at > now {
                let waiter = state.waiters.get_mut(&id).expect("queued waiters exist");
                if waiter.armed != Some(at)
                    && let Some(w) = &waiter.waker
                {
                    w.wake_by_ref();
                }
                return Some((id, at));
            }
            state.queue.remove(pos);
            let account = state.waiters[&id].account.clone();
            self.admit(state, account.as_ref(), now);
            let waiter = state.waiters.get_mut(&id).expect("queued waiters exist");
            waiter.granted = Some(now);
            self.metrics
                .wait
                .record((now - waiter.enqueued).as_secs_f64());
            if let Some(w) = waiter.waker.take() {
                w.wake();
            }
            self.metrics.depth.set(state.queue.len() as f64);
        }
    }

    /// How long a newcomer at queue position `position` (1 = next) can expect to wait: the
    /// admissions ahead of it times the key's service interval, and at least the cooldown.
    fn estimate_wait(&self, state: &mut KeyState, position: usize, now: Instant) -> Duration {
        let mut interval = state.limits.pacing();
        if let Some(window) = state.limits.window {
            interval = interval.max(window.length / window.max.get());
        }
        if let Some(max) = state.limits.max_concurrent {
            // Calls hold their place about `hold` each (the measured average); `max` run side
            // by side. Before any call finished, the running calls' age is a lower bound,
            // and 1 s the prior while nothing at all was seen.
            let hold = state
                .hold_avg
                .or_else(|| state.oldest_lease.map(|t| (now - t).max(UNKNOWN_HOLD)))
                .unwrap_or(UNKNOWN_HOLD);
            interval = interval.max(hold / max.get() as u32);
        }
        // The first place frees when time allows and, at capacity, when a running call ends.
        let mut first = self.ready_at(state, now) - now;
        if !self.has_capacity(state) {
            first = first.max(interval);
        }
        let wait = first + interval * (position.saturating_sub(1) as u32);
        wait.max(Duration::from_millis(1))
    }
}

/// Future returned by [`ResourceLimiter::acquire`]; resolves to a [`Lease`].
///
/// Dropping it while it waits removes it from the queue at once.
pub struct Acquire {
    key: Arc<Key>,
    account: Option<Arc<str>>,
    /// Whom the budget charged the call to, if it did (see [`Acquire::charged_to`]).
    charged_to: Option<ChargedTo>,
    /// The call's whole-round deadline.
    deadline: Option<Instant>,
    state: AcquireState,
}

enum AcquireState {
    Start,
    Waiting {
        id: u64,
        enqueued: Instant,
        deadline: Option<Pin<Box<Sleep>>>,
        timer: Option<Pin<Box<Sleep>>>,
    },
    Done,
}

impl fmt::Debug for Acquire {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Acquire")
            .field("key", &self.key.name)
            .finish_non_exhaustive()
    }
}

impl Acquire {
    /// Names whom the budget charged the call to: a call within its client's share that
    /// finds the queue full may take the place of a waiter beyond its share, or of the client
    /// holding the most places (the waiter is refused [`AcquireError::QueueFull`]). Without it
    /// (the default) the caller neither takes nor gives a place.
    pub(crate) fn charged_to(mut self, charged_to: Option<ChargedTo>) -> Self {
        self.charged_to = charged_to;
        self
    }

    /// The queued waiter a call finding the queue full replaces, if any (its position): the
    /// newest admitted beyond its share, else the newest of a client holding the most places,
    /// if that is at least two more than the call's own client holds.
    fn replaces(&self, state: &KeyState) -> Option<usize> {
        let me = self.charged_to.filter(|c| !c.beyond_share)?;
        let of = |id: &u64| state.waiters[id].charged_to;
        if let Some(p) = state
            .queue
            .iter()
            .rposition(|id| of(id).is_some_and(|c| c.beyond_share))
        {
            return Some(p);
        }
        let mut places: HashMap<u64, usize> = HashMap::new();
        for c in state.queue.iter().filter_map(of) {
            *places.entry(c.client).or_default() += 1;
        }
        let mine = places.get(&me.client).copied().unwrap_or(0);
        let most = places.values().copied().max()?;
        if most < mine + 2 {
            return None;
        }
        // The newest waiter of any client holding the most.
        state
            .queue
            .iter()
            .rposition(|id| of(id).is_some_and(|c| places[&c.client] == most))
    }

    fn lease(&self, admitted: Instant, queue_wait: Duration) -> Lease {
        Lease {
            key: self.key.clone(),
            account: self.account.clone(),
            admitted,
            queue_wait,
        }
    }

    fn start(&mut self, now: Instant) -> Result<Option<Lease>, AcquireError> {
        let key = self.key.clone();
        let mut state = key.lock();
        if self.deadline.is_some_and(|d| d <= now) && !key.bypassed() {
            let position = state.queue.len() + 1;
            return Err(AcquireError::DeadlineExceeded {
                waited: Duration::ZERO,
                retry_after: key.estimate_wait(&mut state, position, now),
            });
        }
        if state.queue.is_empty()
            && key.has_capacity(&state)
            && key.account_has_room(&state, self.account.as_ref())
            && key.ready_at(&mut state, now) <= now
        {
            key.admit(&mut state, self.account.as_ref(), now);
            key.metrics.wait.record(0.0);
            return Ok(Some(self.lease(now, Duration::ZERO)));
        }
        let limits = state.limits;
        if let Some(until) = state.cooldown_until.filter(|&u| u > now && !key.bypassed()) {
            let cannot_wait = limits.max_queue_depth == Some(0)
                || limits.queue_timeout.is_some_and(|t| now + t < until);
            if cannot_wait {
                key.metrics.rejected_cooldown.increment(1);
                return Err(AcquireError::UpstreamRateLimited {
                    retry_after: until - now,
                });
            }
        }
        // The cooldown first: it is the more precise reason when both apply.
        if let Some(d) = self.deadline.filter(|_| !key.bypassed()) {
            // It would wait in vain: refuse now rather than at the deadline.
            let position = state.queue.len() + 1;
            let wait = key.estimate_wait(&mut state, position, now);
            if now + wait > d {
                return Err(AcquireError::DeadlineExceeded {
                    waited: Duration::ZERO,
                    retry_after: wait,
                });
            }
        }
        if !key.bypassed()
            && limits
                .max_queue_depth
                .is_some_and(|depth| state.queue.len() >= depth)
        {
            // Whoever is refused waits as a newcomer at the back would.
            let position = state.queue.len() + 1;
            let retry_after = key.estimate_wait(&mut state, position, now);
            key.metrics.rejected_full.increment(1);
            let Some(pos) = self.replaces(&state) else {
                return Err(AcquireError::QueueFull {
                    depth: state.queue.len(),
                    retry_after,
                });
            };
            let id = state.queue.remove(pos).expect("a queued position");
            let evicted = state.waiters.get_mut(&id).expect("queued waiters exist");
            evicted.evicted = Some(retry_after);
            if let Some(w) = evicted.waker.take() {
                w.wake();
            }
        }
        let id = state.next_id;
        state.next_id += 1;
        state.queue.push_back(id);
        state.waiters.insert(
            id,
            Waiter {
                account: self.account.clone(),
                charged_to: self.charged_to,
                evicted: None,
                enqueued: now,
                waker: None,
                granted: None,
                armed: None,
            },
        );
        key.metrics.queued.increment(1);
        key.metrics.depth.set(state.queue.len() as f64);
        self.state = AcquireState::Waiting {
            id,
            enqueued: now,
            deadline: match (limits.queue_timeout.map(|t| now + t), self.deadline) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            }
            .map(|at| Box::pin(tokio::time::sleep_until(at))),
            timer: None,
        };
        Ok(None)
    }
}

impl Future for Acquire {
    type Output = Result<Lease, AcquireError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        if let AcquireState::Start = this.state {
            match this.start(Instant::now()) {
                Ok(Some(lease)) => {
                    this.state = AcquireState::Done;
                    return Poll::Ready(Ok(lease));
                }
                Ok(None) => {}
                Err(e) => {
                    this.state = AcquireState::Done;
                    return Poll::Ready(Err(e));
                }
            }
        }
        let key = this.key.clone();
        loop {
            let AcquireState::Waiting {
                id,
                enqueued,
                deadline,
                timer,
            } = &mut this.state
            else {
                panic!("Acquire polled after completion");
            };
            let (id, enqueued) = (*id, *enqueued);
            let now = Instant::now();
            let mut state = key.lock();
            let blocked = key.pump(&mut state, now);
            if let Some(at) = state.waiters[&id].granted {
                state.waiters.remove(&id);
                drop(state);
                this.state = AcquireState::Done;
                return Poll::Ready(Ok(this.lease(at, at - enqueued)));
            }
            if let Some(retry_after) = state.waiters[&id].evicted {
                state.waiters.remove(&id);
                let depth = state.queue.len();
                drop(state);
                this.state = AcquireState::Done;
                return Poll::Ready(Err(AcquireError::QueueFull { depth, retry_after }));
            }
            if deadline.as_mut().is_some_and(|d| d.deadline() <= now) {
                let position = state.queue.iter().position(|&q| q == id).unwrap_or(0) + 1;
                let retry_after = key.estimate_wait(&mut state, position, now);
                state.queue.retain(|&q| q != id);
                state.waiters.remove(&id);
                key.metrics.depth.set(state.queue.len() as f64);
                key.metrics.rejected_timeout.increment(1);
                key.pump(&mut state, now);
                drop(state);
                let waited = now - enqueued;
                let past_deadline = this.deadline.is_some_and(|d| d <= now);
                this.state = AcquireState::Done;
                return Poll::Ready(Err(if past_deadline {
                    AcquireError::DeadlineExceeded {
                        waited,
                        retry_after,
                    }
                } else {
                    AcquireError::QueueTimeout {
                        waited,
                        retry_after,
                    }
                }));
            }
            let waiter = state.waiters.get_mut(&id).expect("waiting waiters exist");
            if waiter
                .waker
                .as_ref()
                .is_none_or(|w| !w.will_wake(cx.waker()))
            {
                waiter.waker = Some(cx.waker().clone());
            }
            match blocked {
                Some((first, at)) if first == id => {
                    waiter.armed = Some(at);
                    match timer {
                        Some(t) => t.as_mut().reset(at),
                        None => *timer = Some(Box::pin(tokio::time::sleep_until(at))),
                    }
                }
                _ => {
                    waiter.armed = None;
                    *timer = None;
                }
            }
            drop(state);
            let timer_fired = timer
                .as_mut()
                .is_some_and(|t| t.as_mut().poll(cx).is_ready());
            let deadline_fired = deadline
                .as_mut()
                .is_some_and(|d| d.as_mut().poll(cx).is_ready());
            if !timer_fired && !deadline_fired {
                return Poll::Pending;
            }
        }
    }
}

impl Drop for Acquire {
    fn drop(&mut self) {
        let AcquireState::Waiting { id, .. } = self.state else {
            return;
        };
        let key = &self.key;
        let mut state = key.lock();
        let Some(waiter) = state.waiters.remove(&id) else {
            return;
        };
        if waiter.granted.is_some() {
            // Admitted but never picked up: give the place back.
            key.release(&mut state, waiter.account.as_ref());
        } else {
            state.queue.retain(|&q| q != id);
            key.metrics.depth.set(state.queue.len() as f64);
        }
        key.pump(&mut state, Instant::now());
    }
}

/// A place on a key. Dropping it (success, error, panic, cancellation) frees the place and
/// admits the next waiter.
pub struct Lease {
    key: Arc<Key>,
    account: Option<Arc<str>>,
    admitted: Instant,
    queue_wait: Duration,
}

impl Lease {
    /// How long the call waited in the queue (an audit's `queueWaitMs`).
    pub fn queue_wait(&self) -> Duration {
        self.queue_wait
    }

    /// The key this lease holds a place on.
    pub fn key(&self) -> &str {
        &self.key.name
    }
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("key", &self.key.name)
            .field("queue_wait", &self.queue_wait)
            .finish_non_exhaustive()
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let now = Instant::now();
        let held = now - self.admitted;
        let mut state = self.key.lock();
        state.hold_avg = Some(match state.hold_avg {
            None => held,
            Some(avg) => avg.mul_f64(1.0 - HOLD_ALPHA) + held.mul_f64(HOLD_ALPHA),
        });
        self.key.release(&mut state, self.account.as_ref());
        self.key.pump(&mut state, now);
    }
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroUsize;
    use std::task::{Context, Poll, Waker};

    use super::*;

    /// One place, a queue of `depth`.
    fn limiter(depth: usize) -> ResourceLimiter {
        let limits = ResourceLimits::default()
            .max_concurrent(NonZeroUsize::MIN)
            .max_queue_depth(depth);
        ResourceLimiter::builder().key("db", limits).build()
    }

    /// A call of `client`, admitted `beyond` its share or not.
    fn call(limiter: &ResourceLimiter, client: u64, beyond_share: bool) -> Acquire {
        limiter.acquire("db", None).charged_to(Some(ChargedTo {
            client,
            beyond_share,
        }))
    }

    /// Polls `acquire` once.
    fn poll(acquire: &mut Acquire) -> Poll<Result<Lease, AcquireError>> {
        Pin::new(acquire).poll(&mut Context::from_waker(Waker::noop()))
    }

    /// Takes the one free place.
    fn take_the_place(limiter: &ResourceLimiter) -> Lease {
        let Poll::Ready(Ok(lease)) = poll(&mut limiter.acquire("db", None)) else {
            panic!("the free place")
        };
        lease
    }

    /// Whether `acquire` is refused for a full queue when polled.
    fn refused(acquire: &mut Acquire) -> bool {
        matches!(
            poll(acquire),
            Poll::Ready(Err(AcquireError::QueueFull { .. }))
        )
    }

    #[test]
    fn a_call_within_its_share_takes_the_place_of_the_newest_excess_waiter() {
        let limiter = limiter(3);
        let lease = take_the_place(&limiter);
        let mut excess: Vec<Acquire> = (0..2).map(|_| call(&limiter, 1, true)).collect();
        let mut fair = call(&limiter, 2, false);
        for a in excess.iter_mut().chain([&mut fair]) {
            assert!(poll(a).is_pending());
        }
        // Full: a call within its share refuses the newest excess waiter, not itself.
        let mut within = call(&limiter, 3, false);
        assert!(poll(&mut within).is_pending());
        assert!(
            refused(&mut excess[1]),
            "the newest excess waiter is refused"
        );
        // Another excess call finds it full and is refused itself.
        assert!(refused(&mut call(&limiter, 1, true)));
        // The next call within its share refuses the other excess waiter; the one after it
        // finds no excess left and every client at one place, and is refused itself; so is
        // a caller the budget did not charge.
        let mut second = call(&limiter, 4, false);
        assert!(poll(&mut second).is_pending());
        assert!(refused(&mut excess[0]));
        assert!(refused(&mut call(&limiter, 5, false)));
        assert!(refused(&mut limiter.acquire("db", None)));
        // The rest run in their order.
        drop(lease);
        for a in [&mut fair, &mut within, &mut second] {
            let Poll::Ready(Ok(lease)) = poll(a) else {
                panic!("admitted in order")
            };
            drop(lease);
        }
        assert_eq!(limiter.queue_depth("db"), 0);
    }

    #[test]
    fn a_call_within_its_share_takes_a_place_of_the_client_holding_the_most() {
        let limiter = limiter(4);
        let _lease = take_the_place(&limiter);
        // One client's burst, within its share, fills the queue.
        let mut burst: Vec<Acquire> = (0..4).map(|_| call(&limiter, 1, false)).collect();
        for a in &mut burst {
            assert!(poll(a).is_pending());
        }
        // Another client takes the burst's newest place; then a third takes the next.
        let mut other = call(&limiter, 2, false);
        assert!(poll(&mut other).is_pending());
        assert!(refused(&mut burst[3]));
        let mut third = call(&limiter, 3, false);
        assert!(poll(&mut third).is_pending());
        assert!(refused(&mut burst[2]));
        // Two places against one: the burst keeps them, and a call of the second client, or
        // of the burst's, is refused itself.
        assert!(refused(&mut call(&limiter, 2, false)));
        assert!(refused(&mut call(&limiter, 1, false)));
        assert!(poll(&mut burst[1]).is_pending());
    }

    #[derive(Debug, Clone)]
    enum Op {
        /// A call of client 0..3 (4: not charged by the budget), beyond its share or not.
        Arrive(u64, bool),
        Release,
        Cancel(usize),
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        // Mostly arrivals, so the queue is often full; few clients, so they hold several
        // places each.
        prop_oneof![
            4 => (0u64..5, proptest::bool::weighted(0.3)).prop_map(|(c, b)| Op::Arrive(c, b)),
            1 => Just(Op::Release),
            1 => (0usize..8).prop_map(Op::Cancel),
        ]
    }

    /// The model's choice of the waiter a call within its share replaces in a full queue:
    /// the newest beyond its share, else the newest of a client with the most places if that
    /// is two more than the caller's.
    fn model_replaces(
        queue: &[(usize, Option<(u64, bool)>)],
        me: Option<(u64, bool)>,
    ) -> Option<usize> {
        let (client, false) = me? else { return None };
        if let Some(p) = queue.iter().rposition(|w| w.1.is_some_and(|c| c.1)) {
            return Some(p);
        }
        let held = |c: u64| {
            queue
                .iter()
                .filter(|w| w.1.is_some_and(|w| w.0 == c))
                .count()
        };
        let most = (0..4).map(held).max()?;
        if most < held(client) + 2 {
            return None;
        }
        queue
            .iter()
            .rposition(|w| w.1.is_some_and(|c| held(c.0) == most))
    }

    proptest::proptest! {
        /// One place and a queue of `depth`, against a naive model: who runs, who waits in
        /// which order, and who is refused.
        #[test]
        fn a_full_queue_refuses_the_excess_as_a_model_does(
            depth in 1usize..6,
            ops in proptest::collection::vec(op(), 1..60),
        ) {
            let limiter = limiter(depth);
            let mut running = None::<usize>;
            let mut queue = Vec::<(usize, Option<(u64, bool)>)>::new();
            let mut refused = Vec::new();
            let mut waiting: Vec<(usize, Acquire)> = Vec::new();
            let mut lease: Option<(usize, Lease)> = None;
            let mut got_refused = Vec::new();
            for (id, op) in ops.into_iter().enumerate() {
                match op {
                    Op::Arrive(client, beyond) => {
                        let me = (client < 4).then_some((client, beyond));
                        let mut acquire = limiter.acquire("db", None);
                        if let Some((client, beyond_share)) = me {
                            acquire = acquire.charged_to(Some(ChargedTo { client, beyond_share }));
                        }
                        if running.is_none() && queue.is_empty() {
                            running = Some(id);
                        } else if queue.len() < depth {
                            queue.push((id, me));
                        } else {
                            match model_replaces(&queue, me) {
                                Some(p) => {
                                    refused.push(queue.remove(p).0);
                                    queue.push((id, me));
                                }
                                None => refused.push(id),
                            }
                        }
                        waiting.push((id, acquire));
                    }
                    Op::Release => {
                        if running.take().is_some() {
                            running = (!queue.is_empty()).then(|| queue.remove(0).0);
                        }
                        lease = None;
                    }
                    Op::Cancel(k) => {
                        if !queue.is_empty() {
                            let k = k % queue.len();
                            let (gone, _) = queue.remove(k);
                            waiting.retain(|(w, _)| *w != gone);
                        }
                    }
                }
                // Every caller polled, oldest first, as their tasks would be; twice, so one
                // refused or admitted by a later caller's first poll sees it.
                for _ in 0..2 {
                    let mut still = Vec::new();
                    for (w, mut a) in waiting {
                        match poll(&mut a) {
                            Poll::Pending => still.push((w, a)),
                            Poll::Ready(Ok(l)) => {
                                proptest::prop_assert!(lease.is_none(), "two running");
                                lease = Some((w, l));
                            }
                            Poll::Ready(Err(_)) => got_refused.push(w),
                        }
                    }
                    waiting = still;
                }
                got_refused.sort_unstable();
                let mut want = refused.clone();
                want.sort_unstable();
                proptest::prop_assert_eq!(&got_refused, &want);
                proptest::prop_assert_eq!(lease.as_ref().map(|l| l.0), running);
                let queued: Vec<usize> = queue.iter().map(|w| w.0).collect();
                let pending: Vec<usize> = waiting.iter().map(|w| w.0).collect();
                proptest::prop_assert_eq!(pending, queued);
            }
        }
    }
}
