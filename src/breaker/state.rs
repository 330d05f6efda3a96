//! The circuit breaker's state machine: pure logic on durations, no runtime.

use std::collections::VecDeque;
use std::time::Duration;

use super::BreakerConfig;

/// Where a breaker stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    /// Calls pass; outcomes fill the sliding window.
    Closed,
    /// Calls are refused until `until` (time since the breaker's epoch).
    Open {
        /// When the first probe may go.
        until: Duration,
    },
    /// Up to `probes` calls go through to test the dependency.
    HalfOpen {
        /// Probes let through so far.
        admitted: u32,
        /// Probes that succeeded so far.
        succeeded: u32,
    },
}

/// Clients whose failures a closed breaker needs before it opens.
pub const MIN_FAILING_CLIENTS: usize = 2;

/// One breaker: a count-based sliding window of outcomes and the usual breaker state machine
/// (closed, open, half-open with a limited number of probes).
#[derive(Debug, Clone)]
pub struct Breaker {
    state: BreakerState,
    /// The last `window_calls` outcomes: (failed, slow, client).
    window: VecDeque<(bool, bool, u64)>,
}

impl Default for Breaker {
    fn default() -> Self {
        Breaker {
            state: BreakerState::Closed,
            window: VecDeque::new(),
        }
    }
}

impl Breaker {
    /// The state now (an open breaker whose wait is over is still reported open until the
    /// next call asks).
    pub fn state(&self) -> BreakerState {
        self.state
    }

    /// Asks to let a call through at `now`: `Ok(true)` for a half-open probe, `Ok(false)` for
    /// a normal call, `Err(wait)` when refused (until the next probe may go).
    pub fn try_admit(&mut self, now: Duration, config: &BreakerConfig) -> Result<bool, Duration> {
        if let BreakerState::Open { until } = self.state {
            if now < until {
                return Err(until - now);
            }
            self.state = BreakerState::HalfOpen {
                admitted: 0,
                succeeded: 0,
            };
        }
        match &mut self.state {
            BreakerState::Closed => Ok(false),
            BreakerState::HalfOpen { admitted, .. } if *admitted < config.probes.get() => {
                *admitted += 1;
                Ok(true)
            }
            // Probes are out: the next chance comes when they are back, within the slow-call
            // threshold at the latest.
            BreakerState::HalfOpen { .. } => Err(config.slow_call.get()),
            BreakerState::Open { .. } => unreachable!("left above"),
        }
    }

    /// A probe was let through but refused by a later stage: it never ran.
    pub fn release_probe(&mut self) {
        if let BreakerState::HalfOpen { admitted, .. } = &mut self.state {
            *admitted = admitted.saturating_sub(1);
        }
    }

    /// Records how a call of `client` (see
    /// [`SessionGuard::judged_as`](crate::entropy::SessionGuard::judged_as)) that ran ended.
    /// A closed breaker opens only on failures (or slow calls) of at least
    /// [`MIN_FAILING_CLIENTS`] clients: one client's bad calls cannot open it for everyone.
    pub fn record(
        &mut self,
        now: Duration,
        (failed, slow, client): (bool, bool, u64),
        config: &BreakerConfig,
    ) {
        match self.state {
            BreakerState::Open { .. } => {} // a late answer from before it opened
            BreakerState::HalfOpen {
                admitted,
                succeeded,
            } => {
                if failed || slow {
                    self.open(now, config);
                } else if succeeded + 1 >= config.probes.get() {
                    self.state = BreakerState::Closed;
                    self.window.clear();
                } else {
                    self.state = BreakerState::HalfOpen {
                        admitted,
                        succeeded: succeeded + 1,
                    };
                }
            }
            BreakerState::Closed => {
                if self.window.len() == config.window_calls {
                    self.window.pop_front();
                }
                self.window.push_back((failed, slow, client));
                let n = self.window.len();
                if n >= config.min_calls {
                    let failures = self.window.iter().filter(|w| w.0).count() as f64 / n as f64;
                    let slows = self.window.iter().filter(|w| w.1).count() as f64 / n as f64;
                    let mut bad = self.window.iter().filter(|w| w.0 || w.1).map(|w| w.2);
                    let first = bad.next();
                    let clients = first.map_or(0, |f| 1 + usize::from(bad.any(|c| c != f)));
                    if (failures >= config.failure_rate.get() || slows >= config.slow_rate.get())
                        && clients >= MIN_FAILING_CLIENTS
                    {
                        self.open(now, config);
                    }
                }
            }
        }
    }

    fn open(&mut self, now: Duration, config: &BreakerConfig) {
        self.state = BreakerState::Open {
            until: now + config.open_for.get(),
        };
        self.window.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::valid::Fraction;

    fn s(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    #[test]
    fn the_full_cycle() {
        let c = BreakerConfig::default();
        let mut b = Breaker::default();
        // Nine failures: under min_calls (10), still closed.
        for _ in 0..9 {
            assert_eq!(b.try_admit(s(0), &c), Ok(false));
            b.record(s(0), (true, false, 1), &c);
        }
        assert_eq!(b.state(), BreakerState::Closed);
        b.record(s(1), (true, false, 2), &c);
        assert_eq!(b.state(), BreakerState::Open { until: s(11) });
        assert_eq!(b.try_admit(s(4), &c), Err(s(7)));
        // Half-open at 11 s: exactly two probes.
        assert_eq!(b.try_admit(s(11), &c), Ok(true));
        assert_eq!(b.try_admit(s(11), &c), Ok(true));
        assert_eq!(b.try_admit(s(11), &c), Err(c.slow_call.get()));
        b.record(s(12), (false, false, 1), &c);
        b.record(s(12), (false, false, 1), &c);
        assert_eq!(b.state(), BreakerState::Closed);
        // A failed probe reopens.
        for i in 0..10 {
            b.record(s(20), (true, false, i % 2), &c);
        }
        assert_eq!(b.try_admit(s(30), &c), Ok(true));
        b.record(s(30), (true, false, 1), &c);
        assert_eq!(b.state(), BreakerState::Open { until: s(40) });
    }

    #[test]
    fn slow_calls_open_it_too() {
        let c = BreakerConfig {
            slow_rate: Fraction::new(0.5).unwrap(),
            ..BreakerConfig::default()
        };
        let mut b = Breaker::default();
        for i in 0..10 {
            b.record(s(0), (false, i % 2 == 0, i % 4), &c);
        }
        assert!(matches!(b.state(), BreakerState::Open { .. }));
    }

    #[test]
    fn one_clients_failures_never_open_it() {
        let c = BreakerConfig::default();
        let mut b = Breaker::default();
        for _ in 0..100 {
            b.record(s(0), (true, false, 7), &c);
        }
        assert_eq!(b.state(), BreakerState::Closed);
        // A second client failing once beside them is enough.
        b.record(s(0), (true, false, 8), &c);
        assert!(matches!(b.state(), BreakerState::Open { .. }));
    }
}
