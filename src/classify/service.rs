use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use http::request::Parts;
use http::{Method, Request, StatusCode};
use http_body_util::Limited;
use tower::{BoxError, Service};

use super::ResponseFuture;
use super::copies::Copies;
use super::gather::Gather;
use super::layer::Settings;
use crate::call::{Arguments, Bypassed, Call, Calls, Meta, Name, Pipeline, Record, Unclassified};
use crate::mcp::{self, ProtocolVersion};
use crate::snapshot::{Live, Snapshot};

/// Reads MCP POST bodies and attaches their [`Calls`]. Built by
/// [`ClassifyLayer`](super::ClassifyLayer).
///
/// A request reads its body before it calls the rest of the stack, so it takes a service of
/// its own: [`poll_ready`](Service::poll_ready) takes one (shared, not copied, by the clones of
/// this service: see `copies`) and readies it, and the next call takes it with the request,
/// which hands it back once it has called it. A router that clones its route for every request
/// (axum does) so pays for no copy of the stack and the MCP service below it per request, but
/// for one per thread the first time, and one more per request read at once on a thread.
pub struct Classify<S> {
    /// The service this was built around and the copies of it requests hand back.
    copies: Arc<Copies<S>>,
    /// The copy readied by `poll_ready`, which the next call takes.
    ready: Option<S>,
    shared: Arc<Live<Settings>>,
}

impl<S> Classify<S> {
    pub(crate) fn new(inner: S, shared: Arc<Live<Settings>>) -> Self {
        Classify {
            copies: Arc::new(Copies::new(inner)),
            ready: None,
            shared,
        }
    }
}

/// A clone shares the service it was built around and has none readied.
impl<S> Clone for Classify<S> {
    fn clone(&self) -> Self {
        Classify {
            copies: self.copies.clone(),
            ready: None,
            shared: self.shared.clone(),
        }
    }
}

impl<S: fmt::Debug> fmt::Debug for Classify<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Classify")
            .field("inner", &self.copies)
            .finish_non_exhaustive()
    }
}

impl<S: Clone> Classify<S> {
    /// The service readied for this call (a copy, not readied, for a caller that did not ask
    /// `poll_ready` first).
    fn take(&mut self) -> S {
        self.ready.take().unwrap_or_else(|| self.copies.take())
    }
}

impl<S, B, ResBody> Service<Request<B>> for Classify<S>
where
    S: Service<Request<Body>, Response = http::Response<ResBody>> + Clone,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    type Response = Response;
    type Error = S::Error;
    type Future = ResponseFuture<S, B>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        let copies = &self.copies;
        self.ready
            .get_or_insert_with(|| copies.take())
            .poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        if req.method() != Method::POST || req.extensions().get::<Bypassed>().is_some() {
            // Nothing to read: the readied inner service, called at once and handed back.
            let mut inner = self.take();
            let future = inner.call(req.map(Body::new));
            self.copies.give_back(inner);
            return ResponseFuture::call(future);
        }
        // The request runs under one snapshot of every stage's settings, taken at its head.
        let own = self.shared.peek();
        let snapshot = own.snapshots.as_ref().map(|s| s.load_full());
        let shared = self.shared.read_shared(snapshot.as_deref());
        let limit = shared.body_limit;
        let declared = req
            .headers()
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > limit as u64) {
            return ResponseFuture::done(too_large(limit));
        }
        // What the body will take: its declared or exact length (within the limit, so it fits
        // in usize), else the limit.
        let bytes = declared
            .or_else(|| http_body::Body::size_hint(req.body()).exact())
            .map_or(limit, |n| (n as usize).min(limit));
        let Some(reservation) = shared.buffering.reserve(bytes, shared.max_buffered) else {
            return ResponseFuture::done(busy());
        };
        let (parts, body) = req.into_parts();
        // The body is read first: this request takes the readied service with it.
        ResponseFuture::collect(
            Gather::new(Limited::new(body, limit)),
            parts,
            self.take(),
            self.copies.clone(),
            shared,
            snapshot,
            reservation,
        )
    }
}

