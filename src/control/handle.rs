//! The whole stack built from one [`Config`], and the handle that flips and reloads it.

use std::sync::{Arc, Mutex, PoisonError};

use arc_swap::ArcSwap;
use axum::Router;

use super::config::Prepared;
#[cfg(feature = "toml")]
use super::config::read;
#[cfg(feature = "toml")]
use super::document::{merge_patch, replacement};
use super::{Audit, Config, Mode, Policy, Switch, View};
use crate::admit::AdmitLayer;
use crate::breaker::CircuitBreakers;
use crate::budget::Budget;
use crate::classify::ClassifyLayer;
use crate::entropy::SessionGuard;
use crate::error::{ConfigError, ControlError};
use crate::fifo::{FifoLimitLayer, ResourceLimiter};
use crate::idempotency::IdempotencyLayer;
use crate::metrics::{self, CallMetrics, Labels};
use crate::outcome::{Observer, OutcomeLayer};
use crate::snapshot::{Owner, Snapshot};

use super::settings::{Cells, Settings};
use crate::stack::StackLayer;

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
    /// The bounded tenant and tool label values of this stack's metrics.
    labels: Arc<Labels>,
    /// The call metrics, with their handles resolved once per (tenant, tool) labels.
    calls: CallMetrics,
    last_error: Mutex<Option<String>>,
    /// Orders every change (reloads from every source, mode flips), from reading the running
    /// configuration to committing the next.
    order: Mutex<()>,
    /// Every stage's settings, as the next request runs under them (see [`Snapshot`]).
    snapshot: Arc<ArcSwap<Snapshot>>,
    /// Whose snapshots these are: the stages' cells are bound to this control's.
    owner: Owner,
    /// The key credentials are hashed under, kept across reloads.
    credential_key: crate::call::CredentialKey,
}

