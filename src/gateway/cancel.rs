//! What the gateway tells the upstream when a client goes before its call's answer ended:
//! MCP's `notifications/cancelled`, one per request id, on the call's session.
//!
//! Dropping the upstream request closes its connection, but an MCP server need not stop a
//! tool for that: the Python SDK keeps running it (and holding whatever pool place it took)
//! until it ends. An agent that times out and retries would so drain the upstream's pool with
//! calls nobody waits for. A [`Cancel`] is made for each proxied request that carries
//! requests (not for `initialize`, which MCP says must not be cancelled); it goes with the
//! answer's body and is disarmed when the body ends. Dropped while armed (the client went,
//! a deadline cut the call, the upstream gave no headers in time), it sends the
//! notifications from one task of its own, each bounded by the request timeout.

use std::sync::Arc;

use http::HeaderMap;

use super::proxy::Upstream;
use crate::call::{CallKind, Calls, RequestId};
use crate::protocol::{LAST_EVENT_ID, METHOD, NAME};
use crate::watched::{Watch, Watched};

/// The cancellation of one proxied request's calls, sent when dropped armed.
pub(super) struct Cancel {
    upstream: Arc<Upstream>,
    /// The outbound request's headers (session, protocol version, credentials, Host).
    headers: HeaderMap,
    ids: Vec<RequestId>,
    armed: bool,
}

impl Cancel {
    /// The cancellation of `calls`' requests, sent with `headers`; `None` when it has none to
    /// cancel.
    pub(super) fn of(
        calls: Option<&Calls>,
        upstream: &Arc<Upstream>,
        headers: &HeaderMap,
    ) -> Option<Cancel> {
        let ids: Vec<RequestId> = calls?
            .iter()
            .filter(|c| c.kind == CallKind::Request && c.method.as_deref() != Some("initialize"))
            .filter_map(|c| c.id.clone())
            .collect();
        if ids.is_empty() {
            return None;
        }
        let mut headers = headers.clone();
        for name in [METHOD, NAME, LAST_EVENT_ID] {
            headers.remove(name);
        }
        Some(Cancel {
            upstream: upstream.clone(),
            headers,
            ids,
            armed: true,
        })
    }

    /// The answer ended (or cannot be cancelled any more): nothing is sent.
    pub(super) fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for Cancel {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let upstream = self.upstream.clone();
        let headers = std::mem::take(&mut self.headers);
        let ids = std::mem::take(&mut self.ids);
        tracing::debug!(
            calls = ids.len(),
            "a client went before its answer ended: cancelling upstream"
        );
        runtime.spawn(async move {
            for id in ids {
                let body = format!(
                    r#"{{"jsonrpc":"2.0","method":"notifications/cancelled","params":{{"requestId":{},"reason":"the client went away"}}}}"#,
                    id.as_json()
                );
                upstream.notify(headers.clone(), body).await;
            }
        });
    }
}

/// An upstream answer's body that disarms its [`Cancel`] when it ends.
pub(super) type CancelOnDrop<B> = Watched<B, Cancel>;

impl<D> Watch<D> for Cancel {
    /// An error too: the upstream's connection broke, nothing is left to cancel.
    fn end(&mut self, _failed: bool) {
        self.disarm();
    }
}
