//! Who a call's client is, for the stages that count clients (the budget's census and fair
//! shares, the breakers).
//!
//! Their client keys ask the [`Judge`] they follow (the session guard, which judges a call as
//! its accepted session or its tenant's unverified pool), and otherwise hash the call's session
//! id. Those stages hold them whether or not a guard runs, and know the guard only as a
//! `Judge`: no stage imports another to learn who the client is.

use std::sync::{Arc, OnceLock};

use crate::call::Call;

/// What judges who a call's client is, for the stages that count clients: the session guard
/// ([`SessionGuard`](crate::entropy::SessionGuard)) is the one judge; the trait is sealed.
pub trait Judge: sealed::Judging + std::fmt::Debug + Send + Sync + 'static {}

/// The judgement itself, callable inside the crate only.
pub(crate) mod sealed {
    use crate::call::Call;

    /// See [`Judge`](super::Judge).
    pub trait Judging {
        /// The client `call` counts for and the rate its own state lets it be admitted.
        fn allowance(&self, call: &Call) -> (u64, f64);
        /// The client `call` counts for and its vote on its tool's healthy latency.
        fn identify(&self, call: &Call) -> (u64, u64);
    }
}

/// Who a call's client is: as a followed [`Judge`] judges it, else its session id's key.
#[derive(Debug, Default)]
pub(crate) struct ClientKeys {
    judge: OnceLock<Arc<dyn Judge>>,
}

impl ClientKeys {
    /// Follows `judge` from now on (set once; later calls change nothing).
    pub(crate) fn follow(&self, judge: Arc<dyn Judge>) {
        let _ = self.judge.set(judge);
    }

    /// The client `call` counts for.
    pub(crate) fn of(&self, call: &Call) -> u64 {
        self.identify(call).0
    }

    /// The client `call` counts for and the rate its own state lets it be admitted, as the
    /// followed judge gives them, else its session id's, unbounded.
    pub(crate) fn allowance(&self, call: &Call) -> (u64, f64) {
        match self.judge.get() {
            Some(judge) => judge.allowance(call),
            None => (self.of(call), f64::INFINITY),
        }
    }

    /// The client `call` counts for and its vote on its tool's healthy latency, as the
    /// followed judge gives them, else both its session id's.
    pub(crate) fn identify(&self, call: &Call) -> (u64, u64) {
        match self.judge.get() {
            Some(judge) => judge.identify(call),
            None => (call.session.key(), call.session.key()),
        }
    }
}
