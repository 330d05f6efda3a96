//! What the crate's own tests, benches and demo drive by hand (feature `test-util`): the
//! budget's tick, the session sweep, the writable stages of a [`Control`]. A service never
//! needs them: the ticker and the sweeper run them, and a change goes through the control's
//! one change path.

use crate::budget::{Budget, Health};
use crate::control::{Control, Stages};
use crate::entropy::SessionGuard;

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
