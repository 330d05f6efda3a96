use crate::valid::NonZeroDuration;
use std::fmt;
use std::num::NonZeroUsize;
use std::sync::Arc;

use std::time::Duration;

use arc_swap::ArcSwap;

use serde::{Deserialize, Serialize};
use tower::Layer;

use super::Classify;
use super::DeadlineConfig;
use super::buffering::Buffering;
use super::names::Names;
use crate::call::Refusals;
use crate::call::{DefaultIdentity, Identify};
use crate::cost::Costs;
use crate::metrics::MessageCounts;
use crate::outcome::{Observer, Observers};
use crate::policy::Switch;
use crate::protocol::ProtocolVersion;
use crate::rejection::RejectionFormat;
use crate::schemas::ToolSchemas;
use crate::snapshot::{Live, Snapshot};

/// Default bound on a buffered request body: 4 MiB, the same as rmcp's.
pub const DEFAULT_BODY_LIMIT: usize = 4 * 1024 * 1024;

/// Which JSON-RPC batches are classified, charged and answered per element (`[classify]
/// batches`). A batch not classified is forwarded untouched and charged nothing
/// ([`Unclassified::BatchUnsupported`](crate::call::Unclassified)), so the MCP server's own
/// answer applies, the same in every mode.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Batches {
    /// Only where the protocol has them: requests declaring `MCP-Protocol-Version` 2025-03-26,
    /// or declaring none (a server then assumes 2025-03-26). stormgate cannot see whether the
    /// inner server accepts batches: use `off` for one that never does (rmcp 3.11 refuses them),
    /// `on` for one that accepts them under every version.
    #[default]
    Auto,
    /// Every batch.
    On,
    /// None.
    Off,
}

impl Batches {
    /// Whether a batch declaring `version` is classified.
    pub fn classifies(self, version: Option<ProtocolVersion>) -> bool {
        match self {
            Batches::Auto => version.is_none_or(ProtocolVersion::has_batches),
            Batches::On => true,
            Batches::Off => false,
        }
    }
}

/// Default time to receive a whole request body, from the request head: 10 s.
pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(10);
/// Default bound on the bytes of all bodies being buffered at once: 64 MiB.
pub const DEFAULT_MAX_BUFFERED_BYTES: usize = 64 * 1024 * 1024;

/// The classifier's settings in the configuration (`[classify]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct ClassifyConfig {
    /// Which batches are classified. Default `auto`.
    pub batches: Batches,
    /// A body not received whole this long after the request head is answered 408 with a
    /// JSON-RPC error and dropped (`body_timeout_ms`). Default 10 s.
    #[serde(rename = "body_timeout_ms")]
    pub body_timeout: NonZeroDuration,
    /// The bytes of all bodies being buffered at once (each counted as its `Content-Length`,
    /// or `body_limit` when its length is not known in advance); a request that would pass it
    /// is answered 503 with `Retry-After` before it is read. Default 64 MiB.
    pub max_buffered_bytes: NonZeroUsize,
}

impl Default for ClassifyConfig {
    fn default() -> Self {
        ClassifyConfig {
            batches: Batches::default(),
            body_timeout: NonZeroDuration::of(DEFAULT_BODY_TIMEOUT),
            max_buffered_bytes: NonZeroUsize::new(DEFAULT_MAX_BUFFERED_BYTES).unwrap(),
        }
    }
}

/// Settings shared by every clone of the layer and its services.
#[derive(Clone)]
pub(crate) struct Settings {
    pub(crate) body_limit: usize,
    pub(crate) identity: Arc<dyn Identify>,
    pub(crate) format: Arc<RejectionFormat>,
    pub(crate) costs: Option<Arc<Costs>>,
    pub(crate) refusals: Arc<dyn Refusals>,
    pub(crate) deadlines: Arc<DeadlineConfig>,
    pub(crate) switch: Switch,
    pub(crate) batches: Batches,
    pub(crate) body_timeout: Duration,
    pub(crate) max_buffered: usize,
    /// The bytes being buffered now; kept across reloads.
    pub(crate) buffering: Arc<Buffering>,
    /// Learned from `tools/list` answers; kept across reloads.
    pub(crate) schemas: Arc<ToolSchemas>,
    /// The names calls carry, shared; kept across reloads.
    pub(crate) names: Arc<Names>,
    /// The classified messages' counters; kept across reloads.
    pub(crate) messages: Arc<MessageCounts>,
    /// The snapshot each request loads at its head, when a `Control` built the stack.
    pub(crate) snapshots: Option<Arc<ArcSwap<Snapshot>>>,
}

/// Builds [`Classify`] services. See the [module docs](crate::classify). Its services time
/// each body ([`ClassifyConfig::body_timeout`]), so they run on a tokio runtime with its timer
/// enabled (`enable_time` or `enable_all`, as `#[tokio::main]` does).
#[derive(Clone)]
pub struct ClassifyLayer {
    shared: Arc<Live<Settings>>,
}

impl ClassifyLayer {
    /// A 4 MiB body limit, [`DefaultIdentity`], the default [`RejectionFormat`].
    pub fn new() -> Self {
        ClassifyLayer {
            shared: Arc::new(Live::new(Settings {
                body_limit: DEFAULT_BODY_LIMIT,
                identity: Arc::new(DefaultIdentity::new()),
                format: Arc::new(RejectionFormat::default()),
                costs: None,
                refusals: Arc::new(Observers(Vec::new())),
                deadlines: Arc::new(DeadlineConfig::default()),
                switch: Switch::default(),
                batches: Batches::default(),
                body_timeout: DEFAULT_BODY_TIMEOUT,
                max_buffered: DEFAULT_MAX_BUFFERED_BYTES,
                buffering: Buffering::new(),
                schemas: Arc::default(),
                names: Arc::default(),
                messages: Arc::default(),
                snapshots: None,
            })),
        }
    }

