//! The EWMA controller: follows the backend's real health like TCP congestion control.
//!
//! ```text
//!  every sample_interval (100 ms):       smoothed with EWMA(alpha)        decide
//!  ┌──────────────────────────┐      ┌────────────────────────────┐   ┌───────────────────────┐
//!  │ admitted cost/s          │ ───► │ rate, in-flight,           │──►│ unhealthy: budget =    │
//!  │ in-flight calls          │      │ error rate, p99            │   │  max(floor, budget*df) │
//!  │ error rate (this tick)   │      └────────────────────────────┘   │ healthy k-th tick in a │
//!  │ p99 service time         │   unhealthy = p99 > target_p99        │  row, k >= recover_    │
//!  └──────────────────────────┘     (or tolerance x healthy baseline) │  after: budget +=      │
//!                                   or error rate > max_error_rate    │  recover_step, <= stable│
//!                                                                     └───────────────────────┘
//! ```
//!
//! The latency baseline is the mean of the first 20 ticks with finished calls at the stable
//! budget, then a slow EWMA of them; the latency rule waits for those 20 ticks. With tools of
//! very different latency in one backend, prefer an explicit `target_p99`.
//!
//! A tick with no finished call carries no evidence of trouble: it counts as error rate 0 and
//! as the learned baseline latency, so a budget cut during a storm recovers once the storm
//! has stopped, even if nothing else is sent.

use crate::error::ConfigError;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::Ewma;

/// Settings of the adaptive global budget (seed 003 sections 3.1, 3.2, 4.2). Budgets are in
/// cost units per second (a call of weight 50 costs 50 units).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BudgetConfig {
    /// The budget when the backend is healthy, and the ceiling of recovery. Default 1000.
    pub stable_budget: f64,
    /// The lowest the budget goes. Default 10% of `stable_budget` (stormgate's choice).
    pub floor: Option<f64>,
    /// Bucket size in cost units: how much may be spent at once. Default a tenth of
    /// `stable_budget` (100 ms of it), at least the largest tool weight.
    pub burst: Option<f64>,
    /// Tick length (`sample_interval_ms`). Default 100 ms (seed 3.2).
    #[serde(rename = "sample_interval_ms", with = "crate::duration_ms")]
    pub sample_interval: Duration,
    /// EWMA smoothing, in (0, 1]. Default 0.4 (seed 3.2: 0.3 to 0.5).
    pub alpha: f64,
    /// Unhealthy when the smoothed p99 service time exceeds this (`target_p99_ms`). When
    /// absent, `latency_tolerance` times the p99 learned while healthy at the stable budget
    /// is used instead.
    #[serde(rename = "target_p99_ms", with = "crate::duration_ms::opt")]
    pub target_p99: Option<Duration>,
    /// Multiple of the healthy p99 baseline that counts as unhealthy when `target_p99` is
    /// absent. Default 2.0 (stormgate's choice).
    pub latency_tolerance: f64,
    /// Without `target_p99`, a p99 at most this much over the learned baseline is never
    /// unhealthy, whatever the ratio (`latency_floor_ms`): a millisecond of scheduling noise on
    /// a 1.5 ms backend is not distress. Default 5 ms.
    #[serde(rename = "latency_floor_ms", with = "crate::duration_ms")]
    pub latency_floor: Duration,
    /// Unhealthy when the smoothed error rate exceeds this fraction. Default 0.1 (stormgate's
    /// choice; seed 2.2's storm drops success from 97% to 62%).
    pub max_error_rate: f64,
    /// Multiplier applied on an unhealthy tick, in (0, 1). Default 0.7 (stormgate's choice,
    /// as TCP CUBIC).
    pub decrease_factor: f64,
    /// Healthy ticks in a row before recovery starts. Default 3 (seed 3.2).
    pub recover_after: u32,
    /// Additive step per further healthy tick. Default 5% of `stable_budget` (seed 4.2: 5-10%).
    pub recover_step: Option<f64>,
}

