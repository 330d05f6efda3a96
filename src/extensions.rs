//! The facts one stage writes on a request or its answer for the others and for the MCP
//! service, as typed extensions: a stage reads them without importing the stage that wrote
//! them.
//!
//! * [`Deadline`]: when the call must be answered by. The classifier writes it on the request;
//!   the FIFO limiter (no waiting past it), the deadline layer (the cut), the outbound limiter
//!   (no retry past it) and tool code read it.
//! * [`QueueWait`]: how long the call waited in a FIFO queue. The FIFO limiter writes it on the
//!   request it passes on and on the answer; the deadline layer (a refusal's `queue_wait_ms`),
//!   the outcome layer (each [`Observation`](crate::outcome::Observation)) and the audit read it.
//!
//! A leaf: it depends on no other module of the crate.

use std::time::Duration;

use tokio::time::Instant;

/// Request extension: when the call must be answered by. Tool code can read it (rmcp hands
/// the request's extensions to tools) to bound what it does in turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadline(pub Instant);

impl Deadline {
    /// Time left.
    pub fn remaining(&self) -> Duration {
        self.0.saturating_duration_since(Instant::now())
    }
}

/// Request and response extension: how long the call waited in a FIFO queue (an audit's
/// `queueWaitMs`). The FIFO layer sets it; the outcome layer reports it in each
/// [`Observation`](crate::outcome::Observation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QueueWait(pub Duration);
