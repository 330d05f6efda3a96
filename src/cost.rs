//! Tool weights: what one call of each tool costs the budgets.
//!
//! A cached read and a billion-row scan are not the same call. Each tool has a weight in
//! cost units: fixed in config (e.g. a cached read 1, a large scan 50, a non-idempotent write
//! 100) or `auto`, learned from the tool's smoothed service time and answer size relative to
//! one cost unit: the cheapest tool configured at weight 1 as observed, but never less than
//! [`UNIT_TIME`] and [`UNIT_BYTES`] (so an `auto` tool is not measured against itself or other
//! auto tools), doubled for tools marked non-idempotent, clamped to `[min_weight,
//! max_weight]`, refreshed on every budget tick.
//! Tools not listed weigh `default_weight` (1). The classifier writes the weight into
//! [`Call::cost`](crate::Call), and every budget charges it.

use crate::error::ConfigError;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use crate::snapshot::{Live, Part, Snapshot};

use dashmap::DashMap;
use serde::{Deserialize, Serialize};

use crate::outcome::{Observation, Observer, Outcome};
use crate::stats::Ewma;

/// A tool's weight in config: a number, or `"auto"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Weight {
    /// A fixed weight (>= 1).
    Fixed(u32),
    /// Learned from the tool's observed cost.
    Auto(AutoWeight),
}

/// The word `auto`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AutoWeight {
    /// Learn the weight.
    Auto,
}

/// Tool weight settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct CostConfig {
    /// Weight per tool.
    pub tools: BTreeMap<String, Weight>,
    /// Tools whose calls are not idempotent (writes): their learned weight is doubled.
    pub non_idempotent: BTreeSet<String>,
    /// Weight of tools not listed. Default 1.
    pub default_weight: u32,
    /// Lower clamp of learned weights. Default 1.
    pub min_weight: u32,
    /// Upper clamp of learned weights. Default 100, the weight of a non-idempotent write, the
    /// heaviest kind of call in the module's examples.
    pub max_weight: u32,
}

impl Default for CostConfig {
    fn default() -> Self {
        CostConfig {
            tools: BTreeMap::new(),
            non_idempotent: BTreeSet::new(),
            default_weight: 1,
            min_weight: 1,
            max_weight: 100,
        }
    }
}

impl CostConfig {
    /// Checks every rule; the error names the field and the rule.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.min_weight == 0 {
            return Err(ConfigError::new("costs.min_weight", "must be at least 1"));
        }
        if self.max_weight < self.min_weight {
            return Err(ConfigError::new(
                "costs.max_weight",
                "must be at least min_weight",
            ));
        }
        if self.default_weight == 0 {
            return Err(ConfigError::new(
                "costs.default_weight",
                "must be at least 1",
            ));
        }
        if let Some((tool, _)) = self.tools.iter().find(|(_, w)| **w == Weight::Fixed(0)) {
            return Err(ConfigError::new(
                format!("costs.tools.{tool}"),
                "must be at least 1",
            ));
        }
        Ok(())
    }

    /// The largest weight any call can have.
    pub fn max_possible_weight(&self) -> u32 {
        let fixed = self.tools.values().filter_map(|w| match w {
            Weight::Fixed(n) => Some(*n),
            Weight::Auto(_) => None,
        });
        fixed
            .chain([self.default_weight])
            .chain(
                self.tools
                    .values()
                    .any(|w| matches!(w, Weight::Auto(_)))
                    .then_some(self.max_weight),
            )
            .max()
            .unwrap_or(1)
    }
}

/// Smoothing of the per-tool service time and size.
const LEARN_ALPHA: f64 = 0.2;
/// The least service time one cost unit stands for, in seconds: 5 ms, the default
/// `latency_floor_ms` under which latency differences are noise. An `auto` tool of 50 ms weighs
/// at most 10.
pub const UNIT_TIME: f64 = 0.005;
/// The least answer size one cost unit stands for, in bytes (1 KiB).
pub const UNIT_BYTES: f64 = 1024.0;

#[derive(Debug)]
struct Learned {
    weight: AtomicU32,
    stats: Mutex<(Ewma, Ewma)>,
}