impl Default for BudgetConfig {
    fn default() -> Self {
        BudgetConfig {
            stable_budget: 1000.0,
            floor: None,
            burst: None,
            sample_interval: Duration::from_millis(100),
            alpha: 0.4,
            target_p99: None,
            latency_tolerance: 2.0,
            latency_floor: Duration::from_millis(5),
            max_error_rate: 0.1,
            decrease_factor: 0.7,
            recover_after: 3,
            recover_step: None,
        }
    }
}

impl BudgetConfig {
    /// The floor in effect.
    pub fn floor(&self) -> f64 {
        self.floor.unwrap_or(self.stable_budget * 0.1)
    }

    /// The recovery step in effect.
    pub fn recover_step(&self) -> f64 {
        self.recover_step.unwrap_or(self.stable_budget * 0.05)
    }

    /// The bucket size in effect, given the largest tool weight.
    pub fn burst(&self, max_weight: u32) -> f64 {
        self.burst
            .unwrap_or(self.stable_budget / 10.0)
            .max(f64::from(max_weight))
            .max(1.0)
    }

    /// Checks every rule; the error names the field and the rule.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let positive = |name: &str, v: f64| {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                Err(ConfigError::new(
                    format!("budget.{name}"),
                    "must be greater than 0",
                ))
            }
        };
        positive("stable_budget", self.stable_budget)?;
        positive("floor", self.floor())?;
        positive("recover_step", self.recover_step())?;
        positive("latency_tolerance", self.latency_tolerance)?;
        if self.floor() > self.stable_budget {
            return Err(ConfigError::new(
                "budget.floor",
                "must not exceed stable_budget",
            ));
        }
        if self.burst.is_some_and(|b| !(b.is_finite() && b >= 1.0)) {
            return Err(ConfigError::new("budget.burst", "must be at least 1"));
        }
        if self.sample_interval.is_zero() {
            return Err(ConfigError::new(
                "budget.sample_interval_ms",
                "must be greater than 0",
            ));
        }
        if !(self.alpha > 0.0 && self.alpha <= 1.0) {
            return Err(ConfigError::new("budget.alpha", "must be in (0, 1]"));
        }
        if !(self.max_error_rate >= 0.0 && self.max_error_rate <= 1.0) {
            return Err(ConfigError::new(
                "budget.max_error_rate",
                "must be in [0, 1]",
            ));
        }
        if !(self.decrease_factor > 0.0 && self.decrease_factor < 1.0) {
            return Err(ConfigError::new(
                "budget.decrease_factor",
                "must be in (0, 1)",
            ));
        }
        if self.recover_after == 0 {
            return Err(ConfigError::new(
                "budget.recover_after",
                "must be at least 1",
            ));
        }
        if self.target_p99.is_some_and(|t| t.is_zero()) {
            return Err(ConfigError::new(
                "budget.target_p99_ms",
                "must be greater than 0",
            ));
        }
        Ok(())
    }
}

/// What one tick saw.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TickStats {
    /// Calls that finished in the tick.
    pub completed: u64,
    /// Of those, failures (5xx, JSON-RPC errors, `isError` results, timeouts).
    pub errors: u64,
    /// The p99 service time of those and of the calls cancelled in the tick (for a cancelled
    /// call, how long it had run), when there were any.
    pub p99: Option<Duration>,
    /// Cost units admitted in the tick.
    pub admitted_cost: f64,
    /// Calls in flight at the end of the tick.
    pub in_flight: u64,
}

/// The controller's smoothed view after a tick.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Health {
    /// The budget now, cost units per second.
    pub budget: f64,
    /// Smoothed admitted cost per second.
    pub rate: f64,
    /// Smoothed calls in flight.
    pub in_flight: f64,
    /// Smoothed error rate.
    pub error_rate: f64,
    /// Smoothed p99 service time in seconds.
    pub p99: f64,
    /// The p99 learned while healthy, in seconds.
    pub baseline_p99: Option<f64>,
    /// Whether this tick was healthy.
    pub healthy: bool,
    /// Healthy ticks in a row.
    pub healthy_streak: u32,
}

