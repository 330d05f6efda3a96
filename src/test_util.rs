//! What the crate's own tests, benches and demo drive by hand (feature `test-util`): the
//! budget's tick, the session sweep, the writable stages of a [`Control`]. A service never
//! needs them: the ticker and the sweeper run them, and a change goes through the control's
//! one change path.

use crate::breaker::CircuitBreakers;
use crate::budget::{Budget, Health};
use crate::control::Control;
use crate::entropy::SessionGuard;
use crate::fifo::ResourceLimiter;

impl Budget {
    /// Ends the current tick now, as the ticker does every `sample_interval`.
    pub fn tick(&self) -> Health {
        self.tick_now()
    }
}

impl SessionGuard {
    /// Forgets sessions unseen for `idle_ttl` and refreshes the top-N view now, as the
    /// sweeper does every window. Returns the sessions forgotten.
    pub fn sweep(&self) -> usize {
        self.sweep_idle()
    }
}

impl Control {
    /// The stages themselves, writable.
    pub fn stages(&self) -> Stages<'_> {
        self.stages_now()
    }
}

/// The stages of a [`Control`], writable (see [`Control::stages`]).
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct Stages<'a> {
    /// The budget.
    pub budget: &'a Budget,
    /// The session guard.
    pub sessions: &'a SessionGuard,
    /// The circuit breakers.
    pub breakers: &'a CircuitBreakers,
    /// The FIFO limiter.
    pub limiter: &'a ResourceLimiter,
}
