use std::fmt;
use std::sync::Arc;

use tower::Layer;

use super::{FifoLimit, ResourceLimiter};
use crate::call::Name;
use crate::named::NameMap;
use crate::snapshot::Live;

#[derive(Debug)]
pub(crate) struct LayerState {
    pub(crate) limiter: ResourceLimiter,
    /// Resource key per tool; a reload swaps it.
    pub(crate) tool_keys: Live<NameMap<Name>>,
    /// A POST no classify layer read is logged once per layer.
    pub(crate) unread: crate::call::Unread,
}

/// Builds [`FifoLimit`] services: the FIFO limiter for inbound MCP `tools/call`s.
///
/// Each tool call waits for a place on its tool's resource key (the tool's name unless
/// [`tool_key`](FifoLimitLayer::tool_key) maps it; several tools may share one key and so one
/// quota). The call's tenant is its account for `max_concurrent_per_account`. Other methods,
/// and requests stormgate did not classify, pass without waiting; a POST that passed no
/// [`ClassifyLayer`](crate::classify::ClassifyLayer) (a stack built in the wrong order) is
/// logged once as a warning.
#[derive(Clone)]
pub struct FifoLimitLayer {
    shared: Arc<LayerState>,
}

impl FifoLimitLayer {
    /// Limits tool calls with `limiter`.
    pub fn new(limiter: ResourceLimiter) -> Self {
        FifoLimitLayer {
            shared: Arc::new(LayerState {
                limiter,
                tool_keys: Live::new(NameMap::default()),
                unread: Default::default(),
            }),
        }
    }

    /// Calls of `tool` use the resource key `key`. A builder step: the new layer has its own
    /// tool map (the limiter is shared), so configuring a clone never changes the original.
    pub fn tool_key(self, tool: impl Into<String>, key: impl Into<String>) -> Self {
        let mut keys = NameMap::clone(&self.shared.tool_keys.load());
        keys.insert(&tool.into(), Name::new(key.into()));
        FifoLimitLayer {
            shared: Arc::new(LayerState {
                limiter: self.shared.limiter.clone(),
                tool_keys: Live::new(keys),
                unread: Default::default(),
            }),
        }
    }

    /// Replaces the tool-to-key map (a reload, through `Control`; a hand-built stack passes
    /// the map to the layer it builds).
    pub(crate) fn set_tool_keys(&self, keys: NameMap<Name>) {
        self.shared.tool_keys.store(Arc::new(keys));
    }

    /// The layer's tool map cell, for a control's snapshots (its limiter has its own).
    pub(crate) fn tool_keys_cell(&self) -> &Live<NameMap<Name>> {
        &self.shared.tool_keys
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
            .field("tool_keys", &self.shared.tool_keys.load())
            .finish()
    }
}

impl<S> Layer<S> for FifoLimitLayer {
    type Service = FifoLimit<S>;

    fn layer(&self, inner: S) -> FifoLimit<S> {
        FifoLimit::new(inner, self.shared.clone())
    }
}
