//! What the budget learns between two ticks, recorded without a global lock.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use hdrhistogram::Histogram;

use super::census::Census;
use super::{BudgetConfig, TickStats};
use crate::outcome::{Observation, Outcome};
use crate::stats::ToolBaselines;

/// Service-time histograms are sharded so recording takes an uncontended lock.
const SHARDS: usize = 16;

thread_local! {
    static SHARD: usize = {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        (NEXT.fetch_add(1, Ordering::Relaxed) as usize) % SHARDS
    };
}

/// Counters and histograms of the current tick.
#[derive(Debug)]
pub(crate) struct Sampler {
    admitted_cost: AtomicU64,
    in_flight: AtomicI64,
    completed: AtomicU64,
    errors: AtomicU64,
    histograms: Vec<Mutex<Histogram<u64>>>,
    /// Each tool's healthy latency.
    tools: ToolBaselines,
    census: Census,
}

fn histogram() -> Histogram<u64> {
    // Microseconds from 1 µs to 1 hour, 2 significant digits.
    Histogram::new_with_bounds(1, 3_600_000_000, 2).expect("valid bounds")
}

impl Sampler {
    pub(crate) fn new() -> Self {
        Sampler {
            admitted_cost: AtomicU64::new(0),
            in_flight: AtomicI64::new(0),
            completed: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            histograms: (0..SHARDS).map(|_| Mutex::new(histogram())).collect(),
            tools: ToolBaselines::new(),
            census: Census::new(),
        }
    }

    /// A call of `cost` was admitted.
    pub(crate) fn admitted(&self, cost: u64) {
        self.admitted_cost.fetch_add(cost, Ordering::Relaxed);
        self.in_flight.fetch_add(1, Ordering::Relaxed);
    }

    /// An admitted call of `cost` was refused by a later stage: it never ran.
    pub(crate) fn refunded(&self, cost: u64) {
        let _ = self
            .admitted_cost
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| {
                Some(c.saturating_sub(cost))
            });
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
    }

    /// A call of `client` (see [`Census`]) finished at `now` (from the budget's epoch): its
    /// latency is judged against its tool's healthy latency, which it may teach with the vote
    /// of `voter` ([`CommonBaseline`](crate::stats::CommonBaseline)).
    pub(crate) fn observe(
        &self,
        o: &Observation<'_>,
        (client, voter): (u64, u64),
        now: Duration,
        config: &BudgetConfig,
    ) {
        let Some(tool) = o.call.target_name() else {
            return; // protocol chatter (initialize, tools/list, ping): not charged, not sampled
        };
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
        if o.outcome == Outcome::ClientError {
            return; // says nothing about the backend's health
        }
        let secs = o.service_time.as_secs_f64();
        let failed = o.outcome.is_failure();
        let cancelled = o.outcome == Outcome::Cancelled;
        // The healthy latency learns only from calls nothing held back.
        let learns = !failed && !cancelled && o.queue_wait.is_zero();
        // Judged against what was learned before it, then taught.
        let baseline = self.tools.before(tool.key(), voter, now, secs, learns);
        let slow = config.is_slow(secs, baseline);
        if cancelled {
            // A call its client gave up on ran at least this long: a censored latency sample,
            // evidence of slowness when that is already slow, of nothing otherwise. Without
            // it a backend slow enough that every client times out would look fast.
            if slow {
                self.census.record(client, false, true);
            }
        } else {
            self.completed.fetch_add(1, Ordering::Relaxed);
            if failed {
                self.errors.fetch_add(1, Ordering::Relaxed);
            }
            self.census.record(client, failed, slow);
        }
        let micros = u64::try_from(o.service_time.as_micros()).unwrap_or(u64::MAX);
        let shard = SHARD.with(|s| *s);
        self.histograms[shard]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .saturating_record(micros.max(1));
    }

    /// A tool's healthy latency in seconds, once learned.
    pub(crate) fn baseline(&self, tool: &str) -> Option<f64> {
        self.tools.get(tool)
    }

    /// Takes the tick's figures (of a tick of `interval`) and starts the next tick.
    pub(crate) fn take(&self, interval: Duration) -> TickStats {
        self.tools.renew_if_full();
        let mut merged = histogram();
        for h in &self.histograms {
            let mut h = h.lock().unwrap_or_else(PoisonError::into_inner);
            let _ = merged.add(&*h);
            h.reset();
        }
        let completed = self.completed.swap(0, Ordering::Relaxed);
        let shares = self.census.take(interval);
        TickStats {
            completed,
            failed_share: shares.failed,
            slow_share: shares.slow,
            clients: shares.clients,
            errors: self.errors.swap(0, Ordering::Relaxed),
            p99: (!merged.is_empty())
                .then(|| Duration::from_micros(merged.value_at_quantile(0.99))),
            admitted_cost: self.admitted_cost.swap(0, Ordering::Relaxed) as f64,
            in_flight: self.in_flight.load(Ordering::Relaxed).max(0) as u64,
        }
    }
}
