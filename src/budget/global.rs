//! The global budget: its bucket, the sample of the tick, the [`Controller`] that moves it, and
//! the trend logged.
//!
//! Every `sample_interval` its [`tick`](Global::tick) smooths the tick's sample (EWMA), moves
//! the budget (multiplicative decrease when unhealthy, additive steps after `recover_after`
//! healthy ticks), re-rates the bucket live, logs a cut or a recovery and sets the budget's
//! gauges. Without tenants it also holds the budget's fair parts among clients.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use super::controller::{BudgetConfig, Controller, Health};
use super::fair;
use super::gcra::{Gcra, interval_for_rate};
use super::sampler::Sampler;
use super::trend::{Phase, Trend};
use crate::metrics;
use crate::policy::Policy;

/// The global budget and what moves it.
pub(super) struct Global {
    /// The weighted-cost bucket whose rate is the budget (divided among the nodes in `local`
    /// fallback).
    pub(super) bucket: Gcra,
    /// What the tick's calls cost and how they went.
    pub(super) sampler: Sampler,
    controller: Mutex<Controller>,
    /// The controller's view after the last tick.
    health: Mutex<Health>,
    /// The cuts and recoveries logged.
    trend: Mutex<Trend>,
    /// Without tenants: the budget's fair parts among its clients.
    pub(super) fair: fair::Part,
}

impl Global {
    /// At the stable budget, its bucket holding `burst`.
    pub(super) fn new(config: &BudgetConfig, burst: u64) -> Self {
        let stable = config.stable_budget;
        Global {
            bucket: Gcra::new(interval_for_rate(stable.get()), burst),
            sampler: Sampler::new(),
            controller: Mutex::new(Controller::new(config.clone())),
            health: Mutex::new(Health {
                budget: stable.get(),
                ..Health::default()
            }),
            trend: Mutex::new(Trend::default()),
            fair: fair::Part::new(stable.get()),
        }
    }

    /// The controller's view after the last tick.
    pub(super) fn health(&self) -> Health {
        *self.health.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// New settings, keeping the controller's averages and budget (clamped to the new range)
    /// and the bucket's debt.
    pub(super) fn reconfigure(&self, config: BudgetConfig, burst: u64) {
        self.controller
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .reconfigure(config);
        self.bucket.set_burst(burst);
    }

    /// The rate the budget rules now: the controller's while `adaptive_budget` is on, else the
    /// stable budget (the controller keeps learning in every mode).
    pub(super) fn rate(&self, policy: &Policy, config: &BudgetConfig) -> f64 {
        if policy.features.adaptive_budget {
            self.health().budget
        } else {
            config.stable_budget.get()
        }
    }

    /// Re-rates the bucket at [`rate`](Self::rate) divided by `divisor` (the node count in
    /// `local` fallback, else 1).
    pub(super) fn rerate(&self, now: u64, policy: &Policy, config: &BudgetConfig, divisor: f64) {
        let rate = self.rate(policy, config);
        self.bucket
            .set_interval(now, interval_for_rate(rate / divisor));
    }

    /// Pins the bucket at the stable budget while `adaptive_budget` is off.
    pub(super) fn apply(&self, now: u64, policy: &Policy, config: &BudgetConfig) {
        if !policy.features.adaptive_budget {
            self.bucket
                .set_interval(now, interval_for_rate(config.stable_budget.get()));
        }
    }

    /// Without tenants: sets the fair parts of `rate` among the active clients' `demands`.
    pub(super) fn share(&self, rate: f64, demands: impl IntoIterator<Item = Vec<f64>>) {
        let mut demands: Vec<f64> = demands.into_iter().flatten().collect();
        self.fair.set(rate, &mut demands);
    }

    /// Ends the tick: smooths it, moves the budget, re-rates the bucket, logs the trend (at
    /// `elapsed` since the budget's epoch) and sets the gauges.
    pub(super) fn tick(
        &self,
        now: u64,
        elapsed: Duration,
        policy: &Policy,
        config: &BudgetConfig,
        divisor: f64,
    ) -> Health {
        let stats = self.sampler.take(config.sample_interval.get());
        let health = self
            .controller
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .tick(stats);
        let before = std::mem::replace(
            &mut *self.health.lock().unwrap_or_else(PoisonError::into_inner),
            health,
        );
        self.rerate(now, policy, config, divisor);
        let phase = self
            .trend
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .update(
                elapsed,
                before.budget,
                health.budget,
                config.stable_budget.get(),
            );
        match phase {
            Some(Phase::Cut) => tracing::warn!(
                from = before.budget,
                to = health.budget,
                error_rate = health.error_rate,
                p99_ms = health.p99 * 1e3,
                "global budget cut: the backend looks unhealthy"
            ),
            Some(Phase::Recovering) => {
                tracing::info!(budget = health.budget, "global budget recovering")
            }
            Some(Phase::Stable) => {
                tracing::info!(budget = health.budget, "global budget back at stable")
            }
            None => {}
        }
        ::metrics::gauge!(metrics::BUDGET).set(health.budget);
        ::metrics::gauge!(metrics::BUDGET_RATE).set(health.rate);
        ::metrics::gauge!(metrics::BUDGET_ERROR_RATE).set(health.error_rate);
        ::metrics::gauge!(metrics::BUDGET_P99).set(health.p99);
        ::metrics::gauge!(metrics::BUDGET_IN_FLIGHT).set(health.in_flight);
        health
    }
}
