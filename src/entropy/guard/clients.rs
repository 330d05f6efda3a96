//! Who a call's client is, for the stages that count clients (the budget's census and fair
//! shares, the breakers): [`ClientKeys`] asks a followed [`SessionGuard`], which judges a call
//! as its accepted session or its tenant's unverified pool, and otherwise hashes the call's
//! session id. Kept apart from the guard because those stages hold it whether or not a guard
//! runs.

use super::SessionGuard;
use crate::call::Call;

/// Who a call's client is, for the stages that count clients (the budget's census and fair
/// shares, the breakers): as a followed [`SessionGuard`] judges it, else a keyed hash of its
/// session id.
#[derive(Debug, Default)]
pub(crate) struct ClientKeys {
    sessions: std::sync::OnceLock<SessionGuard>,
    keys: std::hash::RandomState,
}

impl ClientKeys {
    /// Follows `sessions` from now on (set once; later calls change nothing).
    pub(crate) fn follow(&self, sessions: SessionGuard) {
        let _ = self.sessions.set(sessions);
    }

    /// The client `call` counts for.
    pub(crate) fn of(&self, call: &Call) -> u64 {
        self.identify(call).0
    }

    /// The client `call` counts for and the rate its own state lets it be admitted, as a
    /// followed guard gives them ([`SessionGuard::allowance`]), else its session id's, unbounded.
    pub(crate) fn allowance(&self, call: &Call) -> (u64, f64) {
        match self.sessions.get() {
            Some(guard) => guard.allowance(call),
            None => (self.of(call), f64::INFINITY),
        }
    }

    /// The client `call` counts for and its vote on its tool's healthy latency, as a followed
    /// guard gives them ([`SessionGuard::identify`]), else both its session id's.
    pub(crate) fn identify(&self, call: &Call) -> (u64, u64) {
        match self.sessions.get() {
            Some(guard) => guard.identify(call),
            None => {
                let key = std::hash::BuildHasher::hash_one(&self.keys, call.session.as_str());
                (key, key)
            }
        }
    }
}
