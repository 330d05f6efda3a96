//! What the stack gives a call beside its message: the cost and deadline the classifier set,
//! the charges the admitting stages took, and the settings its request runs under. None of it
//! comes from the client.

use std::sync::Arc;

use super::record::Record;
use crate::charges::Charges;
use crate::snapshot::Snapshot;

/// A call's pipeline state: written by the classifier, read (and charged) by the stages.
#[derive(Debug, Clone)]
pub(crate) struct Pipeline {
    /// Weighted cost in budget units.
    pub(crate) cost: u32,
    /// When the call must be answered by (its whole-round deadline), if it has one.
    pub(crate) deadline: Option<tokio::time::Instant>,
    /// What the stages charged it, shared by every copy of it (see [`Charges`]).
    pub(crate) charges: Charges,
    /// The settings its request runs under (see [`Snapshot`]), when a
    /// [`Control`](crate::control::Control) built the stack.
    pub(crate) snapshot: Option<Arc<Snapshot>>,
    /// Its client's record, as the stage that judges clients found it (see [`Record`]).
    pub(crate) record: Record,
}

impl Default for Pipeline {
    /// Cost 1, no deadline, nothing charged, no snapshot, no record kept: a call no classifier
    /// has priced.
    fn default() -> Self {
        Pipeline {
            cost: 1,
            deadline: None,
            charges: Charges::default(),
            snapshot: None,
            record: Record::default(),
        }
    }
}