/// The weight table: read on every classified call, learned from every outcome.
#[derive(Debug)]
pub struct Costs {
    config: Live<CostConfig>,
    learned: DashMap<String, Learned>,
}

impl Costs {
    /// A table from its settings (assumed valid).
    pub fn new(config: CostConfig) -> Self {
        let costs = Costs {
            config: Live::new(CostConfig::default()),
            learned: DashMap::new(),
        };
        costs.reconfigure(config);
        costs
    }

    /// Takes new settings (assumed valid), keeping the weights learned for tools still `auto`.
    pub fn reconfigure(&self, config: CostConfig) {
        for (tool, w) in &config.tools {
            // Auto tools are learned, and the tools of weight 1 are measured as the unit.
            if matches!(w, Weight::Auto(_) | Weight::Fixed(1)) {
                self.learned.entry(tool.clone()).or_insert_with(|| Learned {
                    weight: AtomicU32::new(config.min_weight),
                    stats: Mutex::new((Ewma::new(LEARN_ALPHA), Ewma::new(LEARN_ALPHA))),
                });
            }
        }
        self.learned.retain(|tool, _| {
            matches!(
                config.tools.get(tool),
                Some(Weight::Auto(_) | Weight::Fixed(1))
            )
        });
        self.config.store(Arc::new(config));
    }

    /// The settings.
    pub fn config(&self) -> Arc<CostConfig> {
        self.config.load()
    }

    /// The table's entry in a snapshot taken now.
    pub(crate) fn part(&self) -> Part {
        self.config.part()
    }

    /// The weight of one call of `tool` now.
    pub fn weight(&self, tool: &str) -> u32 {
        self.weight_in(tool, None)
    }

    /// The weight of one call of `tool` under a request's snapshot.
    pub(crate) fn weight_in(&self, tool: &str, snapshot: Option<&Snapshot>) -> u32 {
        let config = self.config.read(snapshot);
        match config.tools.get(tool) {
            Some(Weight::Fixed(n)) => *n,
            Some(Weight::Auto(_)) => self
                .learned
                .get(tool)
                .map_or(config.min_weight, |l| l.weight.load(Ordering::Relaxed)),
            None => config.default_weight,
        }
    }

    /// Recomputes the learned weights: each `auto` tool's smoothed service time and answer
    /// size relative to the cheapest observed `auto` tool (the larger of the two ratios),
    /// doubled when non-idempotent, clamped. Runs on the budget's tick.
    pub fn refresh(&self) {
        let stats: Vec<(String, f64, f64)> = self
            .learned
            .iter()
            .filter_map(|e| {
                let (t, b) = *e.stats.lock().unwrap_or_else(PoisonError::into_inner);
                Some((e.key().clone(), t.value()?, b.value().unwrap_or(0.0)))
            })
            .collect();
        let config = self.config.load();
        let unit = |t: &String| config.tools.get(t) == Some(&Weight::Fixed(1));
        // The cheapest weight-1 tool: the smallest of their figures, but at least the floor.
        let cheapest = |pick: fn(&(String, f64, f64)) -> f64, floor: f64| {
            stats
                .iter()
                .filter(|s| unit(&s.0))
                .map(pick)
                .reduce(f64::min)
                .map_or(floor, |v| v.max(floor))
        };
        let (unit_time, unit_bytes) = (cheapest(|s| s.1, UNIT_TIME), cheapest(|s| s.2, UNIT_BYTES));
        for (tool, time, bytes) in stats {
            if !matches!(config.tools.get(&tool), Some(Weight::Auto(_))) {
                continue; // a weight-1 tool, measured as the unit
            }
            let mut w = (time / unit_time).max(bytes / unit_bytes).round();
            if config.non_idempotent.contains(&tool) {
                w *= 2.0;
            }
            let w = (w as u32).clamp(config.min_weight, config.max_weight);
            if let Some(l) = self.learned.get(&tool) {
                l.weight.store(w, Ordering::Relaxed);
            }
        }
    }
}

