//! What the budget learns between two ticks, recorded without a global lock.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use hdrhistogram::Histogram;

use super::TickStats;
use crate::outcome::{Observation, Outcome};

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

    /// A call finished.
    pub(crate) fn observe(&self, o: &Observation<'_>) {
        if o.call.target().is_none() {
            return; // protocol chatter (initialize, tools/list, ping): not charged, not sampled
        }
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
        match o.outcome {
            Outcome::ClientError => return, // says nothing about the backend's health
            // A call its client gave up on ran at least this long: a censored latency sample.
            // It is no error, but without it a backend slow enough that every client times
            // out would leave only the fast survivors in the p99.
            Outcome::Cancelled => {}
            outcome => {
                self.completed.fetch_add(1, Ordering::Relaxed);
                if outcome.is_failure() {
                    self.errors.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        let micros = u64::try_from(o.service_time.as_micros()).unwrap_or(u64::MAX);
        let shard = SHARD.with(|s| *s);
        self.histograms[shard]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .saturating_record(micros.max(1));
    }

    /// Takes the tick's figures and starts the next tick.
    pub(crate) fn take(&self) -> TickStats {
        let mut merged = histogram();
        for h in &self.histograms {
            let mut h = h.lock().unwrap_or_else(PoisonError::into_inner);
            let _ = merged.add(&*h);
            h.reset();
        }
        let completed = self.completed.swap(0, Ordering::Relaxed);
        TickStats {
            completed,
            errors: self.errors.swap(0, Ordering::Relaxed),
            p99: (!merged.is_empty())
                .then(|| Duration::from_micros(merged.value_at_quantile(0.99))),
            admitted_cost: self.admitted_cost.swap(0, Ordering::Relaxed) as f64,
            in_flight: self.in_flight.load(Ordering::Relaxed).max(0) as u64,
        }
    }
}