/// Weight of one tick in the learned baseline: slow, so a storm does not teach it.
const BASELINE_ALPHA: f64 = 0.05;
/// Ticks with finished calls the baseline averages before the latency rule uses it.
pub const BASELINE_WARMUP: u32 = 20;

/// The pure controller: feed it one [`TickStats`] per tick.
#[derive(Debug, Clone)]
pub struct Controller {
    config: BudgetConfig,
    rate: Ewma,
    in_flight: Ewma,
    error_rate: Ewma,
    p99: Ewma,
    baseline: Ewma,
    baseline_samples: u32,
    budget: f64,
    streak: u32,
}

impl Controller {
    /// A controller at its stable budget.
    pub fn new(config: BudgetConfig) -> Self {
        let alpha = config.alpha;
        Controller {
            budget: config.stable_budget,
            rate: Ewma::new(alpha),
            in_flight: Ewma::new(alpha),
            error_rate: Ewma::new(alpha),
            p99: Ewma::new(alpha),
            baseline: Ewma::new(BASELINE_ALPHA),
            baseline_samples: 0,
            streak: 0,
            config,
        }
    }

    /// The budget now.
    pub fn budget(&self) -> f64 {
        self.budget
    }

    /// The settings.
    pub fn config(&self) -> &BudgetConfig {
        &self.config
    }

    /// Takes new settings, keeping what was learned; the budget is clamped to the new range.
    pub fn reconfigure(&mut self, config: BudgetConfig) {
        self.budget = self.budget.clamp(config.floor(), config.stable_budget);
        self.config = config;
    }

    fn latency_limit(&self) -> Option<f64> {
        match self.config.target_p99 {
            Some(t) => Some(t.as_secs_f64()),
            None => self
                .baseline
                .value()
                .filter(|_| self.baseline_samples >= BASELINE_WARMUP)
                .map(|b| {
                    (b * self.config.latency_tolerance)
                        .max(b + self.config.latency_floor.as_secs_f64())
                }),
        }
    }

    /// The plain mean of the first [`BASELINE_WARMUP`] samples (so the first one does not
    /// dominate), then a slow EWMA.
    fn learn_baseline(&mut self, sample: f64) {
        self.baseline_samples = self.baseline_samples.saturating_add(1);
        match self.baseline.value() {
            Some(mean) if self.baseline_samples <= BASELINE_WARMUP => {
                let n = f64::from(self.baseline_samples);
                self.baseline = Ewma::new(BASELINE_ALPHA);
                self.baseline.update(mean + (sample - mean) / n);
            }
            _ => {
                self.baseline.update(sample);
            }
        }
    }

