//! The whole stack built from one [`Config`], and the handle that flips and reloads it.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};

use arc_swap::ArcSwap;
use axum::Router;

use super::{Audit, Config, Mode, Policy, Switch};
use crate::breaker::CircuitBreakers;
use crate::budget::Budget;
use crate::classify::ClassifyLayer;
use crate::entropy::SessionGuard;
use crate::fifo::FifoLimitLayer;
use crate::idempotency::IdempotencyLayer;
use crate::metrics::{self, CallMetrics};
use crate::outcome::{Observer, OutcomeLayer};

/// The whole stack and its control handle: a cheap clone, every clone controls the same stack.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use axum::{Router, routing::post};
/// use stormgate::control::{Config, Control, Mode};
///
/// let control = Control::new(Config::default()).unwrap();
/// let _tasks = control.spawn(); // the budget's ticker and the session sweeper
/// let app: Router = control.wrap(Router::new().route("/mcp", post(|| async { "{}" })));
/// control.set_mode(Mode::Fixed); // seen by the next request
/// assert_eq!(control.policy().mode, Mode::Fixed);
/// # }
/// ```
#[derive(Clone)]
pub struct Control {
    inner: Arc<Inner>,
}

struct Inner {
    config: ArcSwap<Config>,
    switch: Switch,
    classify: ClassifyLayer,
    budget: Budget,
    sessions: SessionGuard,
    breakers: CircuitBreakers,
    idempotency: IdempotencyLayer,
    fifo: FifoLimitLayer,
    audit: Arc<Audit>,
    last_error: Mutex<Option<String>>,
}

impl std::fmt::Debug for Control {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Control")
            .field("policy", &self.policy())
            .finish_non_exhaustive()
    }
}

impl Control {
    /// Builds every stage from `config` (validated first). With a `[distributed]` section
    /// (feature `redis`), it must be called inside a tokio runtime: the shared budget starts
    /// connecting to Redis in the background at once.
    pub fn new(config: Config) -> Result<Self, String> {
        config.validate()?;
        let switch = Switch::new(config.policy());
        let budget = Budget::builder(config.budget.clone())
            .tenants(config.tenants.clone())
            .costs(config.costs.clone())
            .switch(switch.clone());
        #[cfg(feature = "redis")]
        let budget = match &config.distributed {
            Some(d) => budget.shared(crate::distributed::SharedBudget::new(d.clone())?),
            None => budget,
        };
        let budget = budget.try_build()?;
        let sessions = SessionGuard::with_switch(config.sessions.clone(), switch.clone())?;
        let breakers = CircuitBreakers::new(config.breaker.clone())?;
        let idempotency = IdempotencyLayer::new(config.idempotency.clone())?;
        let fifo = config.fifo.layer();
        let audit = Arc::new(Audit::default());
        metrics::set_label_caps(
            config.metrics.max_tenant_labels,
            config.metrics.max_tool_labels,
        );
        let classify = ClassifyLayer::new()
            .identity(config.identity.identity()?)
            .body_limit(config.body_limit)
            .deadlines(config.deadlines.clone())
            .format(config.rejection.clone())
            .costs(budget.costs())
            .observers([
                audit.clone() as Arc<dyn Observer>,
                Arc::new(CallMetrics) as Arc<dyn Observer>,
            ]);
        let control = Control {
            inner: Arc::new(Inner {
                config: ArcSwap::from_pointee(config),
                switch,
                classify,
                budget,
                sessions,
                breakers,
                idempotency,
                fifo,
                audit,
                last_error: Mutex::new(None),
            }),
        };
        control.apply_policy();
        Ok(control)
    }

    /// Wraps an MCP router in the whole stack, outermost first: classify, idempotency, budget,
    /// session guard, circuit breakers, FIFO limiter, outcome observation.
    pub fn wrap(&self, router: Router) -> Router {
        let inner = &*self.inner;
        router
            .layer(OutcomeLayer::new([
                inner.budget.observer(),
                inner.sessions.observer(),
                inner.breakers.observer(),
                inner.audit.clone() as Arc<dyn Observer>,
                Arc::new(CallMetrics) as Arc<dyn Observer>,
            ]))
            .layer(inner.fifo.clone())
            .layer(inner.breakers.layer())
            .layer(inner.sessions.layer())
            .layer(inner.budget.layer())
            .layer(inner.idempotency.clone())
            .layer(inner.classify.clone())
    }

    /// Starts the background tasks: the budget's ticker and the session sweeper. They stop
    /// when the last handle is dropped.
    pub fn spawn(&self) -> [tokio::task::JoinHandle<()>; 2] {
        [
            self.inner.budget.spawn_ticker(),
            self.inner.sessions.spawn_sweeper(),
        ]
    }

