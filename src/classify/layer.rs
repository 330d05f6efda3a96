use std::fmt;
use std::sync::Arc;

use tower::Layer;

use super::Classify;
use crate::call::{DefaultIdentity, Identify};
use crate::cost::Costs;
use crate::rejection::RejectionFormat;

/// Default bound on a buffered request body: 4 MiB, the same as rmcp's.
pub const DEFAULT_BODY_LIMIT: usize = 4 * 1024 * 1024;

/// Settings shared by every clone of the layer and its services.
#[derive(Clone)]
pub(crate) struct Shared {
    pub(crate) body_limit: usize,
    pub(crate) identity: Arc<dyn Identify>,
    pub(crate) format: Arc<RejectionFormat>,
    pub(crate) costs: Option<Arc<Costs>>,
}

/// Builds [`Classify`] services. See the [module docs](crate::classify).
#[derive(Clone)]
pub struct ClassifyLayer {
    shared: Arc<Shared>,
}

impl ClassifyLayer {
    /// A 4 MiB body limit, [`DefaultIdentity`], the default [`RejectionFormat`].
    pub fn new() -> Self {
        ClassifyLayer {
            shared: Arc::new(Shared {
                body_limit: DEFAULT_BODY_LIMIT,
                identity: Arc::new(DefaultIdentity::new()),
                format: Arc::new(RejectionFormat::default()),
                costs: None,
            }),
        }
    }

    /// The largest body read, in bytes; a larger one is answered 413.
    pub fn body_limit(mut self, bytes: usize) -> Self {
        Arc::make_mut(&mut self.shared).body_limit = bytes;
        self
    }

    /// How tenants and sessions are found.
    pub fn identity(mut self, identity: impl Identify) -> Self {
        Arc::make_mut(&mut self.shared).identity = Arc::new(identity);
        self
    }

    /// Weighs each `tools/call` with this table ([`Call::cost`](crate::Call)); without one,
    /// every call costs 1.
    pub fn costs(mut self, costs: Arc<Costs>) -> Self {
        Arc::make_mut(&mut self.shared).costs = Some(costs);
        self
    }

    /// How every layer below writes its rejections.
    pub fn format(mut self, format: RejectionFormat) -> Self {
        Arc::make_mut(&mut self.shared).format = Arc::new(format);
        self
    }
}

impl Default for ClassifyLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for ClassifyLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClassifyLayer")
            .field("body_limit", &self.shared.body_limit)
            .field("format", &self.shared.format)
            .finish_non_exhaustive()
    }
}

impl<S> Layer<S> for ClassifyLayer {
    type Service = Classify<S>;

    fn layer(&self, inner: S) -> Classify<S> {
        Classify::new(inner, self.shared.clone())
    }
}
