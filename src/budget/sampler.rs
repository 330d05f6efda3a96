//! What the budget learns between two ticks, recorded without a global lock.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use hdrhistogram::Histogram;

use super::census::Census;
use super::{BudgetConfig, TickStats};
use crate::outcome::{Observation, Outcome};
use crate::stats::ToolBaselines;

/// Threads' parts of a tick: each thread records into its own (threads numbered as they come,
/// modulo this), so two workers write no counter, lock or histogram in common.
const PARTS: usize = 16;

thread_local! {
    static PART: usize = {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        (NEXT.fetch_add(1, Ordering::Relaxed) as usize) % PARTS
    };
}

/// The part of the thread running now.
fn part() -> usize {
    PART.with(|p| *p)
}

/// One thread's counters and service-time histogram of the current tick, on cache lines of
/// its own: a call's admission, refund and outcome write only their thread's part, and the
/// tick sums the parts.
#[derive(Debug)]
#[repr(align(128))]
struct Part {
    /// Cost admitted, net of the refunds of calls admitted on this part (never below 0).
    admitted_cost: AtomicU64,
    /// Calls admitted here less calls finished or refunded here: a part's may be negative (a
    /// call may finish on another thread than the one that admitted it); the sum is not.
    in_flight: AtomicI64,
    completed: AtomicU64,
    errors: AtomicU64,
    histogram: Mutex<Histogram<u64>>,
}

impl Part {
    fn new() -> Self {
        Part {
            admitted_cost: AtomicU64::new(0),
            in_flight: AtomicI64::new(0),
            completed: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            histogram: Mutex::new(histogram()),
        }
    }
}

/// Counters and histograms of the current tick.
#[derive(Debug)]
pub(crate) struct Sampler {
    parts: Box<[Part]>,
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
            parts: (0..PARTS).map(|_| Part::new()).collect(),
            tools: ToolBaselines::new(),
            census: Census::new(),
        }
    }

    /// The part of the thread running now.
    fn mine(&self) -> &Part {
        &self.parts[part()]
    }

    /// A call of `cost` was admitted: counted on the running thread's part, whose number it
    /// returns (the call's refund goes to the same part).
    pub(crate) fn admitted(&self, cost: u64) -> usize {
        let at = part();
        let part = &self.parts[at];
        part.admitted_cost.fetch_add(cost, Ordering::Relaxed);
        part.in_flight.fetch_add(1, Ordering::Relaxed);
        at
    }

    /// An admitted call of `cost`, counted on part `at` ([`admitted`](Self::admitted)'s
    /// number), was refused by a later stage: it never ran.
    pub(crate) fn refunded(&self, cost: u64, at: usize) {
        let part = &self.parts[at % PARTS];
        let _ = part
            .admitted_cost
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| {
                Some(c.saturating_sub(cost))
            });
        part.in_flight.fetch_sub(1, Ordering::Relaxed);
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
        let mine = self.mine();
        mine.in_flight.fetch_sub(1, Ordering::Relaxed);
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
            mine.completed.fetch_add(1, Ordering::Relaxed);
            if failed {
                mine.errors.fetch_add(1, Ordering::Relaxed);
            }
            self.census.record(client, failed, slow);
        }
        let micros = u64::try_from(o.service_time.as_micros()).unwrap_or(u64::MAX);
        mine.histogram
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
        let (mut completed, mut errors, mut admitted_cost, mut in_flight) = (0, 0, 0, 0i64);
        for part in &self.parts {
            let mut h = part
                .histogram
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let _ = merged.add(&*h);
            h.reset();
            completed += part.completed.swap(0, Ordering::Relaxed);
            errors += part.errors.swap(0, Ordering::Relaxed);
            admitted_cost += part.admitted_cost.swap(0, Ordering::Relaxed);
            in_flight += part.in_flight.load(Ordering::Relaxed);
        }
        let shares = self.census.take(interval);
        TickStats {
            completed,
            failed_share: shares.failed,
            slow_share: shares.slow,
            clients: shares.clients,
            errors,
            p99: (!merged.is_empty())
                .then(|| Duration::from_micros(merged.value_at_quantile(0.99))),
            admitted_cost: admitted_cost as f64,
            in_flight: in_flight.max(0) as u64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Call;

    fn finished(sampler: &Sampler, call: &Call, outcome: Outcome) {
        let o = Observation {
            call,
            outcome,
            service_time: Duration::from_millis(5),
            response_bytes: 0,
            queue_wait: Duration::ZERO,
            at: tokio::time::Instant::now(),
        };
        sampler.observe(&o, (1, 1), Duration::ZERO, &BudgetConfig::default());
    }

    #[test]
    fn a_tick_sums_every_threads_part() {
        let sampler = Sampler::new();
        let call = Call::request("tools/call").with_tool("search");
        // Three calls admitted on one thread, finished or refunded on another.
        let parts: Vec<usize> = (0..3).map(|_| sampler.admitted(2)).collect();
        // On a thread of another part (threads are numbered as they come, modulo the parts:
        // one started after others may share this one's).
        let elsewhere = || {
            if part() == parts[0] {
                return false;
            }
            finished(&sampler, &call, Outcome::Ok);
            finished(&sampler, &call, Outcome::Error);
            sampler.refunded(2, parts[2]);
            sampler.admitted(7);
            true
        };
        while !std::thread::scope(|s| s.spawn(elsewhere).join().unwrap()) {}
        let tick = sampler.take(Duration::from_secs(1));
        assert_eq!(
            tick.admitted_cost,
            4.0 + 7.0,
            "net of the refund, from both parts"
        );
        assert_eq!(tick.in_flight, 1, "the last admitted call is still running");
        assert_eq!((tick.completed, tick.errors), (2, 1));
        // Both calls' 5 ms, as the histogram keeps them (two significant digits).
        let p99 = tick.p99.expect("two calls were timed");
        assert!(
            p99.abs_diff(Duration::from_millis(5)) < Duration::from_micros(50),
            "{p99:?}"
        );
        let next = sampler.take(Duration::from_secs(1));
        assert_eq!(
            (next.admitted_cost, next.completed, next.in_flight),
            (0.0, 0, 1)
        );
    }

    #[test]
    fn a_refund_is_given_back_to_the_part_that_counted_the_call() {
        let sampler = Sampler::new();
        let here = sampler.admitted(5);
        // Refunded on a thread of another part: taken from the part that counted the call,
        // not from the refunding thread's (where it would find 3 and leave 0).
        let elsewhere = || {
            if part() == here {
                return false;
            }
            sampler.admitted(3);
            sampler.refunded(5, here);
            true
        };
        while !std::thread::scope(|s| s.spawn(elsewhere).join().unwrap()) {}
        assert_eq!(sampler.take(Duration::from_secs(1)).admitted_cost, 3.0);
    }
}
