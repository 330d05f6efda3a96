//! The running policy: the kill switch's mode, the feature switches and the fixed limits, as one
//! immutable snapshot swapped atomically.

use crate::valid::Positive;
use std::sync::Arc;

use crate::snapshot::{Live, Read, Snapshot};
use serde::{Deserialize, Serialize};

/// The kill switch: how much of stormgate's protection runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Everything: adaptive budget, tenant shares, entropy penalty, per-resource limits.
    #[default]
    Adaptive,
    /// The adaptive budget and the entropy penalty replaced by fixed limits ([`FixedLimits`]);
    /// the FIFO limiter unchanged. The controller keeps learning, so a flip back to `adaptive`
    /// resumes from what it learned.
    Fixed,
    /// Pass-through: nothing is refused, waiting callers are released; measuring continues.
    Off,
}

impl Mode {
    /// The snake_case name.
    pub const fn as_str(self) -> &'static str {
        match self {
            Mode::Adaptive => "adaptive",
            Mode::Fixed => "fixed",
            Mode::Off => "off",
        }
    }

    /// Sets `stormgate_mode`: 1 for this mode, 0 for the others.
    pub(crate) fn emit(self) {
        for mode in [Mode::Adaptive, Mode::Fixed, Mode::Off] {
            ::metrics::gauge!(crate::metrics::MODE, "mode" => mode.as_str()).set(if mode == self {
                1.0
            } else {
                0.0
            });
        }
    }
}

/// What mode `off` does (the `off` setting).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Off {
    /// Every stage still runs and refuses nothing (the default): calls are classified,
    /// measured, audited and learned from as in the other modes, so metrics, the audit and
    /// the controller carry on, and a flip back finds them current. Costs what `adaptive`
    /// costs.
    #[default]
    Measure,
    /// The stack steps aside whole: each request goes to the MCP service untouched, as if
    /// stormgate were not there (about the cost of one atomic load). Nothing is classified,
    /// measured, audited or learned while off: call metrics stop, the controller holds its
    /// budget, and sessions started meanwhile are accepted by the session guard at their first
    /// answered call after the flip back.
    PassThrough,
}

/// One switch per feature, each on by default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct Features {
    /// The EWMA controller moves the global budget (off: pinned at `stable_budget`).
    pub adaptive_budget: bool,
    /// Per-tenant shares (off: the global bucket only).
    pub tenant_budgets: bool,
    /// The storm score cuts session budgets (off: sessions keep their base budget).
    pub entropy_penalty: bool,
    /// The per-resource FIFO limiter (off: no call waits or is refused there).
    pub resource_limits: bool,
}

impl Default for Features {
    fn default() -> Self {
        Features {
            adaptive_budget: true,
            tenant_budgets: true,
            entropy_penalty: true,
            resource_limits: true,
        }
    }
}

/// The limits of `fixed` mode, in cost units per second. Each is optional, and an absent one
/// limits nothing in fixed mode (absent means off, as everywhere in stormgate).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct FixedLimits {
    /// One rate for everyone.
    pub global_rate: Option<Positive>,
    /// A rate per tenant.
    pub tenant_rate: Option<Positive>,
    /// A rate per agent session.
    pub session_rate: Option<Positive>,
}

/// The snapshot every stage reads once per request.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Policy {
    /// The kill switch.
    pub mode: Mode,
    /// The feature switches.
    pub features: Features,
    /// The limits of fixed mode.
    pub fixed: FixedLimits,
    /// What mode `off` does.
    pub off: Off,
}

impl Policy {
    /// Whether the stack steps aside whole under this policy: mode `off` with
    /// [`Off::PassThrough`].
    pub fn passes_through(&self) -> bool {
        self.mode == Mode::Off && self.off == Off::PassThrough
    }
}

/// The shared, atomically swapped [`Policy`]: a flip is seen by the next request, and a
/// request in flight keeps the snapshot it started with.
#[derive(Debug, Clone)]
pub struct Switch(Arc<Live<Policy>>);

impl Default for Switch {
    fn default() -> Self {
        Switch::new(Policy::default())
    }
}

impl Switch {
    /// A switch set to `policy`.
    pub fn new(policy: Policy) -> Self {
        Switch(Arc::new(Live::new(policy)))
    }

    /// The policy now.
    pub fn load(&self) -> Arc<Policy> {
        self.0.load()
    }

    /// The mode now.
    pub fn mode(&self) -> Mode {
        self.0.peek().mode
    }

    /// The policy now, for a short read that touches no reference count ([`Live::peek`]).
    pub(crate) fn peek(&self) -> arc_swap::Guard<Arc<Policy>> {
        self.0.peek()
    }

    /// The policy a call runs under: its request's snapshot's, else the switch's now.
    pub(crate) fn of<'a>(&self, call: &'a crate::Call) -> Read<'a, Policy> {
        self.read(call.snapshot())
    }

    /// The policy of this snapshot, else the switch's now.
    pub(crate) fn read<'a>(&self, snapshot: Option<&'a Snapshot>) -> Read<'a, Policy> {
        self.0.read(snapshot)
    }

    /// The switch's cell, for a control's snapshots.
    pub(crate) fn cell(&self) -> &Live<Policy> {
        &self.0
    }

    /// Sets the policy: the next request of every stage following this switch sees it. For
    /// stacks built stage by stage; a [`Control`](crate::control::Control) flips its own switch
    /// through `set_mode` and reloads, so that its configuration stays in step.
    ///
    /// ```
    /// use stormgate::control::{Mode, Policy, Switch};
    ///
    /// let switch = Switch::default();
    /// switch.set(Policy { mode: Mode::Off, ..Policy::default() });
    /// assert_eq!(switch.mode(), Mode::Off);
    /// ```
    pub fn set(&self, policy: Policy) {
        self.0.store(Arc::new(policy));
    }
}