    /// Folds in one tick and moves the budget.
    pub fn tick(&mut self, stats: TickStats) -> Health {
        let secs = self.config.sample_interval.as_secs_f64();
        let rate = self.rate.update(stats.admitted_cost / secs);
        let in_flight = self.in_flight.update(stats.in_flight as f64);
        let error_sample = match stats.completed {
            0 => 0.0,
            n => stats.errors as f64 / n as f64,
        };
        let raw_p99 = stats.p99.map(|p| p.as_secs_f64());
        let p99_sample = raw_p99.or(self.baseline.value());
        let error_rate = self.error_rate.update(error_sample);
        let p99 = match p99_sample {
            Some(s) => self.p99.update(s),
            None => self.p99.value().unwrap_or(0.0),
        };
        let slow = self.latency_limit().is_some_and(|limit| p99 > limit);
        let healthy = !slow && error_rate <= self.config.max_error_rate;
        if healthy {
            self.streak += 1;
            // The baseline learns only while nothing holds the load back (healthy at the
            // stable budget): under a cut budget the latency sits just under the limit, and
            // learning from it would raise the limit step by step.
            if let Some(raw) = raw_p99
                && self.budget >= self.config.stable_budget
            {
                self.learn_baseline(raw);
            }
            if self.streak >= self.config.recover_after {
                self.budget =
                    (self.budget + self.config.recover_step()).min(self.config.stable_budget);
            }
        } else {
            self.streak = 0;
            self.budget = (self.budget * self.config.decrease_factor).max(self.config.floor());
        }
        Health {
            budget: self.budget,
            rate,
            in_flight,
            error_rate,
            p99,
            baseline_p99: self.baseline.value(),
            healthy,
            healthy_streak: self.streak,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tick(p99_ms: u64, errors: u64) -> TickStats {
        TickStats {
            completed: 100,
            errors,
            p99: Some(Duration::from_millis(p99_ms)),
            admitted_cost: 50.0,
            in_flight: 5,
        }
    }

    #[test]
    fn defaults_follow_the_seed_and_validate() {
        let c = BudgetConfig::default();
        assert_eq!(c.sample_interval, Duration::from_millis(100));
        assert_eq!(c.alpha, 0.4);
        assert_eq!(c.recover_after, 3);
        assert_eq!(c.recover_step(), 50.0);
        c.validate().unwrap();
    }

    #[test]
    fn validation_names_the_field() {
        let bad = |f: fn(&mut BudgetConfig)| {
            let mut c = BudgetConfig::default();
            f(&mut c);
            c.validate().unwrap_err().to_string()
        };
        assert_eq!(bad(|c| c.alpha = 0.0), "budget.alpha: must be in (0, 1]");
        assert_eq!(bad(|c| c.alpha = 1.5), "budget.alpha: must be in (0, 1]");
        assert_eq!(
            bad(|c| c.decrease_factor = 1.0),
            "budget.decrease_factor: must be in (0, 1)"
        );
        assert_eq!(
            bad(|c| c.floor = Some(5000.0)),
            "budget.floor: must not exceed stable_budget"
        );
        assert_eq!(
            bad(|c| c.recover_after = 0),
            "budget.recover_after: must be at least 1"
        );
        assert_eq!(
            bad(|c| c.sample_interval = Duration::ZERO),
            "budget.sample_interval_ms: must be greater than 0"
        );
    }

    #[test]
    fn an_unhealthy_tick_resets_the_streak_to_zero() {
        let mut c = Controller::new(BudgetConfig {
            target_p99: Some(Duration::from_millis(500)),
            ..BudgetConfig::default()
        });
        for _ in 0..5 {
            c.tick(tick(200, 0));
        }
        assert_eq!(c.tick(tick(200, 0)).healthy_streak, 6);
        // One noisy tick: 50% errors lifts the smoothed error rate over 10%.
        let h = c.tick(tick(200, 50));
        assert!(!h.healthy);
        assert_eq!(h.healthy_streak, 0);
    }

    #[test]
    fn a_millisecond_of_noise_on_a_fast_backend_is_not_unhealthy() {
        fn ticks(c: &mut Controller, p99_us: u64, n: usize) -> Health {
            let mut last = None;
            for _ in 0..n {
                last = Some(c.tick(TickStats {
                    p99: Some(Duration::from_micros(p99_us)),
                    ..tick(0, 0)
                }));
            }
            last.unwrap()
        }
        // A 1.5 ms backend learned as the baseline, then one noisy 8 ms tick (its smoothed
        // p99 4.1 ms: 2.7x the baseline, but 2.6 ms over it, within the 5 ms floor).
        let mut c = Controller::new(BudgetConfig::default());
        ticks(&mut c, 1500, 30);
        let h = ticks(&mut c, 8000, 1);
        assert!(h.healthy, "{h:?}");
        assert_eq!(h.budget, 1000.0);
        ticks(&mut c, 1500, 10);
        // 20 ms is over both the ratio and the floor: unhealthy.
        let h = ticks(&mut c, 20_000, 5);
        assert!(!h.healthy, "{h:?}");
        assert!(h.budget < 1000.0);
    }
}
