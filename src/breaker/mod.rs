//! Per-tool circuit breakers: fail fast while a dependency keeps failing, and probe it
//! carefully when it may have recovered.
//!
//! Each protected tool has its own breaker, never one global breaker. Closed, a breaker lets
//! calls through and keeps the outcomes of the last `window_calls`; once at least `min_calls`
//! are in the window and the failure rate reaches `failure_rate` (or the share of calls slower
//! than `slow_call` reaches `slow_rate`), it opens: every call of the tool is refused with
//! `circuit_open` (scope `tool`, `retry_after_ms` until the first probe may go). After
//! `open_for` it is half-open: exactly `probes` calls go through (not a flood: too many probes
//! crush a recovering provider); if they all succeed it closes, if one fails or is slow it
//! opens again.
//!
//! Failures come from the outcome hook (errors and timeouts); refusals by stormgate itself never
//! reach it, so they never count as the tool's failures, and a probe refused by a later stage
//! gives its place back.

mod state;

use crate::error::ConfigError;
use crate::valid::{Fraction, NonZeroDuration};
use std::collections::BTreeSet;
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::snapshot::{Live, Read};
use dashmap::DashMap;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

pub use state::{Breaker, BreakerState, MIN_FAILING_CLIENTS};

use crate::admit::{Admission, AdmitLayer};
use crate::call::Call;
use crate::clients::{ClientKeys, Judge};
use crate::outcome::{Observation, Observer, Outcome};
use crate::policy::{Mode, Switch};
use crate::rejection::{Reason, Rejection, Scope};

/// Breaker settings. The defaults are stormgate's own choice; no standard fixes the numbers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct BreakerConfig {
    /// The tools with a breaker. Empty (the default): none.
    pub tools: BTreeSet<String>,
    /// Outcomes kept in the sliding window. Default 20.
    pub window_calls: usize,
    /// Outcomes needed in the window before it may open. Default 10.
    pub min_calls: usize,
    /// Failure share that opens it. Default 0.5.
    pub failure_rate: Fraction,
    /// A call slower than this is slow (`slow_call_ms`). Default 2 s.
    #[serde(rename = "slow_call_ms")]
    pub slow_call: NonZeroDuration,
    /// Slow share that opens it. Default 1.0 (only when every call in the window is slow).
    pub slow_rate: Fraction,
    /// How long it stays open (`open_for_ms`). Default 10 s.
    #[serde(rename = "open_for_ms")]
    pub open_for: NonZeroDuration,
    /// Probes let through when half-open. Default 2.
    pub probes: NonZeroU32,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        BreakerConfig {
            tools: BTreeSet::new(),
            window_calls: 20,
            min_calls: 10,
            failure_rate: Fraction::of(0.5),
            slow_call: NonZeroDuration::of(Duration::from_secs(2)),
            slow_rate: Fraction::of(1.0),
            open_for: NonZeroDuration::of(Duration::from_secs(10)),
            probes: NonZeroU32::new(2).unwrap(),
        }
    }
}

impl BreakerConfig {
    /// Checks the rules a field's type cannot; the error names the field and the rule.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.window_calls < MIN_FAILING_CLIENTS {
            // A window of one call holds one client: the breaker could never open.
            return Err(ConfigError::new(
                "breaker.window_calls",
                "must be at least 2 (a breaker opens on the failures of two clients)",
            ));
        }
        if self.min_calls == 0 || self.min_calls > self.window_calls {
            return Err(ConfigError::new(
                "breaker.min_calls",
                "must be between 1 and window_calls",
            ));
        }
        Ok(())
    }
}

/// The breakers of every protected tool: an [`Admission`] and an [`Observer`].
#[derive(Clone)]
pub struct CircuitBreakers {
    inner: Arc<Inner>,
}

struct Inner {
    epoch: Instant,
    switch: Switch,
    config: Live<BreakerConfig>,
    breakers: DashMap<String, Arc<Mutex<Breaker>>>,
    /// Who a call's client is (see [`CircuitBreakers::following`]).
    clients: ClientKeys,
}

impl std::fmt::Debug for CircuitBreakers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CircuitBreakers")
            .field("config", &self.inner.config.load())
            .finish_non_exhaustive()
    }
}

/// A call let through: which breaker, and whether it was a probe.
#[derive(Debug)]
pub struct BreakerPermit(Option<(Arc<Mutex<Breaker>>, bool)>);

fn lock(b: &Mutex<Breaker>) -> std::sync::MutexGuard<'_, Breaker> {
    b.lock().unwrap_or_else(PoisonError::into_inner)
}

impl CircuitBreakers {
    /// Breakers with these settings (validated), always adaptive.
    pub fn new(config: BreakerConfig) -> Result<Self, ConfigError> {
        Self::with_switch(config, Switch::default())
    }

