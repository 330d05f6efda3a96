//! The FIFO limiter: its keys by name, their settings and reloads, the kill switch's bypass.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::snapshot::{Live, Snapshot};
use tokio::time::Instant;

use super::acquire::Acquire;
#[cfg(doc)]
use super::acquire::Lease;
#[cfg(doc)]
use super::error::AcquireError;
use super::key::Key;
use super::limits::ResourceLimits;
use crate::bounded::{Bounded, OVERFLOW};
use crate::call::Name;
use crate::named::NameMap;

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
///   client holding the most places (running calls and waiters) if that is at least two more
///   than its own client holds; any call, of the newest waiter of its own client's id holding
///   the most if that is at least two more than its own id holds (the ids of a tenant's
///   unverified pool are one client); the waiter is refused `queue_full` as the call would
///   have been. Only when there is no such waiter is the call refused. So clients within their
///   share are not refused because heavier ones, or one client's burst, filled the queue
///   first. Callers of [`acquire`] carry no client: first come, first served.
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
pub(crate) struct Settings {
    configured: NameMap<ResourceLimits>,
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
                    configured: self.configured.into_iter().collect(),
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
            .get_str(key)
            .copied()
            .unwrap_or(settings.default_limits)
    }

    /// Whether `key` has limits of its own (configured one by one).
    pub fn is_configured(&self, key: &str) -> bool {
        self.is_configured_in(&Name::new(key), None)
    }

    /// [`is_configured`](Self::is_configured) under a request's snapshot, by the name's key.
    pub(crate) fn is_configured_in(&self, key: &Name, snapshot: Option<&Snapshot>) -> bool {
        self.inner
            .settings
            .read(snapshot)
            .configured
            .get(key)
            .is_some()
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

    /// The limiter's settings cell, for a control's snapshots.
    pub(crate) fn cell(&self) -> &Live<Settings> {
        &self.inner.settings
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
            configured: configured.into_iter().collect(),
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
    fn key(&self, name: &Name) -> Arc<Key> {
        let keys = &self.inner.keys;
        let settings = self.inner.settings.peek();
        let configured = settings.configured.get(name).is_some();
        if name.as_str() != OVERFLOW && (configured || name.len() <= MAX_KEY_LEN) {
            let cap = if configured {
                usize::MAX
            } else {
                settings.max_keys
            };
            let made = keys.get_or_insert(name.key(), cap, || {
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
        self.acquire_named(&Name::new(key), account, deadline)
    }

    /// [`acquire_until`](Self::acquire_until) of a key named by a [`Name`]: found by its key.
    pub(crate) fn acquire_named(
        &self,
        key: &Name,
        account: Option<&str>,
        deadline: Option<Instant>,
    ) -> Acquire {
        let key = self.key(key);
        // The account only matters (and is only copied) where accounts are limited.
        let account = account
            .filter(|_| key.accounts_limited.load(Ordering::Relaxed))
            .map(Arc::from);
        Acquire::new(key, account, deadline)
    }

    /// Reports that the upstream behind `key` answered 429: every later admission waits until
    /// the cooldown ends. The cooldown is `retry_after` (1 s when unknown), and never shorter
    /// than the key's pacing; it applies even to keys with no limits configured.
    pub fn report_upstream_rate_limit(&self, key: &str, retry_after: Option<Duration>) {
        let key = self.key(&Name::new(key));
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

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::num::NonZeroUsize;
    use std::pin::Pin;
    use std::task::{Context, Poll, Waker};

    use super::super::acquire::Lease;
    use super::super::error::AcquireError;
    use super::*;
    use crate::charges::ChargedTo;

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
            id: client,
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

    /// Charged to `client`, on its id `id`, beyond its share.
    fn of_pool(limiter: &ResourceLimiter, client: u64, id: u64) -> Acquire {
        let charged = ChargedTo {
            client,
            id,
            beyond_share: true,
        };
        limiter.acquire("db", None).charged_to(Some(charged))
    }

    /// A client's running call holds a place as its waiters do: a client running one call
    /// and waiting with another holds two, and a call within its share takes its waiter's
    /// place (one waiter each, as the queue alone counts, and it was refused itself).
    #[test]
    fn a_running_call_counts_among_its_clients_places() {
        let limiter = limiter(2);
        let Poll::Ready(Ok(_lease)) = poll(&mut call(&limiter, 1, false)) else {
            panic!("the free place")
        };
        let mut waiter = call(&limiter, 1, false);
        let mut other = call(&limiter, 2, false);
        assert!(poll(&mut waiter).is_pending() && poll(&mut other).is_pending());
        let mut third = call(&limiter, 3, false);
        assert!(poll(&mut third).is_pending());
        assert!(refused(&mut waiter), "the client holding two gives one up");
        assert!(poll(&mut other).is_pending());
    }

    /// Ids the budget charges to one client (a tenant's unverified pool): a call of an id
    /// holding nothing takes the newest place of the id holding the most, running or waiting,
    /// whatever its share (the client holds as many places as before); an id holding one less
    /// than two below the most is refused itself.
    #[test]
    fn a_call_takes_the_place_of_its_clients_id_holding_the_most() {
        let limiter = limiter(2);
        let Poll::Ready(Ok(_lease)) = poll(&mut of_pool(&limiter, 9, 1)) else {
            panic!("the free place")
        };
        let mut second = of_pool(&limiter, 9, 1);
        let mut other = of_pool(&limiter, 9, 2);
        assert!(poll(&mut second).is_pending() && poll(&mut other).is_pending());
        let mut newcomer = of_pool(&limiter, 9, 3);
        assert!(poll(&mut newcomer).is_pending());
        assert!(refused(&mut second), "id 1 held two places");
        // Ids 1, 2 and 3 hold one each: id 4 is refused itself, and so is a call of another
        // client beyond its share.
        assert!(refused(&mut of_pool(&limiter, 9, 4)));
        assert!(refused(&mut of_pool(&limiter, 8, 4)));
        assert!(poll(&mut other).is_pending() && poll(&mut newcomer).is_pending());
    }

    #[derive(Debug, Clone)]
    enum Op {
        /// A call of client 0..3 (4: not charged by the budget) on its id 0 or 1, beyond its
        /// share or not.
        Arrive(u64, u64, bool),
        Release,
        Cancel(usize),
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        // Mostly arrivals, so the queue is often full; few clients, so they hold several
        // places each.
        prop_oneof![
            4 => (0u64..5, 0u64..2, proptest::bool::weighted(0.3))
                .prop_map(|(c, i, b)| Op::Arrive(c, i, b)),
            1 => Just(Op::Release),
            1 => (0usize..8).prop_map(Op::Cancel),
        ]
    }

    /// A call as the model sees it: its client, its id and whether it is beyond its share.
    type Charged = Option<(u64, u64, bool)>;

    /// The model's choice of the waiter a call replaces in a full queue, counting the running
    /// call's place and the waiters': for a call within its share, the newest beyond its
    /// share, else the newest of a client with the most places if that is two more than the
    /// caller's client; else the newest of the id of its own client with the most places if
    /// that is two more than the caller's id.
    fn model_replaces(queue: &[(usize, Charged)], running: Charged, me: Charged) -> Option<usize> {
        let (client, id, beyond) = me?;
        let holders = || queue.iter().map(|w| w.1).chain([running]).flatten();
        let held = |c: u64| holders().filter(|h| h.0 == c).count();
        let held_id = |c: u64, i: u64| holders().filter(|h| (h.0, h.1) == (c, i)).count();
        if !beyond {
            if let Some(p) = queue.iter().rposition(|w| w.1.is_some_and(|c| c.2)) {
                return Some(p);
            }
            let most = queue.iter().filter_map(|w| w.1).map(|c| held(c.0)).max();
            if let Some(most) = most.filter(|&m| m >= held(client) + 2) {
                return queue
                    .iter()
                    .rposition(|w| w.1.is_some_and(|c| held(c.0) == most));
            }
        }
        let ours = |w: &(usize, Charged)| w.1.filter(|c| c.0 == client);
        let most = queue
            .iter()
            .filter_map(ours)
            .map(|c| held_id(c.0, c.1))
            .max()?;
        if most < held_id(client, id) + 2 {
            return None;
        }
        queue
            .iter()
            .rposition(|w| ours(w).is_some_and(|c| held_id(c.0, c.1) == most))
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
            let mut running = None::<(usize, Charged)>;
            let mut queue = Vec::<(usize, Charged)>::new();
            let mut refused = Vec::new();
            let mut waiting: Vec<(usize, Acquire)> = Vec::new();
            let mut lease: Option<(usize, Lease)> = None;
            let mut got_refused = Vec::new();
            for (id, op) in ops.into_iter().enumerate() {
                match op {
                    Op::Arrive(client, caller, beyond) => {
                        let me = (client < 4).then_some((client, caller, beyond));
                        let mut acquire = limiter.acquire("db", None);
                        if let Some((client, id, beyond_share)) = me {
                            let charged = ChargedTo { client, id, beyond_share };
                            acquire = acquire.charged_to(Some(charged));
                        }
                        if running.is_none() && queue.is_empty() {
                            running = Some((id, me));
                        } else if queue.len() < depth {
                            queue.push((id, me));
                        } else {
                            match model_replaces(&queue, running.and_then(|r| r.1), me) {
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
                            running = (!queue.is_empty()).then(|| queue.remove(0));
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
                proptest::prop_assert_eq!(lease.as_ref().map(|l| l.0), running.map(|r| r.0));
                let queued: Vec<usize> = queue.iter().map(|w| w.0).collect();
                let pending: Vec<usize> = waiting.iter().map(|w| w.0).collect();
                proptest::prop_assert_eq!(pending, queued);
            }
        }
    }
}
