//! The controller's health census: how the *median* client is doing, so that no single session
//! or tenant moves the global budget alone.
//!
//! Every finished call is counted for its client (a session the MCP server accepted, or a
//! tenant's unverified pool: see [`SessionGuard::judged_as`](crate::entropy::SessionGuard::judged_as)):
//! finished, failed, slow. Counts decay with a time constant of [`MEMORY`], and each tick
//! reads, over the clients with at least [`ACTIVE`] recent calls, the **lower median** of their
//! failure shares and of their slow shares. One client failing every call among five healthy
//! ones leaves both at 0; trouble spread over most clients moves them at once.

use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use crate::bounded::PassThrough;

/// Clients are keyed hashes already: the maps take them as they are.
type ByClient = HashMap<u64, Counts, BuildHasherDefault<PassThrough>>;

/// How long a client's calls keep counting: their weight halves about every 0.7 s of this.
pub(crate) const MEMORY: Duration = Duration::from_secs(1);
/// Decayed calls a client needs to count as active (about one call in the last 1.4 s).
pub(crate) const ACTIVE: f64 = 0.25;
/// Clients counted at most; past it, new clients share one entry.
pub(crate) const MAX_CLIENTS: usize = 4096;
/// The shared entry of clients past [`MAX_CLIENTS`].
const OVERFLOW: u64 = u64::MAX;
/// Shards of the per-tick counts, so recording takes an uncontended lock.
const SHARDS: usize = 16;

#[derive(Debug, Clone, Copy, Default)]
struct Counts {
    finished: f64,
    failed: f64,
    slow: f64,
}

/// The census's figures after a tick.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Shares {
    /// Active clients.
    pub(crate) clients: usize,
    /// The lower median of their failure shares (0 without clients).
    pub(crate) failed: f64,
    /// The lower median of their slow shares (0 without clients).
    pub(crate) slow: f64,
}

/// Per-client counts of this tick and the decayed counts across ticks.
#[derive(Debug)]
pub(crate) struct Census {
    tick: Vec<Mutex<ByClient>>,
    table: Mutex<ByClient>,
}

fn lower_median(values: &mut [f64]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let mid = (values.len() - 1) / 2;
    *values.select_nth_unstable_by(mid, |a, b| a.total_cmp(b)).1
}

impl Census {
    pub(crate) fn new() -> Self {
        Census {
            tick: (0..SHARDS).map(|_| Mutex::default()).collect(),
            table: Mutex::default(),
        }
    }

    /// A call of `client` finished: failed and/or slow.
    pub(crate) fn record(&self, client: u64, failed: bool, slow: bool) {
        let mut shard = self.tick[(client % SHARDS as u64) as usize]
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let full = shard.len() >= MAX_CLIENTS / SHARDS;
        let key = if full && !shard.contains_key(&client) {
            OVERFLOW
        } else {
            client
        };
        let c = shard.entry(key).or_default();
        c.finished += 1.0;
        c.failed += f64::from(u8::from(failed));
        c.slow += f64::from(u8::from(slow));
    }

    /// Ends a tick of `interval`: decays the counts, adds the tick's, forgets clients gone
    /// quiet, and returns the shares.
    pub(crate) fn take(&self, interval: Duration) -> Shares {
        let decay = (-interval.as_secs_f64() / MEMORY.as_secs_f64()).exp();
        let mut table = self.table.lock().unwrap_or_else(PoisonError::into_inner);
        for c in table.values_mut() {
            c.finished *= decay;
            c.failed *= decay;
            c.slow *= decay;
        }
        for shard in &self.tick {
            // Drained, not replaced: the map keeps its room for the next tick.
            let mut shard = shard.lock().unwrap_or_else(PoisonError::into_inner);
            for (client, n) in shard.drain() {
                let full = table.len() >= MAX_CLIENTS;
                let key = if full && !table.contains_key(&client) {
                    OVERFLOW
                } else {
                    client
                };
                let c = table.entry(key).or_default();
                c.finished += n.finished;
                c.failed += n.failed;
                c.slow += n.slow;
            }
        }
        table.retain(|_, c| c.finished >= ACTIVE / 8.0);
        let active: Vec<&Counts> = table.values().filter(|c| c.finished >= ACTIVE).collect();
        let mut failed: Vec<f64> = active.iter().map(|c| c.failed / c.finished).collect();
        let mut slow: Vec<f64> = active.iter().map(|c| c.slow / c.finished).collect();
        Shares {
            clients: active.len(),
            failed: lower_median(&mut failed),
            slow: lower_median(&mut slow),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const TICK: Duration = Duration::from_millis(100);

    #[test]
    fn one_failing_client_of_five_moves_nothing_and_most_do() {
        let census = Census::new();
        for _ in 0..10 {
            for client in 0..5 {
                census.record(client, client == 0, false);
            }
        }
        let s = census.take(TICK);
        assert_eq!((s.clients, s.failed, s.slow), (5, 0.0, 0.0));
        // Three of five fail every call, two of five are slow: failures cut, slowness not.
        for _ in 0..10 {
            for client in 0..5 {
                census.record(client, client < 3, client >= 3);
            }
        }
        let s = census.take(TICK);
        assert!(s.failed > 0.5, "{s:?}");
        assert_eq!(s.slow, 0.0, "{s:?}");
    }

    #[test]
    fn quiet_clients_stop_counting() {
        let census = Census::new();
        census.record(1, true, true);
        assert_eq!(census.take(TICK).clients, 1);
        // One call, decayed over 1.5 s: below ACTIVE.
        let mut s = Shares::default();
        for _ in 0..15 {
            s = census.take(TICK);
        }
        assert_eq!(s.clients, 0);
        assert_eq!(census.table.lock().unwrap().len(), 1, "remembered a while");
        // Below an eighth of ACTIVE after 3.5 s: forgotten.
        for _ in 0..20 {
            census.take(TICK);
        }
        assert!(census.table.lock().unwrap().is_empty(), "then forgotten");
    }

    #[test]
    fn clients_past_the_cap_share_one_entry() {
        let census = Census::new();
        for client in 0..(3 * MAX_CLIENTS as u64) {
            census.record(client, false, false);
        }
        assert!(census.take(TICK).clients <= MAX_CLIENTS + 1);
        assert!(census.table.lock().unwrap().len() <= MAX_CLIENTS + 1);
    }

    proptest! {
        /// The lower median against a sort.
        #[test]
        fn the_lower_median_is_the_middle_of_a_sort(
            mut xs in proptest::collection::vec(0.0f64..1.0, 0..50),
        ) {
            let mut sorted = xs.clone();
            sorted.sort_by(f64::total_cmp);
            let want = if sorted.is_empty() { 0.0 } else { sorted[(sorted.len() - 1) / 2] };
            prop_assert_eq!(lower_median(&mut xs), want);
        }
    }
}
