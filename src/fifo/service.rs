use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use http::Request;
use tower::{BoxError, Service, ServiceExt};

use super::body::{LeaseBody, Leases};
use super::layer::LayerState;
use super::{Acquire, DEFAULT_KEY, QueueWait};
use crate::call::{Calls, Name};
use crate::charges::ChargedTo;
use crate::mcp::verdict;
use crate::response::ResponseFuture;

/// [`DEFAULT_KEY`] with its key.
static DEFAULT: std::sync::LazyLock<Name> = std::sync::LazyLock::new(|| Name::new(DEFAULT_KEY));

/// The FIFO limiter for inbound MCP tool calls. Built by [`FifoLimitLayer`](super::FifoLimitLayer).
pub struct FifoLimit<S> {
    inner: S,
    shared: Arc<LayerState>,
}

impl<S> FifoLimit<S> {
    pub(crate) fn new(inner: S, shared: Arc<LayerState>) -> Self {
        FifoLimit { inner, shared }
    }
}

impl<S: Clone> Clone for FifoLimit<S> {
    fn clone(&self) -> Self {
        FifoLimit {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl<S: fmt::Debug> fmt::Debug for FifoLimit<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FifoLimit")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S, ResBody> Service<Request<Body>> for FifoLimit<S>
where
    S: Service<Request<Body>, Response = http::Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ResBody: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    type Response = Response;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let calls = req.extensions().get::<Calls>();
        if calls.is_none() {
            self.shared.unread.check(&req, "FifoLimitLayer");
        }
        let acquires = self.acquires(calls);
        if acquires.is_empty() {
            // Nothing to wait for: the readied inner service, called in place.
            return ResponseFuture::inner(self.inner.call(req));
        }
        // A call that waits takes an unreadied clone and readies it after the wait, so no
        // readiness (a reserved slot of an inner limit) is held while it queues.
        let mut inner = self.inner.clone();
        ResponseFuture::waiting(Box::pin(async move {
            let mut leases = Vec::with_capacity(acquires.len());
            let mut rejected = Vec::new();
            for (indices, acquire) in acquires {
                match acquire.await {
                    Ok(lease) => leases.push(lease),
                    Err(e) => {
                        let rejection = e.to_rejection();
                        rejected.extend(indices.into_iter().map(|i| (i, rejection.clone())));
                    }
                }
            }
            rejected.sort_by_key(|(i, _)| *i);
            let queue_wait = leases
                .iter()
                .map(|l| l.queue_wait())
                .max()
                .unwrap_or(Duration::ZERO);
            match verdict::apply(req, &rejected) {
                verdict::Verdict::Answer(response) => Ok(response),
                verdict::Verdict::Forward { mut request, merge } => {
                    // Stages inside (the deadline and outcome layers) see the wait too.
                    request.extensions_mut().insert(QueueWait(queue_wait));
                    let response = inner.ready().await?.call(request).await?;
                    let mut response =
                        response.map(|b| Body::new(LeaseBody::new(b, Leases::new(leases))));
                    response.extensions_mut().insert(QueueWait(queue_wait));
                    Ok(match merge {
                        Some(m) => verdict::merge(response, m),
                        None => response,
                    })
                }
            }
        }))
    }
}

impl<S> FifoLimit<S> {
    /// One acquisition per distinct resource key among the request's tool calls, in key order
    /// (so two batches never wait for each other's keys crosswise), each with the indices of
    /// the calls it covers. A batch holds at most one place per key.
    fn acquires(&self, calls: Option<&Calls>) -> Vec<(Vec<usize>, Acquire)> {
        let Some(calls) = calls else {
            return Vec::new();
        };
        // The settings of the request's snapshot.
        let snapshot = calls.iter().next().and_then(|c| c.snapshot());
        let tool_keys = self.shared.tool_keys.read(snapshot);
        let limiter = &self.shared.limiter;
        let default_limited = limiter.default_limited_in(snapshot);
        let mut wanted: Vec<(&Name, usize, Option<&str>)> = calls
            .iter()
            .enumerate()
            .filter(|(_, c)| c.is_chargeable())
            .filter_map(|(i, c)| {
                let tool = c.tool.as_ref()?;
                // Only configured keys are kept one by one: a tool name is the client's
                // choice, and an unknown one must not make state.
                let key = match tool_keys.get(tool) {
                    Some(key) => key,
                    None if limiter.is_configured_in(tool, snapshot) => tool,
                    None if default_limited => &DEFAULT,
                    None => return None,
                };
                Some((key, i, Some(c.tenant.as_str())))
            })
            .collect();
        wanted.sort_by(|a, b| a.0.as_str().cmp(b.0.as_str()).then(a.1.cmp(&b.1)));
        let mut groups: Vec<(&Name, Vec<usize>, Option<&str>)> = Vec::with_capacity(wanted.len());
        for (key, i, account) in wanted {
            match groups.last_mut() {
                Some((last, indices, _)) if *last == key => indices.push(i),
                _ => groups.push((key, vec![i], account)),
            }
        }
        groups
            .into_iter()
            .map(|(key, indices, account)| {
                // A place shared by several calls must come before the earliest deadline.
                let deadline = indices
                    .iter()
                    .filter_map(|&i| calls.calls[i].deadline())
                    .min();
                // A place shared by several calls (one client's batch) is beyond its share
                // only if every call is; unknown if any call was not charged.
                let charged_to = indices
                    .iter()
                    .map(|&i| calls.calls[i].charges().charged_to())
                    .reduce(|a, b| {
                        let (a, b) = (a?, b?);
                        Some(ChargedTo {
                            beyond_share: a.beyond_share && b.beyond_share,
                            ..a
                        })
                    })
                    .flatten();
                let acquire = self
                    .shared
                    .limiter
                    .acquire_named(key, account, deadline)
                    .charged_to(charged_to);
                (indices, acquire)
            })
            .collect()
    }
}
