//! The EWMA controller: follows the backend's real health like TCP congestion control.
//!
//! ```text
//!  every sample_interval (100 ms):       smoothed with EWMA(alpha)        decide
//!  ┌──────────────────────────┐      ┌────────────────────────────┐   ┌───────────────────────┐
//!  │ admitted cost/s          │ ───► │ rate, in-flight,           │──►│ unhealthy: budget =    │
//!  │ in-flight calls          │      │ failed share, slow share   │   │  max(floor, budget*df) │
//!  │ the median client's      │      └────────────────────────────┘   │ healthy k-th tick in a │
//!  │  failed and slow shares  │   unhealthy = slow share >            │  row, k >= recover_    │
//!  │ p99 (shown, not judged)  │     max_slow_rate or failed share >   │  after: budget +=      │
//!  └──────────────────────────┘     max_error_rate                    │  recover_step, <= stable│
//!                                                                     └───────────────────────┘
//! ```
//!
//! Health is judged per call and aggregated per client: a call is slow when it took longer
//! than its *tool's* healthy latency allows (`latency_tolerance` x the tool's
//! [`Baseline`](crate::stats::Baseline), and at least `latency_floor` over it), or than
//! `target_p99` when that is set; a failure is a server error, an `isError` result or a
//! timeout (client errors are not counted at all). The shares are those of the median active
//! client (the census), so one client failing or calling a slow tool cannot cut the budget for
//! everyone, while trouble most clients see cuts it at once.
//!
//! An unhealthy tick cuts only while the trouble is as bad as on the tick before or worse;
//! while it eases (the last cut taking effect: the shares remember about a second) the budget
//! holds, so one episode does not cut all the way to the floor.
//!
//! A tick with no finished call carries no evidence of trouble: it counts as shares of 0, so
//! a budget cut during a storm recovers once the storm has stopped, even if nothing else is
//! sent.

use crate::error::ConfigError;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::stats::Ewma;
use crate::valid::{AtLeastOne, Factor, Fraction, NonZeroDuration, Positive, Share};
use std::num::NonZeroU32;

/// Settings of the adaptive global budget. Budgets are in cost units per second (a call of
/// weight 50 costs 50 units).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct BudgetConfig {
    /// The budget when the backend is healthy, and the ceiling of recovery. Default 1000.
    pub stable_budget: Positive,
    /// The lowest the budget goes. Default 10% of `stable_budget` (stormgate's choice).
    pub floor: Option<Positive>,
    /// Bucket size in cost units: how much may be spent at once. Default `stable_budget` (one
    /// second of it, as governor's quotas default their burst to their rate), at least the
    /// largest tool weight: a calm newcomer's first call of every tool fits.
    pub burst: Option<AtLeastOne>,
    /// Tick length (`sample_interval_ms`). Default 100 ms.
    #[serde(rename = "sample_interval_ms")]
    pub sample_interval: NonZeroDuration,
    /// EWMA smoothing, in (0, 1]. Default 0.4, in the middle of the usual 0.3 to 0.5.
    pub alpha: Fraction,
    /// A call slower than this is slow, whatever its tool (`target_p99_ms`). Absent (the
    /// default): each call is judged against its own tool's healthy latency instead.
    #[serde(rename = "target_p99_ms")]
    pub target_p99: Option<NonZeroDuration>,
    /// Without `target_p99`, a call is slow above this multiple of its tool's healthy latency
    /// (`Baseline`). Default 2.0 (stormgate's choice).
    pub latency_tolerance: Positive,
    /// Without `target_p99`, a call at most this much over its tool's healthy latency is never
    /// slow, whatever the ratio (`latency_floor_ms`): a millisecond of scheduling noise on a
    /// 1.5 ms tool is not distress. Default 5 ms.
    #[serde(rename = "latency_floor_ms", with = "crate::duration_ms")]
    pub latency_floor: Duration,
    /// Unhealthy when the median client's smoothed share of failed calls exceeds this.
    /// Default 0.1 (stormgate's choice; a typical storm drops success from 97% to 62%).
    pub max_error_rate: Share,
    /// Unhealthy when the median client's smoothed share of slow calls exceeds this.
    /// Default 0.1 (stormgate's choice).
    pub max_slow_rate: Share,
    /// Multiplier applied on an unhealthy tick, in (0, 1). Default 0.7 (stormgate's choice,
    /// as TCP CUBIC).
    pub decrease_factor: Factor,
    /// Healthy ticks in a row before recovery starts. Default 3.
    pub recover_after: NonZeroU32,
    /// Additive step per further healthy tick. Default 5% of `stable_budget`, the cautious end
    /// of a 5-10% step.
    pub recover_step: Option<Positive>,
}

