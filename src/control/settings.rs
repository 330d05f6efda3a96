//! Every stage's settings at one moment, as one request runs under them: the typed struct of
//! a control's snapshots.
//!
//! [`Settings`] holds one `Arc` per settings cell of the stack a control builds. The control
//! takes one after each change ([`Settings::take`]) and binds each cell to its field once, at
//! build ([`Settings::bind`]), so a stage reads its field straight from the request's
//! snapshot (see [`crate::snapshot`]).

use std::collections::HashMap;
use std::sync::Arc;

use crate::breaker::{BreakerConfig, CircuitBreakers};
use crate::budget::{self, Budget};
use crate::classify::{self, ClassifyLayer};
use crate::cost::CostConfig;
use crate::entropy::{SessionConfig, SessionGuard};
use crate::fifo::{FifoLimitLayer, LimiterSettings};
use crate::idempotency::{IdempotencyConfig, IdempotencyLayer};
use crate::policy::{Policy, Switch};
use crate::snapshot::{Holds, Owner, Snapshot};

/// The stages a control builds, as their settings cells are reached.
pub(super) struct Cells<'a> {
    pub(super) switch: &'a Switch,
    pub(super) classify: &'a ClassifyLayer,
    pub(super) budget: &'a Budget,
    pub(super) sessions: &'a SessionGuard,
    pub(super) breakers: &'a CircuitBreakers,
    pub(super) idempotency: &'a IdempotencyLayer,
    pub(super) fifo: &'a FifoLimitLayer,
}

/// One `Arc` per settings cell of a control's stack.
pub(super) struct Settings {
    switch: Arc<Policy>,
    classify: Arc<classify::Settings>,
    budget: Arc<budget::Settings>,
    costs: Arc<CostConfig>,
    sessions: Arc<SessionConfig>,
    breakers: Arc<BreakerConfig>,
    idempotency: Arc<IdempotencyConfig>,
    tool_keys: Arc<HashMap<String, String>>,
    limiter: Arc<LimiterSettings>,
}

/// Each field is the one cell of its type.
macro_rules! holds {
    ($($field:ident: $ty:ty),* $(,)?) => {
        $(impl Holds<$ty> for Settings {
            fn get(&self) -> &Arc<$ty> {
                &self.$field
            }
        })*
    };
}

holds! {
    switch: Policy,
    classify: classify::Settings,
    budget: budget::Settings,
    costs: CostConfig,
    sessions: SessionConfig,
    breakers: BreakerConfig,
    idempotency: IdempotencyConfig,
    tool_keys: HashMap<String, String>,
    limiter: LimiterSettings,
}

impl Settings {
    /// Every cell's settings now, as `owner`'s snapshot.
    pub(super) fn take(owner: &Owner, cells: &Cells<'_>) -> Snapshot {
        let costs = cells.budget.costs();
        Snapshot::new(
            owner,
            Settings {
                switch: cells.switch.cell().load(),
                classify: cells.classify.cell().load(),
                budget: cells.budget.cell().load(),
                costs: costs.cell().load(),
                sessions: cells.sessions.cell().load(),
                breakers: cells.breakers.cell().load(),
                idempotency: cells.idempotency.cell().load(),
                tool_keys: cells.fifo.tool_keys_cell().load(),
                limiter: cells.fifo.limiter().cell().load(),
            },
        )
    }

    /// Binds every cell to its field of `owner`'s snapshots.
    pub(super) fn bind(owner: &Owner, cells: &Cells<'_>) {
        cells.switch.cell().bind::<Settings>(owner);
        cells.classify.cell().bind::<Settings>(owner);
        cells.budget.cell().bind::<Settings>(owner);
        cells.budget.costs().cell().bind::<Settings>(owner);
        cells.sessions.cell().bind::<Settings>(owner);
        cells.breakers.cell().bind::<Settings>(owner);
        cells.idempotency.cell().bind::<Settings>(owner);
        cells.fifo.tool_keys_cell().bind::<Settings>(owner);
        cells.fifo.limiter().cell().bind::<Settings>(owner);
    }
}
