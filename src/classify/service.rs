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
use super::gather::Gather;
use super::layer::Settings;
use crate::call::{Arguments, Bypassed, Call, Calls, Meta, Name, Pipeline, Unclassified};
use crate::mcp::{self, ProtocolVersion};
use crate::snapshot::{Live, Snapshot};

/// Reads MCP POST bodies and attaches their [`Calls`]. Built by
/// [`ClassifyLayer`](super::ClassifyLayer).
#[derive(Clone)]
pub struct Classify<S> {
    inner: S,
    shared: Arc<Live<Settings>>,
}

impl<S> Classify<S> {
    pub(crate) fn new(inner: S, shared: Arc<Live<Settings>>) -> Self {
        Classify { inner, shared }
    }
}

impl<S: fmt::Debug> fmt::Debug for Classify<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Classify")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
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
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        if req.method() != Method::POST || req.extensions().get::<Bypassed>().is_some() {
            // Nothing to read: the readied inner service, called in place.
            return ResponseFuture::call(self.inner.call(req.map(Body::new)));
        }
        // The request runs under one snapshot of every stage's settings, taken at its head.
        let own = self.shared.load();
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
        let (mut parts, body) = req.into_parts();
        if let Some(snapshot) = snapshot {
            parts.extensions.insert(snapshot);
        }
        // The body is read first: this request takes the readied service, a clone waits for
        // the next poll_ready.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        ResponseFuture::collect(
            Gather::new(Limited::new(body, limit)),
            parts,
            inner,
            shared,
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

/// Attaches the classification of `body` to `parts` and rebuilds the request.
pub(super) fn classified(mut parts: Parts, body: Bytes, shared: &Settings) -> Request<Body> {
    match classify(&parts, &body, shared) {
        Ok(calls) => {
            for call in calls.iter() {
                ::metrics::counter!(crate::metrics::MESSAGES, "kind" => call.kind.as_str())
                    .increment(1);
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

/// The classification of one MCP POST body.
pub(crate) fn classify(
    parts: &Parts,
    body: &Bytes,
    shared: &Settings,
) -> Result<Calls, Unclassified> {
    let snapshot = parts.extensions.get::<Arc<Snapshot>>();
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
                method: method.map(|n| shared.names.get(n).into_shared()),
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