impl Inner {
    /// The stages' settings cells, for the snapshots.
    fn cells(&self) -> Cells<'_> {
        Cells {
            switch: &self.switch,
            classify: &self.classify,
            budget: &self.budget,
            sessions: &self.sessions,
            breakers: &self.breakers,
            idempotency: &self.idempotency,
            fifo: &self.fifo,
        }
    }
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
    pub fn new(config: Config) -> Result<Self, ControlError> {
        let Prepared { config, identity } = config.prepare()?;
        let credential_key = identity.key();
        let switch = Switch::new(config.policy());
        let labels = Arc::new(Labels::with_caps(
            config.metrics.max_tenant_labels,
            config.metrics.max_tool_labels,
        ));
        let sessions = SessionGuard::with_switch(config.sessions.clone(), switch.clone())?;
        let budget = Budget::builder(config.budget.clone())
            .sessions(sessions.clone())
            .tenants(config.tenants.clone())
            .costs(config.costs.clone())
            .switch(switch.clone())
            .labels(labels.clone());
        #[cfg(feature = "redis")]
        let budget = match &config.distributed {
            Some(d) => budget.shared(crate::distributed::SharedBudget::new(d.clone())?),
            None => budget,
        };
        let budget = budget.try_build()?;
        let breakers = CircuitBreakers::with_switch(config.breaker.clone(), switch.clone())?
            .following(sessions.clone());
        let idempotency =
            IdempotencyLayer::with_switch(config.idempotency.clone(), switch.clone())?;
        let fifo = config.fifo.layer();
        let audit = Arc::new(Audit::following(sessions.clone()));
        // One set of call metric handles for the refusals and the outcomes.
        let calls = CallMetrics::new(labels.clone());
        let snapshot = Arc::new(ArcSwap::from_pointee(Snapshot::default()));
        let classify = ClassifyLayer::new()
            .snapshots(snapshot.clone())
            .identity(identity)
            .body_limit(config.body_limit.get())
            .settings(config.classify)
            .deadlines(config.deadlines.clone())
            .format(config.rejection.clone())
            .switch(switch.clone())
            .costs(budget.costs())
            .observers([
                audit.clone() as Arc<dyn Observer>,
                Arc::new(calls.clone()) as Arc<dyn Observer>,
                // The guard reads how a client treats its refusals' waits.
                sessions.observer(),
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
                labels,
                calls,
                last_error: Mutex::new(None),
                order: Mutex::new(()),
                snapshot,
                owner: Owner::new(),
                credential_key,
            }),
        };
        Settings::bind(&control.inner.owner, &control.inner.cells());
        control.apply_policy();
        Ok(control)
    }

    /// The whole stack as one tower layer, over any MCP service (see [`StackLayer`]): outermost
    /// first, classify, idempotency, budget, session guard, circuit breakers, FIFO limiter,
    /// outcome observation.
    pub fn layer(&self) -> StackLayer {
        let inner = &*self.inner;
        StackLayer {
            classify: inner.classify.clone(),
            idempotency: inner.idempotency.clone(),
            admissions: AdmitLayer::new((
                inner.budget.clone(),
                inner.sessions.clone(),
                inner.breakers.clone(),
            )),
            fifo: inner.fifo.clone(),
            outcome: OutcomeLayer::new([
                inner.budget.observer(),
                inner.sessions.observer(),
                inner.breakers.observer(),
                inner.audit.clone() as Arc<dyn Observer>,
                Arc::new(inner.calls.clone()) as Arc<dyn Observer>,
            ]),
            switch: inner.switch.clone(),
        }
    }

    /// Wraps an MCP router in the whole stack ([`layer`](Self::layer)).
    ///
    /// The router's handlers are made routes first (`with_state(())`), so the stack wraps
    /// each route once, here, instead of axum wrapping a handler on every request.
    pub fn wrap(&self, router: Router) -> Router {
        router.with_state(()).layer(self.layer())
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

    /// The budget, read-only.
    pub fn budget(&self) -> View<'_, Budget> {
        View(&self.inner.budget)
    }

    /// The session guard, read-only.
    pub fn sessions(&self) -> View<'_, SessionGuard> {
        View(&self.inner.sessions)
    }

    /// The circuit breakers, read-only.
    pub fn breakers(&self) -> View<'_, CircuitBreakers> {
        View(&self.inner.breakers)
    }

    /// The FIFO limiter, read-only.
    pub fn limiter(&self) -> View<'_, ResourceLimiter> {
        View(self.inner.fifo.limiter())
    }

    /// Tells the FIFO limiter that the resource behind `key` answered 429 (see
    /// [`ResourceLimiter::report_upstream_rate_limit`]).
    pub fn report_upstream_rate_limit(&self, key: &str, retry_after: Option<std::time::Duration>) {
        self.inner
            .fifo
            .limiter()
            .report_upstream_rate_limit(key, retry_after);
    }

    /// The classifier, read-only (and through it, the tool schemas it learned).
    pub fn classify(&self) -> View<'_, ClassifyLayer> {
        View(&self.inner.classify)
    }

    /// The idempotency layer, read-only.
    pub fn idempotency(&self) -> View<'_, IdempotencyLayer> {
        View(&self.inner.idempotency)
    }

    /// The stages themselves, writable: for the crate's own tests (feature `test-util`).
    #[cfg(feature = "test-util")]
    pub(crate) fn stages_now(&self) -> Stages<'_> {
        let inner = &*self.inner;
        Stages {
            budget: &inner.budget,
            sessions: &inner.sessions,
            breakers: &inner.breakers,
            limiter: inner.fifo.limiter(),
        }
    }

    /// The invocation audit.
    pub fn audit(&self) -> &Audit {
        &self.inner.audit
    }

    /// Flips the kill switch. The next request sees it; calls in flight are not failed; `off`
    /// releases every waiting caller at once. Ordered with every reload: a flip never undoes
    /// a concurrent reload, nor a reload a flip made before it.
    pub fn set_mode(&self, mode: Mode) {
        self.flip(mode, Source::Code);
    }

    /// Takes the lock that orders every change, and the configuration running under it.
    fn ordered(&self) -> (std::sync::MutexGuard<'_, ()>, Arc<Config>) {
        let order = self
            .inner
            .order
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        (order, self.inner.config.load_full())
    }

    /// [`set_mode`](Self::set_mode), logged with its source.
    pub(crate) fn flip(&self, mode: Mode, source: Source) {
        let (_order, running) = self.ordered();
        let mut config = Config::clone(&running);
        config.mode = mode;
        self.inner.switch.set(config.policy());
        self.inner.config.store(Arc::new(config));
        self.apply_policy();
        tracing::info!(%source, from = running.mode.as_str(), to = mode.as_str(), "mode set");
    }

    /// Applies the policy to the stages that hold it as state, and takes the snapshot the
    /// next request runs under. Called under the order lock, after every stage has its new
    /// settings.
    fn apply_policy(&self) {
        let inner = &*self.inner;
        inner
            .snapshot
            .store(Arc::new(Settings::take(&inner.owner, &inner.cells())));
        let policy = self.policy();
        self.inner.budget.apply_policy();
        self.inner
            .fifo
            .limiter()
            .set_bypass(policy.mode == Mode::Off || !policy.features.resource_limits);
        policy.mode.emit();
    }

    /// Applies a new configuration, whole: validated first, and refused whole (the running one
    /// stays) when invalid. A valid one keeps what was learned where it still applies: the
    /// controller's averages and budget, tenants, session windows, learned weights, queues.
    ///
    /// Settings that cannot change while running are refused by name when they differ:
    /// `budget.sample_interval_ms`, `sessions.window_size_ms`, `sessions.buckets`,
    /// `[distributed]` and `[gateway]` (a configuration without them keeps the running ones;
    /// one whose `[gateway]` has no `upstream` keeps the running upstream).
    pub fn reload(&self, config: Config) -> Result<(), ControlError> {
        self.change(Source::Code, |_| Ok(config))
    }

    /// Applies a configuration document (TOML, or JSON starting with `{`) that replaces the
    /// running one. It is refused when empty, or when it leaves out a top-level key the
    /// running configuration sets, unless it says `replace = true` (see docs/operations.md,
    /// "Reloads"); from [`Source::Admin`] it is also refused when it would remove the admin
    /// token. Feature `toml`.
    #[cfg(feature = "toml")]
    pub fn reload_document(&self, text: &str, source: Source) -> Result<(), ControlError> {
        self.change(source, |running| replacement(running, text))
    }

    /// Merges a partial document (TOML or JSON, RFC 7386 merge patch) into the running
    /// configuration and applies the result like [`reload`](Self::reload): it changes exactly
    /// what it names. Feature `toml`.
    #[cfg(feature = "toml")]
    pub fn patch(&self, text: &str, source: Source) -> Result<(), ControlError> {
        self.change(source, |running| merge_patch(running, text))
    }

    /// Reads, validates and applies a TOML file, as [`reload_document`](Self::reload_document)
    /// with [`Source::File`]. Feature `toml`.
    #[cfg(feature = "toml")]
    pub fn reload_file(&self, path: &std::path::Path) -> Result<(), ControlError> {
        self.reload_path(path, Source::File)
    }

    #[cfg(feature = "toml")]
    pub(crate) fn reload_path(
        &self,
        path: &std::path::Path,
        source: Source,
    ) -> Result<(), ControlError> {
        self.change(source, |running| replacement(running, &read(path)?))
    }

    /// The one path of every configuration change: under the lock that orders them all, the
    /// next configuration is made from the running one, prepared (everything that can fail)
    /// and committed (nothing can fail), then counted, kept as the last error if refused,
    /// and logged.
    fn change(
        &self,
        source: Source,
        next: impl FnOnce(&Config) -> Result<Config, ControlError>,
    ) -> Result<(), ControlError> {
        let (_order, running) = self.ordered();
        let prepared = next(&running).and_then(|config| prepare(&running, config, &source));
        let result = prepared.map(|prepared| {
            let changed = running.differences(&prepared.config);
            self.commit(prepared);
            changed
        });
        let label = if result.is_ok() { "ok" } else { "invalid" };
        ::metrics::counter!(metrics::RELOADS, "result" => label).increment(1);
        *self
            .inner
            .last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = result.as_ref().err().map(|e| e.to_string());
        match result {
            Ok(changed) => {
                tracing::info!(%source, ?changed, "configuration reloaded");
                Ok(())
            }
            Err(error) => {
                tracing::warn!(%source, %error, "configuration change refused; the running one stays");
                Err(error)
            }
        }
    }

    /// Applies a prepared configuration to every stage. Nothing here can fail.
    fn commit(&self, prepared: Prepared) {
        let inner = &*self.inner;
        let Prepared { config, identity } = prepared;
        inner
            .budget
            .set_config(config.budget.clone(), config.tenants.clone(), &config.costs);
        inner.sessions.set_config(config.sessions.clone());
        inner.breakers.set_config(config.breaker.clone());
        inner.idempotency.set_config(config.idempotency.clone());
        config.fifo.apply(&inner.fifo);
        inner.classify.reconfigure(
            config.body_limit.get(),
            config.rejection.clone(),
            identity.credential_key(inner.credential_key.clone()),
            config.deadlines.clone(),
            config.classify,
        );
        inner.labels.set_caps(
            config.metrics.max_tenant_labels,
            config.metrics.max_tool_labels,
        );
        inner.switch.set(config.policy());
        inner.config.store(Arc::new(config));
        self.apply_policy();
    }

    /// Reloads `path` on every SIGHUP (unix), until the returned task is aborted. Feature
    /// `watch`.
    #[cfg(all(unix, feature = "watch"))]
    pub fn reload_on_sighup(
        &self,
        path: std::path::PathBuf,
    ) -> std::io::Result<tokio::task::JoinHandle<()>> {
        use tokio::signal::unix::{SignalKind, signal};
        let mut hup = signal(SignalKind::hangup())?;
        let control = self.clone();
        Ok(tokio::spawn(async move {
            while hup.recv().await.is_some() {
                let _ = control.reload_path(&path, Source::Signal);
            }
        }))
    }
}