    /// A builder step: a new layer with its own settings, so configuring a clone never
    /// changes the original or the services it built.
    fn update(self, f: impl FnOnce(&mut Settings)) -> Self {
        let mut shared = Settings::clone(&self.shared.load());
        f(&mut shared);
        ClassifyLayer {
            shared: Arc::new(Live::new(shared)),
        }
    }

    /// Loads this snapshot at each request's head and hands it to the request's calls
    /// (see [`Snapshot`]).
    pub(crate) fn snapshots(self, snapshots: Arc<ArcSwap<Snapshot>>) -> Self {
        self.update(|s| s.snapshots = Some(snapshots))
    }

    /// The layer's settings cell, for a control's snapshots.
    pub(crate) fn cell(&self) -> &Live<Settings> {
        &self.shared
    }

    /// Changes the body limit, the rejection format, the identity, the deadlines and the
    /// `[classify]` settings of running services (a reload).
    pub fn reconfigure(
        &self,
        body_limit: usize,
        format: RejectionFormat,
        identity: impl Identify,
        deadlines: DeadlineConfig,
        classify: ClassifyConfig,
    ) {
        let mut shared = Settings::clone(&self.shared.load());
        shared.batches = classify.batches;
        shared.body_timeout = classify.body_timeout.get();
        shared.max_buffered = classify.max_buffered_bytes.get();
        shared.body_limit = body_limit;
        shared.format = Arc::new(format);
        shared.identity = Arc::new(identity);
        shared.deadlines = Arc::new(deadlines);
        self.shared.store(Arc::new(shared));
    }

    /// Follows this kill switch: in `off` mode no call gets a deadline (default: always
    /// adaptive).
    pub fn switch(self, switch: Switch) -> Self {
        self.update(|s| s.switch = switch)
    }

    /// The largest body read, in bytes; a larger one is answered 413.
    pub fn body_limit(self, bytes: usize) -> Self {
        self.update(|s| s.body_limit = bytes)
    }

    /// How tenants and sessions are found.
    pub fn identity(self, identity: impl Identify) -> Self {
        self.update(|s| s.identity = Arc::new(identity))
    }

    /// Weighs each `tools/call` with this table ([`Call::cost`](crate::Call)); without one,
    /// every call costs 1.
    pub fn costs(self, costs: Arc<Costs>) -> Self {
        self.update(|s| s.costs = Some(costs))
    }

    /// Tells these observers of every refusal by any stage below
    /// ([`Observer::refused`](crate::outcome::Observer::refused)).
    pub fn observers(self, observers: impl IntoIterator<Item = Arc<dyn Observer>>) -> Self {
        let refusals = Arc::new(Observers(observers.into_iter().collect()));
        self.update(|s| s.refusals = refusals)
    }

    /// Gives each tool call its whole-round deadline ([`crate::deadline`]).
    pub fn deadlines(self, deadlines: DeadlineConfig) -> Self {
        let deadlines = Arc::new(deadlines);
        self.update(|s| s.deadlines = deadlines)
    }

    /// The `[classify]` settings: batches, body timeout, buffering cap.
    pub fn settings(self, classify: ClassifyConfig) -> Self {
        self.update(|s| {
            s.batches = classify.batches;
            s.body_timeout = classify.body_timeout.get();
            s.max_buffered = classify.max_buffered_bytes.get();
        })
    }

    /// Which JSON-RPC batches are classified (default [`Batches::Auto`]).
    pub fn batches(self, batches: Batches) -> Self {
        self.update(|s| s.batches = batches)
    }

    /// Bytes reserved now by the bodies being read (at most `max_buffered_bytes`).
    pub fn buffered_bytes(&self) -> usize {
        self.shared.load().buffering.in_use()
    }

    /// The tools the `tools/list` answers passing through declared an `outputSchema` for.
    pub fn tool_schemas(&self) -> Arc<ToolSchemas> {
        self.shared.load().schemas.clone()
    }

    /// How every layer below writes its rejections.
    pub fn format(self, format: RejectionFormat) -> Self {
        self.update(|s| s.format = Arc::new(format))
    }
}

#[cfg(test)]
impl ClassifyLayer {
    /// Classifies a body as the service would, for unit tests of later stages.
    pub(crate) fn classify_for_test(
        &self,
        parts: &http::request::Parts,
        body: &str,
    ) -> crate::call::Calls {
        super::service::classify(
            parts,
            &bytes::Bytes::from(body.to_owned()),
            &self.shared.load(),
            None,
        )
        .expect("a JSON-RPC body")
    }
}

impl Default for ClassifyLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for ClassifyLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shared = self.shared.load();
        f.debug_struct("ClassifyLayer")
            .field("body_limit", &shared.body_limit)
            .field("format", &shared.format)
            .finish_non_exhaustive()
    }
}

impl<S> Layer<S> for ClassifyLayer {
    type Service = Classify<S>;

    fn layer(&self, inner: S) -> Classify<S> {
        Classify::new(inner, self.shared.clone())
    }
}
