//! Waiting for a place on a key ([`Acquire`]) and holding it ([`Lease`]).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::{Instant, Sleep};

use super::error::AcquireError;
use super::key::{ByHolder, Holder, Key, KeyState, Waiter, holder};
use crate::charges::ChargedTo;

/// Future returned by [`ResourceLimiter::acquire`](super::ResourceLimiter::acquire); resolves
/// to a [`Lease`].
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
    /// Waits for a place on `key` (the account only where accounts are limited).
    pub(super) fn new(key: Arc<Key>, account: Option<Arc<str>>, deadline: Option<Instant>) -> Self {
        Acquire {
            key,
            account,
            charged_to: None,
            deadline,
            state: AcquireState::Start,
        }
    }

    /// Names whom the budget charged the call to: a call within its client's share that
    /// finds the queue full may take the place of a waiter beyond its share, or of the client
    /// holding the most places; any call, of the caller of its own client holding the most
    /// (the waiter is refused [`AcquireError::QueueFull`]). Without it (the default) the
    /// caller neither takes nor gives a place.
    pub(crate) fn charged_to(mut self, charged_to: Option<ChargedTo>) -> Self {
        self.charged_to = charged_to;
        self
    }

    /// The queued waiter a call finding the queue full replaces, if any (its position). A
    /// caller holds its running calls' places and its waiters'. A call within its client's
    /// share replaces the newest waiter admitted beyond its share, else the newest of a client
    /// holding the most places, if that is at least two more than the call's own client
    /// holds. Else, whatever its share, the newest waiter of its own client's caller (its
    /// client's id: the ids of a tenant's unverified pool are one client) holding the most,
    /// if that is at least two more than the call's own id holds: the client holds as many
    /// places as before, and one id's burst does not refuse the others judged with it.
    fn replaces(&self, state: &KeyState) -> Option<usize> {
        let me = self.charged_to?;
        let of = |id: &u64| state.waiters[id].charged_to;
        let mut clients = ByHolder::<u64>::default();
        let mut callers = ByHolder::default();
        let waiting = state.queue.iter().filter_map(|id| holder(of(id)));
        for ((client, id), n) in state
            .running
            .iter()
            .map(|(&h, &n)| (h, n))
            .chain(waiting.map(|h| (h, 1)))
        {
            *clients.entry(client).or_default() += n;
            *callers.entry((client, id)).or_default() += n;
        }
        let newest_of = |held: &dyn Fn(ChargedTo) -> bool| {
            state.queue.iter().rposition(|id| of(id).is_some_and(held))
        };
        if !me.beyond_share {
            if let Some(p) = newest_of(&|c| c.beyond_share) {
                return Some(p);
            }
            let mine = clients.get(&me.client).copied().unwrap_or(0);
            let most = state
                .queue
                .iter()
                .filter_map(of)
                .map(|c| clients[&c.client])
                .max();
            if let Some(most) = most.filter(|&most| most >= mine + 2) {
                return newest_of(&|c| clients[&c.client] == most);
            }
        }
        let caller = |c: ChargedTo| callers[&(c.client, c.id)];
        let mine = callers.get(&(me.client, me.id)).copied().unwrap_or(0);
        let ours = |c: &ChargedTo| c.client == me.client;
        let most = state
            .queue
            .iter()
            .filter_map(of)
            .filter(ours)
            .map(caller)
            .max()?;
        if most < mine + 2 {
            return None;
        }
        newest_of(&|c| ours(&c) && caller(c) == most)
    }

    fn lease(&self, admitted: Instant, queue_wait: Duration) -> Lease {
        Lease {
            key: self.key.clone(),
            account: self.account.clone(),
            holder: holder(self.charged_to),
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
            let holder = holder(self.charged_to);
            key.admit(&mut state, (self.account.as_ref(), holder), now);
            key.metrics.wait.record(0.0);
            return Ok(Some(self.lease(now, Duration::ZERO)));
        }
        let limits = state.limits;
        if let Some(until) = state.cooldown_until.filter(|&u| u > now && !key.bypassed()) {
            let cannot_wait = limits.max_queue_depth == Some(0)
                || limits.queue_timeout.is_some_and(|t| now + t.get() < until);
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
            deadline: match (limits.queue_timeout.map(|t| now + t.get()), self.deadline) {
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
            key.release(
                &mut state,
                (waiter.account.as_ref(), holder(waiter.charged_to)),
            );
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
    holder: Option<Holder>,
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
        self.key
            .end_lease((self.account.as_ref(), self.holder), self.admitted);
    }
}