pub(super) fn too_large(limit: usize) -> Response {
    ::metrics::counter!(crate::metrics::BODY_REJECTED, "status" => "413").increment(1);
    mcp::reply::invalid_request(
        StatusCode::PAYLOAD_TOO_LARGE,
        &format!("request body larger than {limit} bytes"),
    )
}

/// Too many bytes of bodies are being read at once: answered before this one is read.
fn busy() -> Response {
    ::metrics::counter!(crate::metrics::BODY_REJECTED, "status" => "503").increment(1);
    let mut res = mcp::reply::invalid_request(
        StatusCode::SERVICE_UNAVAILABLE,
        "too many request bodies being read at once: retry after 1 s",
    );
    res.headers_mut().insert(
        http::header::RETRY_AFTER,
        http::HeaderValue::from_static("1"),
    );
    res
}

/// The body did not arrive whole within the body timeout.
pub(super) fn too_slow(timeout: std::time::Duration) -> Response {
    ::metrics::counter!(crate::metrics::BODY_REJECTED, "status" => "408").increment(1);
    mcp::reply::invalid_request(
        StatusCode::REQUEST_TIMEOUT,
        &format!(
            "request body not received within {} ms",
            timeout.as_millis()
        ),
    )
}

pub(super) fn unreadable() -> Response {
    ::metrics::counter!(crate::metrics::BODY_REJECTED, "status" => "400").increment(1);
    mcp::reply::invalid_request(StatusCode::BAD_REQUEST, "request body could not be read")
}

/// Attaches the classification of `body` under `snapshot` to `parts` and rebuilds the
/// request.
pub(super) fn classified(
    mut parts: Parts,
    body: Bytes,
    shared: &Settings,
    snapshot: Option<&Arc<Snapshot>>,
) -> Request<Body> {
    match classify(&parts, &body, shared, snapshot) {
        Ok(calls) => {
            for call in calls.iter() {
                shared.messages.count(call.kind);
                if call.header_mismatch {
                    ::metrics::counter!(crate::metrics::HEADER_MISMATCH).increment(1);
                }
            }
            if let Some(d) = calls.single().and_then(|c| c.deadline()) {
                parts.extensions.insert(crate::extensions::Deadline(d));
            }
            parts.extensions.insert(calls);
        }
        Err(unclassified) => {
            ::metrics::counter!(crate::metrics::UNCLASSIFIED, "reason" => unclassified.as_str())
                .increment(1);
            parts.extensions.insert(unclassified);
        }
    }
    Request::from_parts(parts, Body::from(body))
}

fn header_str<'a>(parts: &'a Parts, name: &http::HeaderName) -> Option<&'a str> {
    parts.headers.get(name).and_then(|v| v.to_str().ok())
}