impl Observer for Costs {
    fn observe(&self, o: &Observation<'_>) {
        if o.outcome != Outcome::Ok {
            return;
        }
        let Some(tool) = o.call.tool.as_deref() else {
            return;
        };
        if let Some(l) = self.learned.get(tool) {
            let mut stats = l.stats.lock().unwrap_or_else(PoisonError::into_inner);
            stats.0.update(o.service_time.as_secs_f64());
            stats.1.update(o.response_bytes as f64);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::Call;

    fn observe(costs: &Costs, tool: &str, ms: u64, bytes: u64) {
        let call = Call::request("tools/call").with_tool(tool);
        costs.observe(&Observation {
            call: &call,
            outcome: Outcome::Ok,
            service_time: Duration::from_millis(ms),
            response_bytes: bytes,
            queue_wait: Duration::ZERO,
        });
    }

    #[test]
    fn fixed_auto_and_default_weights() {
        let config: CostConfig = serde_json::from_str(
            r#"{"tools":{"cache_get":1,"sql_scan":50,"vector_search":"auto","create_order":"auto",
                "cheap":"auto"},"non_idempotent":["create_order"]}"#,
        )
        .unwrap();
        config.validate().unwrap();
        assert_eq!(config.max_possible_weight(), 100);
        let costs = Costs::new(config);
        assert_eq!(costs.weight("cache_get"), 1);
        assert_eq!(costs.weight("sql_scan"), 50);
        assert_eq!(costs.weight("unknown"), 1);
        assert_eq!(costs.weight("vector_search"), 1, "min until learned");
        for _ in 0..20 {
            observe(&costs, "cheap", 2, 100);
            observe(&costs, "vector_search", 50, 300);
            observe(&costs, "create_order", 10, 100);
            observe(&costs, "cache_get", 8, 100);
        }
        costs.refresh();
        // One unit: the weight-1 tool cache_get (8 ms), not the cheapest auto tool (2 ms).
        assert_eq!(costs.weight("cheap"), 1, "2 ms / 8 ms, at least min_weight");
        assert_eq!(costs.weight("vector_search"), 6, "50 ms / 8 ms = 6.25");
        assert_eq!(
            costs.weight("create_order"),
            2,
            "10 ms / 8 ms = 1.25 -> 1, doubled"
        );
        assert_eq!(costs.weight("cache_get"), 1, "fixed");
    }

    #[test]
    fn the_only_auto_tool_is_not_measured_against_itself() {
        // Measured against itself, the only auto tool would always weigh 1. A 0.35 ms
        // weight-1 cache is under the 5 ms floor of a unit: 50 ms weighs 10.
        let config: CostConfig =
            serde_json::from_str(r#"{"tools":{"cache_get":1,"vector_search":"auto"}}"#).unwrap();
        let costs = Costs::new(config);
        for _ in 0..20 {
            let call = Call::request("tools/call").with_tool("cache_get");
            costs.observe(&Observation {
                call: &call,
                outcome: Outcome::Ok,
                service_time: Duration::from_micros(350),
                response_bytes: 200,
                queue_wait: Duration::ZERO,
            });
            observe(&costs, "vector_search", 50, 600);
        }
        costs.refresh();
        assert_eq!(costs.weight("vector_search"), 10);
        // Without any weight-1 tool: against the floor alone.
        let alone: CostConfig =
            serde_json::from_str(r#"{"tools":{"vector_search":"auto"}}"#).unwrap();
        let alone = Costs::new(alone);
        for _ in 0..20 {
            observe(&alone, "vector_search", 50, 600);
        }
        alone.refresh();
        assert_eq!(alone.weight("vector_search"), 10);
    }

    #[test]
    fn validation_names_the_field() {
        let mut c = CostConfig::default();
        c.tools.insert("x".into(), Weight::Fixed(0));
        assert_eq!(
            c.validate().unwrap_err(),
            ConfigError::new("costs.tools.x", "must be at least 1")
        );
        let c = CostConfig {
            min_weight: 5,
            max_weight: 2,
            ..CostConfig::default()
        };
        assert_eq!(
            c.validate().unwrap_err(),
            ConfigError::new("costs.max_weight", "must be at least min_weight")
        );
    }
}
