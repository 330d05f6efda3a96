//! A response body that holds FIFO leases until it ends.

use super::Lease;
use crate::watched::{Watch, Watched};

/// A body that keeps its call's [`Lease`]s until the body ends, fails or is dropped.
///
/// MCP servers answer `tools/call` with an SSE stream whose head arrives before the tool has
/// run, so a lease released with the head would limit nothing: the place is held for as long
/// as the answer streams.
pub type LeaseBody<B> = Watched<B, Leases>;

/// The leases a [`LeaseBody`] holds, given back when its body ends or is dropped.
#[derive(Debug)]
pub struct Leases(Vec<Lease>);

impl Leases {
    /// Holds `leases`.
    pub(crate) fn new(leases: Vec<Lease>) -> Self {
        Leases(leases)
    }
}

impl<D> Watch<D> for Leases {
    fn end(&mut self, _failed: bool) {
        self.0.clear();
    }
}
