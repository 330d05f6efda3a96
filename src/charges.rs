//! What one call was charged, given back together when it turns out the call never ran.
//!
//! Every admission stage that charges a call (the global budget, its tenant's share and lease,
//! the session guard, a breaker's half-open probe, and your own [`Admission`]s) records its
//! refund in the call's [`Charges`]. The charges are given back, all of them, when:
//!
//! * a later stage refuses the call (a refusal is not work); or
//! * the MCP server rejects it without running it: an HTTP 4xx before any result (400, 403,
//!   404, 406, 415: an unknown session, a refused batch, a bad header) or a JSON-RPC error of
//!   the client's own mistake ([`Outcome::ClientError`](crate::outcome::Outcome::ClientError)),
//!   as the [`OutcomeLayer`](crate::outcome::OutcomeLayer) reports it.
//!
//! Otherwise they are kept: dropping the last copy of the call commits them. So a hostile
//! client that sends batches the server refuses, or calls on a session that does not exist,
//! spends nothing of anyone's budget.
//!
//! The charges also say whom the budget charged the call to (its client, as the session guard
//! judges it) and whether it was admitted **beyond that client's fair share** (from what
//! lighter clients left unused, see `budget::fair`): a resource whose queue is full makes room
//! for a call within its share by refusing a waiter admitted beyond it, or else one of the
//! client holding the most places, or, for any call, one of the id of its own client holding
//! the most ([`ResourceLimiter`](crate::fifo::ResourceLimiter)), so the excess is what a full
//! resource refuses, not whoever came last.
//!
//! [`Admission`]: crate::admit::Admission

use std::fmt;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

type Refund = Box<dyn FnOnce() + Send>;

/// The refunds of one call, shared by every copy of it. Cheap to clone.
#[derive(Clone, Default)]
pub struct Charges(Arc<Ledger>);

/// What the copies of one call share.
#[derive(Default)]
struct Ledger {
    refunds: Mutex<Refunds>,
    /// Whom the budget charged, and whether beyond the client's fair share.
    charged_to: OnceLock<ChargedTo>,
}

/// The refunds of one call: the first held inline (a call the stack charges records one, its
/// admitting stages being one stage), the others in a list.
#[derive(Default)]
struct Refunds {
    first: Option<Refund>,
    more: Vec<Refund>,
}

/// Whom the budget charged a call to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ChargedTo {
    /// The client, as the session guard judges it (a keyed hash).
    pub(crate) client: u64,
    /// The session id the call came on (its key): which caller of the client it is, where
    /// the guard judges several ids as one client (a tenant's unverified pool).
    pub(crate) id: u64,
    /// Admitted beyond the client's fair share.
    pub(crate) beyond_share: bool,
}

impl Charges {
    /// Records whom the budget charged the call to (the first record stands).
    pub(crate) fn set_charged_to(&self, charged_to: ChargedTo) {
        let _ = self.0.charged_to.set(charged_to);
    }

    /// Whom the budget charged the call to, if it did.
    pub(crate) fn charged_to(&self) -> Option<ChargedTo> {
        self.0.charged_to.get().copied()
    }

    /// Records what to do to give a charge back.
    pub fn push(&self, refund: impl FnOnce() + Send + 'static) {
        let refund: Refund = Box::new(refund);
        let mut refunds = self.lock();
        match refunds.first {
            None => refunds.first = Some(refund),
            Some(_) => refunds.more.push(refund),
        }
    }

    /// Gives back every charge recorded so far, latest first; later calls give back only what
    /// was recorded since.
    pub fn refund(&self) {
        let Refunds { first, more } = std::mem::take(&mut *self.lock());
        for refund in more.into_iter().rev().chain(first) {
            refund();
        }
    }

    /// Charges recorded and not given back.
    pub fn len(&self) -> usize {
        let refunds = self.lock();
        usize::from(refunds.first.is_some()) + refunds.more.len()
    }

    /// Whether nothing is charged.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Refunds> {
        self.0
            .refunds
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

impl fmt::Debug for Charges {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Charges").field(&self.len()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn refunds_each_charge_once_latest_first() {
        let order = Arc::new(Mutex::new(Vec::new()));
        let c = Charges::default();
        for i in 0..3 {
            let o = order.clone();
            c.push(move || o.lock().unwrap().push(i));
        }
        let copy = c.clone();
        copy.refund();
        c.refund();
        assert_eq!(*order.lock().unwrap(), vec![2, 1, 0]);
        assert!(c.is_empty());
    }

    #[test]
    fn dropping_commits() {
        let n = Arc::new(AtomicUsize::new(0));
        let c = Charges::default();
        let m = n.clone();
        c.push(move || {
            m.fetch_add(1, Ordering::Relaxed);
        });
        drop(c);
        assert_eq!(n.load(Ordering::Relaxed), 0);
    }
}