    /// The policy now.
    pub fn policy(&self) -> Policy {
        *self.inner.switch.load()
    }

    /// The policy snapshot now, as the stages read it.
    pub fn snapshot(&self) -> Arc<Policy> {
        self.inner.switch.load()
    }

    /// The configuration now (with the mode last set).
    pub fn config(&self) -> Arc<Config> {
        self.inner.config.load_full()
    }

    /// The error of the last refused reload, if the last reload was refused.
    pub fn last_error(&self) -> Option<String> {
        self.inner
            .last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The budget.
    pub fn budget(&self) -> &Budget {
        &self.inner.budget
    }

    /// The session guard.
    pub fn sessions(&self) -> &SessionGuard {
        &self.inner.sessions
    }

    /// The circuit breakers.
    pub fn breakers(&self) -> &CircuitBreakers {
        &self.inner.breakers
    }

    /// The FIFO layer (and through it, the limiter).
    pub fn fifo(&self) -> &FifoLimitLayer {
        &self.inner.fifo
    }

    /// The invocation audit.
    pub fn audit(&self) -> &Audit {
        &self.inner.audit
    }

    /// Flips the kill switch. The next request sees it; calls in flight are not failed; `off`
    /// releases every waiting caller at once.
    pub fn set_mode(&self, mode: Mode) {
        let mut config = Config::clone(&self.inner.config.load());
        config.mode = mode;
        self.inner.config.store(Arc::new(config));
        let policy = Policy {
            mode,
            ..self.policy()
        };
        self.inner.switch.store(policy);
        self.apply_policy();
    }

    fn apply_policy(&self) {
        let policy = self.policy();
        self.inner.budget.apply_policy();
        self.inner
            .fifo
            .limiter()
            .set_bypass(policy.mode == Mode::Off || !policy.features.resource_limits);
        for mode in [Mode::Adaptive, Mode::Fixed, Mode::Off] {
            ::metrics::gauge!(metrics::MODE, "mode" => mode.as_str()).set(if mode == policy.mode {
                1.0
            } else {
                0.0
            });
        }
    }

    /// Applies a new configuration: validated first, and refused whole (the running one
    /// stays) when invalid. A valid one keeps what was learned where it still applies: the
    /// controller's averages and budget, tenants, session windows, learned weights, queues.
    pub fn reload(&self, config: Config) -> Result<(), String> {
        let result = self.try_reload(config);
        let label = if result.is_ok() { "ok" } else { "invalid" };
        ::metrics::counter!(metrics::RELOADS, "result" => label).increment(1);
        *self
            .inner
            .last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = result.clone().err();
        result
    }

    fn try_reload(&self, mut config: Config) -> Result<(), String> {
        config.validate()?;
        let inner = &*self.inner;
        // The shared budget's connection is made once, at start.
        config.distributed = inner.config.load().distributed.clone();
        inner
            .budget
            .reconfigure(config.budget.clone(), config.tenants.clone(), &config.costs)?;
        inner.sessions.reconfigure(config.sessions.clone())?;
        inner.breakers.reconfigure(config.breaker.clone())?;
        inner.idempotency.reconfigure(config.idempotency.clone())?;
        config.fifo.apply(&inner.fifo);
        inner.classify.set_deadlines(config.deadlines.clone());
        inner.classify.reconfigure(
            config.body_limit,
            config.rejection.clone(),
            config.identity.identity()?,
        );
        metrics::set_label_caps(
            config.metrics.max_tenant_labels,
            config.metrics.max_tool_labels,
        );
        inner.switch.store(config.policy());
        inner.config.store(Arc::new(config));
        self.apply_policy();
        Ok(())
    }

    /// Reads, validates and applies a TOML file.
    pub fn reload_file(&self, path: &std::path::Path) -> Result<(), String> {
        match Config::load(path) {
            Ok(config) => self.reload(config),
            Err(e) => {
                ::metrics::counter!(metrics::RELOADS, "result" => "invalid").increment(1);
                *self
                    .inner
                    .last_error
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner) = Some(e.clone());
                Err(e)
            }
        }
    }

    /// Reloads `path` on every SIGHUP (unix), until the returned task is aborted.
    #[cfg(unix)]
    pub fn reload_on_sighup(&self, path: PathBuf) -> std::io::Result<tokio::task::JoinHandle<()>> {
        use tokio::signal::unix::{SignalKind, signal};
        let mut hup = signal(SignalKind::hangup())?;
        let control = self.clone();
        Ok(tokio::spawn(async move {
            while hup.recv().await.is_some() {
                let _ = control.reload_file(&path);
            }
        }))
    }
}
