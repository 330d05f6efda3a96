//! One key of the FIFO limiter: its limits, queue, waiters, pacing, window and cooldown,
//! behind one short mutex, and the pump that admits its waiters in order.

use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasherDefault;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Waker;
use std::time::Duration;

use tokio::time::Instant;

use super::limits::ResourceLimits;
use crate::bounded::PassThrough;
use crate::charges::ChargedTo;
use crate::metrics;

/// The hold time assumed for a key's calls before any was measured.
const UNKNOWN_HOLD: Duration = Duration::from_secs(1);
/// Weight of the newest observation in the per-key hold-time average.
const HOLD_ALPHA: f64 = 0.3;

/// One key's state. Everything mutable is behind one short mutex.
pub(super) struct Key {
    pub(super) name: Arc<str>,
    /// Whether the key limits concurrency per account (read without the lock by `acquire`).
    pub(super) accounts_limited: AtomicBool,
    bypass: Arc<AtomicBool>,
    state: Mutex<KeyState>,
    pub(super) metrics: KeyMetrics,
}

pub(super) struct KeyMetrics {
    pub(super) admitted: ::metrics::Counter,
    pub(super) queued: ::metrics::Counter,
    pub(super) rejected_full: ::metrics::Counter,
    pub(super) rejected_timeout: ::metrics::Counter,
    pub(super) rejected_cooldown: ::metrics::Counter,
    pub(super) depth: ::metrics::Gauge,
    pub(super) wait: ::metrics::Histogram,
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
pub(super) struct KeyState {
    /// The key's limits; a reload swaps them.
    pub(super) limits: ResourceLimits,
    pub(super) in_flight: usize,
    pub(super) accounts: HashMap<Arc<str>, usize>,
    pub(super) last_admit: Option<Instant>,
    pub(super) window: VecDeque<Instant>,
    pub(super) cooldown_until: Option<Instant>,
    pub(super) queue: VecDeque<u64>,
    pub(super) waiters: HashMap<u64, Waiter>,
    /// The running calls of each caller the budget charged ([`Holder`]), while the queue's
    /// depth is limited: with the waiters, the places each holds when the queue is full.
    pub(super) running: ByHolder,
    pub(super) next_id: u64,
    pub(super) hold_avg: Option<Duration>,
    pub(super) oldest_lease: Option<Instant>,
}

/// Who holds a place, as a full queue tells callers apart: the client the budget charged the
/// call to, and the id it came on.
pub(super) type Holder = (u64, u64);

/// Counts per holder (or per client), hashed as they come: their keys are keyed hashes.
pub(super) type ByHolder<K = Holder> = HashMap<K, usize, BuildHasherDefault<PassThrough>>;

/// The holder of a call the budget charged.
pub(super) fn holder(charged_to: Option<ChargedTo>) -> Option<Holder> {
    charged_to.map(|c| (c.client, c.id))
}

pub(super) struct Waiter {
    pub(super) account: Option<Arc<str>>,
    /// Whom the budget charged it to: a caller within its share may take its place.
    pub(super) charged_to: Option<ChargedTo>,
    /// Its place was taken while it waited: the wait it is refused with.
    pub(super) evicted: Option<Duration>,
    pub(super) enqueued: Instant,
    pub(super) waker: Option<Waker>,
    /// When the pump admitted it; the waiter picks its lease up at its next poll.
    pub(super) granted: Option<Instant>,
    /// The time this waiter armed its timer for, so the pump does not wake it again for it.
    pub(super) armed: Option<Instant>,
}

impl Key {
    pub(super) fn new(name: &str, limits: ResourceLimits, bypass: Arc<AtomicBool>) -> Self {
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

    pub(super) fn lock(&self) -> MutexGuard<'_, KeyState> {
        // No user code runs under this lock, so a poisoned lock holds consistent state.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Switches the key to new limits (a reload) and reconsiders its waiters.
    pub(super) fn set_limits(&self, limits: ResourceLimits, now: Instant) {
        self.accounts_limited.store(
            limits.max_concurrent_per_account.is_some(),
            Ordering::Relaxed,
        );
        let mut state = self.lock();
        state.limits = limits;
        self.pump(&mut state, now);
    }

    pub(super) fn bypassed(&self) -> bool {
        self.bypass.load(Ordering::Relaxed)
    }

    pub(super) fn account_has_room(&self, state: &KeyState, account: Option<&Arc<str>>) -> bool {
        if self.bypassed() {
            return true;
        }
        match (state.limits.max_concurrent_per_account, account) {
            (Some(max), Some(a)) => state.accounts.get(a).copied().unwrap_or(0) < max.get(),
            _ => true,
        }
    }

    pub(super) fn has_capacity(&self, state: &KeyState) -> bool {
        self.bypassed()
            || state
                .limits
                .max_concurrent
                .is_none_or(|max| state.in_flight < max.get())
    }

    /// The earliest instant pacing, the window and the cooldown allow an admission.
    pub(super) fn ready_at(&self, state: &mut KeyState, now: Instant) -> Instant {
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
                .is_some_and(|&t| t + window.length.get() <= now)
            {
                state.window.pop_front();
            }
            let max = window.max.get() as usize;
            if state.window.len() >= max {
                at = at.max(state.window[state.window.len() - max] + window.length.get());
            }
        }
        at
    }

    pub(super) fn admit(
        &self,
        state: &mut KeyState,
        (account, holder): (Option<&Arc<str>>, Option<Holder>),
        now: Instant,
    ) {
        state.in_flight += 1;
        if let Some(h) = holder.filter(|_| state.limits.max_queue_depth.is_some()) {
            *state.running.entry(h).or_insert(0) += 1;
        }
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

    pub(super) fn release(
        &self,
        state: &mut KeyState,
        (account, holder): (Option<&Arc<str>>, Option<Holder>),
    ) {
        state.in_flight -= 1;
        if let Some(h) = holder
            && let Some(n) = state.running.get_mut(&h)
        {
            *n -= 1;
            if *n == 0 {
                state.running.remove(&h);
            }
        }
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
    pub(super) fn pump(&self, state: &mut KeyState, now: Instant) -> Option<(u64, Instant)> {
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
            let waiter = &state.waiters[&id];
            let (account, holder) = (waiter.account.clone(), holder(waiter.charged_to));
            self.admit(state, (account.as_ref(), holder), now);
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
    pub(super) fn estimate_wait(
        &self,
        state: &mut KeyState,
        position: usize,
        now: Instant,
    ) -> Duration {
        let mut interval = state.limits.pacing();
        if let Some(window) = state.limits.window {
            interval = interval.max(window.length.get() / window.max.get());
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

    /// A lease admitted at `admitted` ended: its hold time joins the key's average, its
    /// place is freed and the next waiter considered.
    pub(super) fn end_lease(
        &self,
        (account, holder): (Option<&Arc<str>>, Option<Holder>),
        admitted: Instant,
    ) {
        let now = Instant::now();
        let held = now - admitted;
        let mut state = self.lock();
        state.hold_avg = Some(match state.hold_avg {
            None => held,
            Some(avg) => avg.mul_f64(1.0 - HOLD_ALPHA) + held.mul_f64(HOLD_ALPHA),
        });
        self.release(&mut state, (account, holder));
        self.pump(&mut state, now);
    }
}
