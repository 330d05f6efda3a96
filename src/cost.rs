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
use crate::valid::OutOfRange;
use serde::Serializer;
use serde::de::{self, Deserializer, Visitor};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use crate::snapshot::{Live, Snapshot};

use dashmap::DashMap;
use std::hash::BuildHasherDefault;

use crate::bounded::{PassThrough, key_of};
use crate::call::Name;
use serde::{Deserialize, Serialize};

use crate::outcome::{Observation, Observer, Outcome};
use crate::stats::Ewma;

/// A tool's weight in config: a whole number of cost units, at least 1, or `"auto"`.
///
/// ```
/// use stormgate::cost::Weight;
///
/// assert_eq!(Weight::fixed(50).unwrap(), serde_json::from_str("50").unwrap());
/// assert_eq!(Weight::Auto, serde_json::from_str(r#""auto""#).unwrap());
/// assert!(Weight::fixed(0).is_err());
/// let err = serde_json::from_str::<Weight>("0").unwrap_err();
/// assert!(err.to_string().starts_with(r#"must be at least 1, or "auto""#), "{err}");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Weight {
    /// A fixed weight.
    Fixed(NonZeroU32),
    /// Learned from the tool's observed cost.
    Auto,
}

impl Weight {
    /// A fixed weight of `units`, if at least 1.
    pub const fn fixed(units: u32) -> Result<Weight, OutOfRange> {
        match NonZeroU32::new(units) {
            Some(units) => Ok(Weight::Fixed(units)),
            None => Err(OutOfRange { rule: WEIGHT_RULE }),
        }
    }

    /// Whether this is the fixed weight 1, the unit the `auto` weights are measured against.
    fn is_unit(self) -> bool {
        self == Weight::Fixed(NonZeroU32::MIN)
    }
}

const WEIGHT_RULE: &str = "must be at least 1, or \"auto\"";

impl Serialize for Weight {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Weight::Fixed(n) => s.serialize_u32(n.get()),
            Weight::Auto => s.serialize_str("auto"),
        }
    }
}

impl<'de> Deserialize<'de> for Weight {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Weight, D::Error> {
        struct Units;
        impl Visitor<'_> for Units {
            type Value = Weight;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a weight of at least 1, or \"auto\"")
            }

            fn visit_u64<E: de::Error>(self, n: u64) -> Result<Weight, E> {
                let n = u32::try_from(n).map_err(|_| E::custom("must be at most 4294967295"))?;
                Weight::fixed(n).map_err(E::custom)
            }

            fn visit_i64<E: de::Error>(self, n: i64) -> Result<Weight, E> {
                match u64::try_from(n) {
                    Ok(n) => self.visit_u64(n),
                    Err(_) => Err(E::custom(WEIGHT_RULE)),
                }
            }

            fn visit_str<E: de::Error>(self, s: &str) -> Result<Weight, E> {
                match s {
                    "auto" => Ok(Weight::Auto),
                    _ => Err(E::invalid_value(de::Unexpected::Str(s), &self)),
                }
            }
        }
        d.deserialize_any(Units)
    }
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
    pub default_weight: NonZeroU32,
    /// Lower clamp of learned weights. Default 1.
    pub min_weight: NonZeroU32,
    /// Upper clamp of learned weights. Default 100, the weight of a non-idempotent write, the
    /// heaviest kind of call in the module's examples.
    pub max_weight: NonZeroU32,
}

impl Default for CostConfig {
    fn default() -> Self {
        CostConfig {
            tools: BTreeMap::new(),
            non_idempotent: BTreeSet::new(),
            default_weight: NonZeroU32::MIN,
            min_weight: NonZeroU32::MIN,
            max_weight: NonZeroU32::new(100).unwrap(),
        }
    }
}