/// The stages of a [`Control`], writable (feature `test-util`; see `Control::stages`).
#[cfg(feature = "test-util")]
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct Stages<'a> {
    /// The budget.
    pub budget: &'a Budget,
    /// The session guard.
    pub sessions: &'a SessionGuard,
    /// The circuit breakers.
    pub breakers: &'a CircuitBreakers,
    /// The FIFO limiter.
    pub limiter: &'a ResourceLimiter,
}

/// Where a configuration change came from, as logged.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Source {
    /// The control handle, in code.
    Code,
    /// The watched file.
    File,
    /// SIGHUP.
    Signal,
    /// The admin routes, with the caller's address when the server records it
    /// (`into_make_service_with_connect_info::<SocketAddr>()`).
    Admin(Option<std::net::SocketAddr>),
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Code => f.write_str("code"),
            Source::File => f.write_str("file"),
            Source::Signal => f.write_str("sighup"),
            Source::Admin(Some(addr)) => write!(f, "admin from {addr}"),
            Source::Admin(None) => f.write_str("admin"),
        }
    }
}

/// Everything about a change that can fail: validation, the settings that cannot change
/// while running, the admin lock-out rule.
fn prepare(running: &Config, mut next: Config, source: &Source) -> Result<Prepared, ControlError> {
    if next.distributed.is_none() {
        next.distributed.clone_from(&running.distributed);
    }
    // The gateway's upstream is often given on the command line, not in the file: a document
    // without `[gateway]`, or without its `upstream`, keeps the running one.
    match (&mut next.gateway, &running.gateway) {
        (Some(next), Some(running)) if next.upstream.is_none() => {
            next.upstream.clone_from(&running.upstream);
        }
        _ => {}
    }
    if next.gateway.is_none() {
        next.gateway.clone_from(&running.gateway);
    }
    let next = next.prepare()?;
    let fixed = [
        (
            "distributed",
            running.distributed != next.config.distributed,
        ),
        ("gateway", running.gateway != next.config.gateway),
        (
            "budget.sample_interval_ms",
            running.budget.sample_interval != next.config.budget.sample_interval,
        ),
        (
            "sessions.window_size_ms",
            running.sessions.window_size != next.config.sessions.window_size,
        ),
        (
            "sessions.buckets",
            running.sessions.buckets != next.config.sessions.buckets,
        ),
    ];
    if let Some((field, _)) = fixed.into_iter().find(|(_, changed)| *changed) {
        return Err(
            ConfigError::new(field, "cannot change while running (restart to change it)").into(),
        );
    }
    if matches!(source, Source::Admin(_))
        && running.admin.token().is_some()
        && next.config.admin.token().is_none()
    {
        return Err(ConfigError::new(
            "admin",
            "the change leaves no admin token: it would lock the admin API out (set the token through the file)",
        )
        .into());
    }
    Ok(next)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::call::Call;
    use crate::valid::Positive;

    /// Two configurations that differ in every stage's settings.
    fn two_configs() -> (Config, Config) {
        let mut a = Config::default();
        a.budget.stable_budget = Positive::new(1000.0).unwrap();
        a.sessions.base_budget = Positive::new(5.0).unwrap();
        a.breaker.window_calls = 20;
        a.idempotency.max_entries = std::num::NonZeroUsize::new(10).unwrap();
        let mut b = Config::default();
        b.budget.stable_budget = Positive::new(3000.0).unwrap();
        b.sessions.base_budget = Positive::new(9.0).unwrap();
        b.breaker.window_calls = 30;
        b.idempotency.max_entries = std::num::NonZeroUsize::new(20).unwrap();
        (a, b)
    }

    /// Every snapshot a request can take holds one whole configuration, while two reloads and
    /// mode flips race.
    #[test]
    fn every_snapshot_is_one_whole_config_while_reloads_race() {
        let (a, b) = two_configs();
        let control = Control::new(a.clone()).unwrap();
        let inner = &*control.inner;
        let modes = [Mode::Off, Mode::Fixed, Mode::Adaptive];
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                for round in 0..2000 {
                    std::thread::scope(|r| {
                        r.spawn(|| control.reload(a.clone()).unwrap());
                        r.spawn(|| control.reload(b.clone()).unwrap());
                        r.spawn(|| control.set_mode(modes[round % 3]));
                    });
                }
                stop.store(true, std::sync::atomic::Ordering::Relaxed);
            });
            let mut seen = [0usize; 2];
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let mut call = Call::request("tools/call");
                call.pipeline.snapshot = Some(inner.snapshot.load_full());
                let budget = inner.budget.config_of(&call);
                let whole = if budget == a.budget { &a } else { &b };
                assert_eq!(budget, whole.budget);
                assert_eq!(*inner.sessions.config_of(&call), whole.sessions);
                assert_eq!(*inner.breakers.config_of(&call), whole.breaker);
                assert_eq!(*inner.idempotency.config_of(&call), whole.idempotency);
                seen[usize::from(budget != a.budget)] += 1;
            }
            assert!(seen[0] > 0 && seen[1] > 0, "both configs seen: {seen:?}");
        });
    }
}