    /// Breakers with these settings that follow the kill switch `switch`: in `off` mode they
    /// refuse nothing and keep recording outcomes.
    pub fn with_switch(config: BreakerConfig, switch: Switch) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(CircuitBreakers {
            inner: Arc::new(Inner {
                epoch: Instant::now(),
                switch,
                config: Live::new(config),
                breakers: DashMap::new(),
                clients: ClientKeys::default(),
            }),
        })
    }

    /// Counts clients as `sessions` judges them: a session the MCP server accepted is one
    /// client, every other id of a tenant together one more (ids made up per call are one
    /// client). Without it each session id is a client. A breaker opens only on the failures
    /// of [`MIN_FAILING_CLIENTS`] clients. Set once; [`Control`](crate::control::Control)
    /// sets it.
    pub fn following(self, sessions: impl Judge) -> Self {
        self.inner.clients.follow(Arc::new(sessions));
        self
    }

    /// Takes new settings; every breaker keeps its state and window.
    pub fn reconfigure(&self, config: BreakerConfig) -> Result<(), ConfigError> {
        config.validate()?;
        self.set_config(config);
        Ok(())
    }

    /// [`reconfigure`](Self::reconfigure) with settings already validated.
    pub(crate) fn set_config(&self, config: BreakerConfig) {
        self.inner.config.store(Arc::new(config));
    }

    /// The settings in force.
    pub fn config(&self) -> Arc<BreakerConfig> {
        self.inner.config.load()
    }

    /// The settings `call` runs under (its request's snapshot's).
    pub(crate) fn config_of<'a>(&self, call: &'a Call) -> Read<'a, BreakerConfig> {
        self.inner.config.read(call.snapshot())
    }

    /// The breakers' settings cell, for a control's snapshots.
    pub(crate) fn cell(&self) -> &Live<BreakerConfig> {
        &self.inner.config
    }

    /// The admission stage: `AdmitLayer` over these breakers.
    pub fn layer(&self) -> AdmitLayer<CircuitBreakers> {
        AdmitLayer::new(self.clone())
    }

    /// The observer to give to [`OutcomeLayer`](crate::outcome::OutcomeLayer).
    pub fn observer(&self) -> Arc<dyn Observer> {
        Arc::new(self.clone())
    }

    /// The state of a tool's breaker, if it has one yet.
    pub fn state(&self, tool: &str) -> Option<BreakerState> {
        self.inner.breakers.get(tool).map(|b| lock(&b).state())
    }

    fn breaker(&self, tool: &str, config: &BreakerConfig) -> Option<Arc<Mutex<Breaker>>> {
        if !config.tools.contains(tool) {
            return None;
        }
        Some(
            self.inner
                .breakers
                .entry(tool.to_owned())
                .or_default()
                .clone(),
        )
    }
}

impl Admission for CircuitBreakers {
    type Permit = BreakerPermit;

    fn admit(&self, call: &Call) -> Result<BreakerPermit, Rejection> {
        self.admit_at(call, Instant::now())
    }

    fn admit_at(&self, call: &Call, now: Instant) -> Result<BreakerPermit, Rejection> {
        if self.inner.switch.of(call).mode == Mode::Off {
            return Ok(BreakerPermit(None));
        }
        let config = self.config_of(call);
        let Some(breaker) = call.tool.as_deref().and_then(|t| self.breaker(t, &config)) else {
            return Ok(BreakerPermit(None));
        };
        let now = now.saturating_duration_since(self.inner.epoch);
        let result = lock(&breaker).try_admit(now, &config);
        match result {
            Ok(probe) => Ok(BreakerPermit(Some((breaker, probe)))),
            Err(wait) => Err(Rejection::new(Reason::CircuitOpen, Scope::Tool, wait)),
        }
    }

    fn refund(&self, permit: BreakerPermit) {
        if let Some((breaker, true)) = permit.0 {
            lock(&breaker).release_probe();
        }
    }
}

impl Observer for CircuitBreakers {
    fn observe(&self, o: &Observation<'_>) {
        if matches!(o.outcome, Outcome::Cancelled | Outcome::ClientError) {
            return; // says nothing about the tool
        }
        let config = self.config_of(o.call);
        let Some(breaker) = o
            .call
            .tool
            .as_deref()
            .and_then(|t| self.breaker(t, &config))
        else {
            return;
        };
        let slow = o.service_time >= config.slow_call.get();
        let client = self.inner.clients.of(o.call);
        lock(&breaker).record(
            o.at.saturating_duration_since(self.inner.epoch),
            (o.outcome.is_failure(), slow, client),
            &config,
        );
    }
}