impl CostConfig {
    /// Checks the rule between fields (each weight's own range is its type's); the error
    /// names the field and the rule.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.max_weight < self.min_weight {
            return Err(ConfigError::new(
                "costs.max_weight",
                "must be at least min_weight",
            ));
        }
        Ok(())
    }

    /// The largest weight any call can have.
    pub fn max_possible_weight(&self) -> u32 {
        let fixed = self.tools.values().filter_map(|w| match w {
            Weight::Fixed(n) => Some(n.get()),
            Weight::Auto => None,
        });
        fixed
            .chain([self.default_weight.get()])
            .chain(
                self.tools
                    .values()
                    .any(|w| *w == Weight::Auto)
                    .then_some(self.max_weight.get()),
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
    /// The tool's name: checked on every lookup, so two names that share a 64-bit key never
    /// share a weight (the second is not learned, an accident of 2^-64).
    tool: Box<str>,
    weight: AtomicU32,
    stats: Mutex<(Ewma, Ewma)>,
}

/// The weight table: read on every classified call, learned from every outcome.
#[derive(Debug)]
pub struct Costs {
    config: Live<CostConfig>,
    /// The `auto` tools and the tools of weight 1, by their name's key (a call's [`Name`]
    /// carries it: found without hashing).
    learned: DashMap<u64, Learned, BuildHasherDefault<PassThrough>>,
}

impl Costs {
    /// A table from its settings (assumed valid).
    pub fn new(config: CostConfig) -> Self {
        let costs = Costs {
            config: Live::new(CostConfig::default()),
            learned: DashMap::default(),
        };
        costs.reconfigure(config);
        costs
    }

    /// Takes new settings (assumed valid), keeping the weights learned for tools still `auto`.
    pub fn reconfigure(&self, config: CostConfig) {
        for (tool, w) in &config.tools {
            // Auto tools are learned, and the tools of weight 1 are measured as the unit.
            if *w == Weight::Auto || w.is_unit() {
                self.learned.entry(key_of(tool)).or_insert_with(|| Learned {
                    tool: tool.as_str().into(),
                    weight: AtomicU32::new(config.min_weight.get()),
                    stats: Mutex::new((Ewma::new(LEARN_ALPHA), Ewma::new(LEARN_ALPHA))),
                });
            }
        }
        self.learned.retain(|_, l| {
            config
                .tools
                .get(&*l.tool)
                .is_some_and(|w| *w == Weight::Auto || w.is_unit())
        });
        self.config.store(Arc::new(config));
    }

    /// The settings.
    pub fn config(&self) -> Arc<CostConfig> {
        self.config.load()
    }

    /// The table's settings cell, for a control's snapshots.
    pub(crate) fn cell(&self) -> &Live<CostConfig> {
        &self.config
    }

    /// The weight of one call of `tool` now.
    pub fn weight(&self, tool: &str) -> u32 {
        self.weight_in(&Name::new(tool), None)
    }

    /// The weight of one call of `tool` under a request's snapshot.
    pub(crate) fn weight_in(&self, tool: &Name, snapshot: Option<&Snapshot>) -> u32 {
        let config = self.config.read(snapshot);
        match config.tools.get(tool.as_str()) {
            Some(Weight::Fixed(n)) => n.get(),
            Some(Weight::Auto) => self.learned(tool).map_or(config.min_weight.get(), |l| {
                l.weight.load(Ordering::Relaxed)
            }),
            None => config.default_weight.get(),
        }
    }

    /// What is learned of `tool`, if it is learned.
    fn learned(&self, tool: &Name) -> Option<dashmap::mapref::one::Ref<'_, u64, Learned>> {
        self.learned
            .get(&tool.key())
            .filter(|l| &*l.tool == tool.as_str())
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
                Some((e.tool.to_string(), t.value()?, b.value().unwrap_or(0.0)))
            })
            .collect();
        let config = self.config.load();
        let unit = |t: &String| config.tools.get(t).is_some_and(|w| w.is_unit());
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
            if config.tools.get(&tool) != Some(&Weight::Auto) {
                continue; // a weight-1 tool, measured as the unit
            }
            let mut w = (time / unit_time).max(bytes / unit_bytes).round();
            if config.non_idempotent.contains(&tool) {
                w *= 2.0;
            }
            let w = (w as u32).clamp(config.min_weight.get(), config.max_weight.get());
            if let Some(l) = self.learned(&Name::new(tool)) {
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
        let Some(tool) = o.call.tool.as_ref() else {
            return;
        };
        if let Some(l) = self.learned(tool) {
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
            at: tokio::time::Instant::now(),
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
    fn a_tool_sharing_another_tools_key_never_reads_its_weight() {
        let config: CostConfig = serde_json::from_str(r#"{"tools":{"a":"auto"}}"#).unwrap();
        let costs = Costs::new(config);
        costs
            .learned
            .get(&key_of("a"))
            .unwrap()
            .weight
            .store(7, Ordering::Relaxed);
        assert_eq!(costs.weight("a"), 7);
        // "b" learned under "a"'s key (a 64-bit accident): found by the key, refused by the name.
        costs.learned.insert(
            key_of("a"),
            Learned {
                tool: "b".into(),
                weight: AtomicU32::new(9),
                stats: Mutex::new((Ewma::new(LEARN_ALPHA), Ewma::new(LEARN_ALPHA))),
            },
        );
        assert!(costs.learned(&Name::new("a")).is_none());
        assert_eq!(costs.weight("a"), 1, "min_weight, not b's 9");
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
                at: tokio::time::Instant::now(),
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
        let c = CostConfig {
            min_weight: NonZeroU32::new(5).unwrap(),
            max_weight: NonZeroU32::new(2).unwrap(),
            ..CostConfig::default()
        };
        assert_eq!(
            c.validate().unwrap_err(),
            ConfigError::new("costs.max_weight", "must be at least min_weight")
        );
    }
}