/// The classification of one MCP POST body, every call of it under `snapshot` (the settings
/// its request started with, when a `Control` built the stack).
pub(crate) fn classify(
    parts: &Parts,
    body: &Bytes,
    shared: &Settings,
    snapshot: Option<&Arc<Snapshot>>,
) -> Result<Calls, Unclassified> {
    // The kill switch's `off` refuses nothing: no deadline to cut a call at, no arguments'
    // key to compute.
    let off = shared.switch.read(snapshot.map(Arc::as_ref)).mode == crate::policy::Mode::Off;
    let parsed = mcp::parse(body, !off)?;
    let protocol_version =
        header_str(parts, &mcp::PROTOCOL_VERSION).and_then(|v| v.parse::<ProtocolVersion>().ok());
    if parsed.batch && !shared.batches.classifies(protocol_version) {
        return Err(Unclassified::BatchUnsupported);
    }
    let tenant = shared.identity.tenant(parts);
    let header_method = header_str(parts, &mcp::METHOD);
    let header_name = header_str(parts, &mcp::NAME);
    let single = !parsed.batch;
    let now = tokio::time::Instant::now();
    let deadlines = (!off).then_some(&shared.deadlines);
    let calls = parsed
        .into_messages()
        .enumerate()
        .map(|(seq, m)| {
            let method = m.method.as_deref();
            let (tool, resource, prompt) = match method {
                Some("tools/call") => (m.name.as_deref(), None, None),
                Some("resources/read") => (None, m.uri.as_deref(), None),
                Some("prompts/get") => (None, None, m.name.as_deref()),
                _ => (None, None, None),
            };
            let target = tool.or(resource).or(prompt);
            let tool_name = tool.map(|n| shared.names.get(n));
            let cost = match (&shared.costs, &tool_name) {
                (Some(costs), Some(tool)) => costs.weight_in(tool, snapshot.map(Arc::as_ref)),
                _ => 1,
            };
            let header_mismatch = single
                && (header_method.is_some_and(|h| Some(h) != method)
                    || header_name.is_some_and(|h| Some(h) != target));
            Call {
                kind: m.kind,
                id: m.id.map(|raw| crate::call::RequestId::in_body(body, raw)),
                method: method.map(|n| shared.names.method(n)),
                tool: tool_name,
                resource: resource.map(Name::from), // a uri is more an argument than a name: not kept
                prompt: prompt.map(|n| shared.names.get(n)),
                session: shared.identity.session(parts, Meta::new(m.meta), &tenant),
                tenant: tenant.clone(),
                protocol_version,
                header_mismatch,
                span: m.span,
                seq: u32::try_from(seq).unwrap_or(u32::MAX),
                arguments: m.arguments.map(|a| Arguments {
                    text: body.slice_ref(a.text.as_bytes()),
                    key: a.key,
                }),
                pipeline: Pipeline {
                    cost,
                    deadline: tool
                        .zip(deadlines)
                        .and_then(|(t, d)| d.for_tool(t))
                        .map(|d| now + d),
                    charges: Default::default(),
                    snapshot: snapshot.cloned(),
                    record: Record::kept(),
                },
            }
        })
        .collect();
    Ok(Calls {
        calls,
        batch: !single,
        body: body.clone(),
        format: shared.format.clone(),
        schemas: shared.schemas.clone(),
        refusals: shared.refusals.clone(),
    })
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::future::{Ready, ready};
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tower::{Layer, ServiceExt};

    use super::*;
    use crate::classify::ClassifyLayer;

    /// Answers every request with an empty 200 and counts its clones.
    struct Counted(Arc<AtomicUsize>);

    impl Clone for Counted {
        fn clone(&self) -> Self {
            self.0.fetch_add(1, Ordering::Relaxed);
            Counted(self.0.clone())
        }
    }

    impl Service<Request<Body>> for Counted {
        type Response = Response;
        type Error = Infallible;
        type Future = Ready<Result<Response, Infallible>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: Request<Body>) -> Self::Future {
            ready(Ok(Response::new(Body::empty())))
        }
    }

    /// axum clones a route for every request; the stack below the classifier (the MCP
    /// service with it) is copied for the first request on a thread and handed back by each,
    /// a call whose body is read or not: the requests after it copy nothing.
    #[tokio::test]
    async fn requests_one_after_another_copy_the_service_below_once() {
        let clones = Arc::new(AtomicUsize::new(0));
        let route = ClassifyLayer::new().layer(Counted(clones.clone()));
        let call = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t"}}"#;
        for (n, method) in [Method::POST, Method::GET, Method::POST, Method::POST]
            .into_iter()
            .enumerate()
        {
            let request = Request::builder()
                .method(method)
                .uri("/mcp")
                .header(http::header::CONTENT_TYPE, "application/json")
                .body(Body::from(call))
                .unwrap();
            let answer = route.clone().oneshot(request).await.unwrap();
            assert_eq!(answer.status(), StatusCode::OK);
            assert_eq!(clones.load(Ordering::Relaxed), 1, "request {n}");
        }
    }
}