impl Default for BudgetConfig {
    fn default() -> Self {
        BudgetConfig {
            stable_budget: Positive::of(1000.0),
            floor: None,
            burst: None,
            sample_interval: NonZeroDuration::of(Duration::from_millis(100)),
            alpha: Fraction::of(0.4),
            target_p99: None,
            latency_tolerance: Positive::of(2.0),
            latency_floor: Duration::from_millis(5),
            max_error_rate: Share::of(0.1),
            max_slow_rate: Share::of(0.1),
            decrease_factor: Factor::of(0.7),
            recover_after: NonZeroU32::new(3).unwrap(),
            recover_step: None,
        }
    }
}

impl BudgetConfig {
    /// The floor in effect.
    pub fn floor(&self) -> f64 {
        self.floor
            .map_or(self.stable_budget.get() * 0.1, Positive::get)
    }

    /// The recovery step in effect.
    pub fn recover_step(&self) -> f64 {
        self.recover_step
            .map_or(self.stable_budget.get() * 0.05, Positive::get)
    }

    /// Whether a call of `secs` is slow, given its tool's healthy latency (`None`: not learned
    /// yet, so nothing is slow but what passes `target_p99`).
    pub fn is_slow(&self, secs: f64, baseline: Option<f64>) -> bool {
        match (self.target_p99, baseline) {
            (Some(target), _) => secs > target.get().as_secs_f64(),
            (None, Some(b)) => {
                secs > (b * self.latency_tolerance.get()).max(b + self.latency_floor.as_secs_f64())
            }
            (None, None) => false,
        }
    }

    /// The bucket size in effect, given the largest tool weight.
    pub fn burst(&self, max_weight: u32) -> f64 {
        self.burst
            .map_or(self.stable_budget.get(), AtLeastOne::get)
            .max(f64::from(max_weight))
            .max(1.0)
    }

