//! Every stage's settings at one moment, as one request runs under them: the typed struct of
//! a control's snapshots.
//!
//! [`Settings`] holds one `Arc` per settings cell of the stack a control builds. The control
//! takes one after each change ([`Settings::take`]) and binds each cell to its field once, at
//! build ([`Settings::bind`]), so a stage reads its field straight from the request's
//! snapshot (see [`crate::snapshot`]).

use std::sync::Arc;

use crate::breaker::{BreakerConfig, CircuitBreakers};
use crate::budget::{self, Budget};
use crate::call::Name;
use crate::classify::{self, ClassifyLayer};
use crate::cost::CostConfig;
use crate::entropy::{SessionConfig, SessionGuard};
use crate::fifo::{FifoLimitLayer, LimiterSettings};
use crate::idempotency::{IdempotencyConfig, IdempotencyLayer};
use crate::named::NameMap;
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

/// The struct, its [`Holds`] per field, [`Settings::take`] and [`Settings::bind`] from one
/// list of the cells, so no cell can be taken and not bound (it would read its own settings,
/// not the request's snapshot's).
macro_rules! settings {
    ($cells:ident => $($field:ident: $ty:ty = $cell:expr),* $(,)?) => {
        /// One `Arc` per settings cell of a control's stack.
        pub(super) struct Settings {
            $($field: Arc<$ty>,)*
        }

        $(impl Holds<$ty> for Settings {
            fn get(&self) -> &Arc<$ty> {
                &self.$field
            }
        })*

        impl Settings {
            /// Every cell's settings now, as `owner`'s snapshot.
            pub(super) fn take(owner: &Owner, $cells: &Cells<'_>) -> Snapshot {
                Snapshot::new(owner, Settings { $($field: $cell.load(),)* })
            }

            /// Binds every cell to its field of `owner`'s snapshots.
            pub(super) fn bind(owner: &Owner, $cells: &Cells<'_>) {
                $($cell.bind::<Settings>(owner);)*
            }
        }
    };
}

// Each field is the one cell of its type.
settings! { cells =>
    switch: Policy = cells.switch.cell(),
    classify: classify::Settings = cells.classify.cell(),
    budget: budget::Settings = cells.budget.cell(),
    costs: CostConfig = cells.budget.costs().cell(),
    sessions: SessionConfig = cells.sessions.cell(),
    breakers: BreakerConfig = cells.breakers.cell(),
    idempotency: IdempotencyConfig = cells.idempotency.cell(),
    tool_keys: NameMap<Name> = cells.fifo.tool_keys_cell(),
    limiter: LimiterSettings = cells.fifo.limiter().cell(),
}
