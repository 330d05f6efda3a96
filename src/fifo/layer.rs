use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use tower::Layer;

use super::{FifoLimit, ResourceLimiter};

#[derive(Debug, Clone)]
pub(crate) struct Shared {
    pub(crate) limiter: ResourceLimiter,
    pub(crate) tool_keys: HashMap<String, String>,
}

impl Shared {
    /// The resource key of a tool: configured, else the tool's name.
    pub(crate) fn key_of<'a>(&'a self, tool: &'a str) -> &'a str {
        self.tool_keys.get(tool).map_or(tool, String::as_str)
    }
}

/// Builds [`FifoLimit`] services: the FIFO limiter for inbound MCP `tools/call`s.
///
/// Each tool call waits for a place on its tool's resource key (the tool's name unless
/// [`tool_key`](FifoLimitLayer::tool_key) maps it; several tools may share one key and so one
/// quota). The call's tenant is its account for `max_concurrent_per_account`. Other methods,
/// and requests stormgate did not classify, pass without waiting.
#[derive(Clone)]
pub struct FifoLimitLayer {
    shared: Arc<Shared>,
}

impl FifoLimitLayer {
    /// Limits tool calls with `limiter`.
    pub fn new(limiter: ResourceLimiter) -> Self {
        FifoLimitLayer {
            shared: Arc::new(Shared {
                limiter,
                tool_keys: HashMap::new(),
            }),
        }
    }

    /// Calls of `tool` use the resource key `key`.
    pub fn tool_key(mut self, tool: impl Into<String>, key: impl Into<String>) -> Self {
        Arc::make_mut(&mut self.shared)
            .tool_keys
            .insert(tool.into(), key.into());
        self
    }

    /// The limiter, to report upstream 429s or read queue depths.
    pub fn limiter(&self) -> &ResourceLimiter {
        &self.shared.limiter
    }
}

impl fmt::Debug for FifoLimitLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FifoLimitLayer")
            .field("limiter", &self.shared.limiter)
            .field("tool_keys", &self.shared.tool_keys)
            .finish()
    }
}

impl<S> Layer<S> for FifoLimitLayer {
    type Service = FifoLimit<S>;

    fn layer(&self, inner: S) -> FifoLimit<S> {
        FifoLimit::new(inner, self.shared.clone())
    }
}