    /// Checks the rule between fields (each field's own range is its type's); the error
    /// names the field and the rule.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.floor() > self.stable_budget.get() {
            return Err(ConfigError::new(
                "budget.floor",
                "must not exceed stable_budget",
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
    /// Of those, failures (server errors, `isError` results, timeouts).
    pub errors: u64,
    /// The median active client's share of failed calls, over the census's memory.
    pub failed_share: f64,
    /// The median active client's share of slow calls, over the census's memory.
    pub slow_share: f64,
    /// Clients active in the census.
    pub clients: usize,
    /// The p99 service time of the calls finished or cancelled in the tick (for a cancelled
    /// call, how long it had run), when there were any: shown, not judged.
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
    /// The median client's smoothed share of failed calls.
    pub error_rate: f64,
    /// The median client's smoothed share of slow calls.
    pub slow_rate: f64,
    /// Clients active in the last tick's census.
    pub clients: usize,
    /// Smoothed p99 service time in seconds, all tools together (shown, not judged).
    pub p99: f64,
    /// Whether this tick was healthy.
    pub healthy: bool,
    /// Healthy ticks in a row.
    pub healthy_streak: u32,
}

/// The pure controller: feed it one [`TickStats`] per tick.
#[derive(Debug, Clone)]
pub struct Controller {
    config: BudgetConfig,
    rate: Ewma,
    in_flight: Ewma,
    error_rate: Ewma,
    slow_rate: Ewma,
    p99: Ewma,
    /// How far past its limits the last tick was (the larger of the two shares over its
    /// limit), to tell a worsening tick from one still recovering from a cut.
    distress: f64,
    budget: f64,
    streak: u32,
}

impl Controller {
    /// A controller at its stable budget.
    pub fn new(config: BudgetConfig) -> Self {
        let alpha = config.alpha;
        Controller {
            budget: config.stable_budget.get(),
            rate: Ewma::new(alpha.get()),
            in_flight: Ewma::new(alpha.get()),
            error_rate: Ewma::with_prior(alpha.get(), 0.0),
            slow_rate: Ewma::with_prior(alpha.get(), 0.0),
            p99: Ewma::new(alpha.get()),
            streak: 0,
            distress: 0.0,
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
        self.budget = self
            .budget
            .clamp(config.floor(), config.stable_budget.get());
        self.config = config;
    }

    /// Folds in one tick and moves the budget.
    pub fn tick(&mut self, stats: TickStats) -> Health {
        let secs = self.config.sample_interval.get().as_secs_f64();
        let rate = self.rate.update(stats.admitted_cost / secs);
        let in_flight = self.in_flight.update(stats.in_flight as f64);
        let error_rate = self.error_rate.update(stats.failed_share);
        let slow_rate = self.slow_rate.update(stats.slow_share);
        let p99 = match stats.p99 {
            Some(p) => self.p99.update(p.as_secs_f64()),
            None => self.p99.value().unwrap_or(0.0),
        };
        let healthy = error_rate <= self.config.max_error_rate.get()
            && slow_rate <= self.config.max_slow_rate.get();
        let distress = (error_rate / self.config.max_error_rate.get().max(1e-9))
            .max(slow_rate / self.config.max_slow_rate.get().max(1e-9));
        let improving = distress < self.distress;
        self.distress = distress;
        if healthy {
            self.streak += 1;
            if self.streak >= self.config.recover_after.get() {
                self.budget =
                    (self.budget + self.config.recover_step()).min(self.config.stable_budget.get());
            }
        } else {
            self.streak = 0;
            // Cut while it gets worse (or stays as bad); while it improves, the last cut is
            // still taking effect (the shares remember about a second): hold.
            if !improving {
                self.budget =
                    (self.budget * self.config.decrease_factor.get()).max(self.config.floor());
            }
        }
        Health {
            budget: self.budget,
            rate,
            in_flight,
            error_rate,
            slow_rate,
            clients: stats.clients,
            p99,
            healthy,
            healthy_streak: self.streak,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tick(failed_share: f64) -> TickStats {
        TickStats {
            completed: 100,
            failed_share,
            clients: 5,
            p99: Some(Duration::from_millis(200)),
            admitted_cost: 50.0,
            in_flight: 5,
            ..TickStats::default()
        }
    }

    #[test]
    fn defaults_follow_the_seed_and_validate() {
        let c = BudgetConfig::default();
        assert_eq!(
            c.sample_interval,
            NonZeroDuration::new(Duration::from_millis(100)).unwrap()
        );
        assert_eq!(c.alpha, Fraction::new(0.4).unwrap());
        assert_eq!(c.recover_after.get(), 3);
        assert_eq!(c.recover_step(), 50.0);
        c.validate().unwrap();
    }

    #[test]
    fn a_value_out_of_range_is_refused_naming_the_field() {
        let bad = |budget: serde_json::Value| {
            crate::control::Config::read(serde_json::json!({ "budget": budget }))
                .and_then(|c| Ok(c.validate()?))
                .unwrap_err()
                .to_string()
        };
        let alpha = "budget.alpha: must be in (0, 1]";
        assert_eq!(bad(serde_json::json!({"alpha": 0.0})), alpha);
        assert_eq!(bad(serde_json::json!({"alpha": 1.5})), alpha);
        assert_eq!(
            bad(serde_json::json!({"decrease_factor": 1.0})),
            "budget.decrease_factor: must be in (0, 1)"
        );
        assert_eq!(
            bad(serde_json::json!({"floor": 5000.0})),
            "budget.floor: must not exceed stable_budget"
        );
        assert!(
            bad(serde_json::json!({"recover_after": 0})).starts_with("budget.recover_after: "),
            "a NonZeroU32"
        );
        assert_eq!(
            bad(serde_json::json!({"sample_interval_ms": 0})),
            "budget.sample_interval_ms: must be greater than 0"
        );
    }

    #[test]
    fn an_unhealthy_tick_resets_the_streak_to_zero() {
        let mut c = Controller::new(BudgetConfig {
            target_p99: Some(NonZeroDuration::new(Duration::from_millis(500)).unwrap()),
            ..BudgetConfig::default()
        });
        for _ in 0..5 {
            c.tick(tick(0.0));
        }
        assert_eq!(c.tick(tick(0.0)).healthy_streak, 6);
        // One noisy tick: 50% errors lifts the smoothed error rate over 10%.
        let h = c.tick(tick(0.5));
        assert!(!h.healthy);
        assert_eq!(h.healthy_streak, 0);
    }

    #[test]
    fn a_call_is_slow_against_its_own_tools_baseline_with_a_floor() {
        let c = BudgetConfig::default();
        // Nothing learned yet: nothing is slow.
        assert!(!c.is_slow(100.0, None));
        // A 1.5 ms tool: 6.4 ms is 4.3x, but within 5 ms of it; 6.6 ms is slow.
        assert!(!c.is_slow(0.0064, Some(0.0015)));
        assert!(c.is_slow(0.0066, Some(0.0015)));
        // A 200 ms tool: slow above 2x.
        assert!(!c.is_slow(0.4, Some(0.2)));
        assert!(c.is_slow(0.401, Some(0.2)));
        // A target applies to every tool alike.
        let t = BudgetConfig {
            target_p99: Some(NonZeroDuration::new(Duration::from_millis(300)).unwrap()),
            ..BudgetConfig::default()
        };
        assert!(t.is_slow(0.301, None));
        assert!(!t.is_slow(0.3, Some(0.001)));
    }

    #[test]
    fn the_median_clients_slow_share_cuts_and_recovery_follows() {
        let mut c = Controller::new(BudgetConfig::default());
        let slow = |share| TickStats {
            slow_share: share,
            ..tick(0.0)
        };
        // From a prior of 0: 0.4 x 0.2 = 0.08, healthy; then 0.4 x 0.5 + 0.6 x 0.08, not.
        assert!(c.tick(slow(0.2)).healthy);
        let h = c.tick(slow(0.5));
        assert!(!h.healthy, "{h:?}");
        assert_eq!(h.budget, 700.0);
        assert!((h.slow_rate - (0.4 * 0.5 + 0.6 * 0.08)).abs() < 1e-12);
    }
}
