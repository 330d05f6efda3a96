//! The proxy: a tower service that forwards each request to the upstream MCP server and
//! streams its answer back.

use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode, Uri};
use hyper_util::client::legacy::connect::{CaptureConnection, HttpConnector, capture_connection};
use hyper_util::client::legacy::{Client, ResponseFuture};
use hyper_util::rt::{TokioExecutor, TokioTimer};
use serde_json::value::RawValue;

use super::cancel::{Cancel, CancelOnDrop};
use super::config::{GatewayConfig, parse_upstream};
use super::connector::{Answered, Stamped};
use crate::call::{CallKind, Calls};
use crate::error::ConfigError;

/// The request headers every MCP exchange needs, always passed to the upstream (the answer's
/// headers all pass back but the hop-by-hop ones). Credentials pass only when
/// [`GatewayConfig::forward_headers`] lists them.
pub const FORWARDED: [HeaderName; 11] = [
    header::CONTENT_TYPE,
    header::ACCEPT,
    header::USER_AGENT,
    header::ORIGIN,
    crate::protocol::SESSION_ID,
    crate::protocol::PROTOCOL_VERSION,
    crate::protocol::METHOD,
    crate::protocol::NAME,
    crate::protocol::LAST_EVENT_ID,
    HeaderName::from_static("traceparent"),
    HeaderName::from_static("tracestate"),
];

/// The JSON-RPC error code of an answer the gateway writes itself because the upstream gave
/// none (connection refused, timed out, broken): `-32603`, internal error.
pub const UPSTREAM_ERROR_CODE: i32 = -32603;

/// Why the upstream gave no answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum UpstreamFailure {
    /// No connection could be made (refused, unreachable, connect timeout): HTTP 502.
    Connect,
    /// The connection broke before the answer's headers came: HTTP 502.
    Broken,
    /// The answer's headers did not come within `request_timeout_ms`: HTTP 504.
    Timeout,
}

impl UpstreamFailure {
    /// The HTTP status the client gets.
    pub const fn status(self) -> StatusCode {
        match self {
            UpstreamFailure::Connect | UpstreamFailure::Broken => StatusCode::BAD_GATEWAY,
            UpstreamFailure::Timeout => StatusCode::GATEWAY_TIMEOUT,
        }
    }

    /// The snake_case name in logs and in the error's `data.reason`.
    pub const fn as_str(self) -> &'static str {
        match self {
            UpstreamFailure::Connect => "upstream_unreachable",
            UpstreamFailure::Broken => "upstream_broken",
            UpstreamFailure::Timeout => "upstream_timeout",
        }
    }

    const fn message(self) -> &'static str {
        match self {
            UpstreamFailure::Connect => "the upstream MCP server is unreachable",
            UpstreamFailure::Broken => "the upstream MCP server closed the connection",
            UpstreamFailure::Timeout => "the upstream MCP server did not answer in time",
        }
    }
}

impl fmt::Display for UpstreamFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message())
    }
}

/// How the proxy reaches its upstream: TCP, and TLS over it for `https` (feature `tls`).
#[cfg(feature = "tls")]
type Connector = hyper_rustls::HttpsConnector<HttpConnector>;
/// How the proxy reaches its upstream: TCP (`http` only without the `tls` feature).
#[cfg(not(feature = "tls"))]
type Connector = HttpConnector;

/// The upstream's connector: TCP with the connect timeout and `TCP_NODELAY`; with the `tls`
/// feature, TLS for `https` URLs, the certificate checked for the URL's host against the
/// bundled Mozilla roots and `ca_file`.
fn connector(config: &GatewayConfig) -> Result<Connector, ConfigError> {
    let mut tcp = HttpConnector::new();
    tcp.set_connect_timeout(Some(config.connect_timeout.get()));
    tcp.set_nodelay(true);
    #[cfg(feature = "tls")]
    {
        tcp.enforce_http(false);
        Ok(hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls_config(config.ca_file.as_deref())?)
            .https_or_http()
            .enable_http1()
            .wrap_connector(tcp))
    }
    #[cfg(not(feature = "tls"))]
    {
        if config.ca_file.is_some() {
            return Err(ConfigError::new(
                "gateway.ca_file",
                "needs the `tls` feature (this build has no TLS client)",
            ));
        }
        Ok(tcp)
    }
}

/// The TLS client settings: the bundled Mozilla roots and the certificates of `ca_file`.
#[cfg(feature = "tls")]
fn tls_config(ca_file: Option<&std::path::Path>) -> Result<rustls::ClientConfig, ConfigError> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let field = "gateway.ca_file";
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    if let Some(path) = ca_file {
        let shown = path.display();
        let certs = CertificateDer::pem_file_iter(path)
            .and_then(Iterator::collect::<Result<Vec<_>, _>>)
            .map_err(|e| ConfigError::new(field, format!("{shown}: {e}")))?;
        if certs.is_empty() {
            return Err(ConfigError::new(field, format!("{shown}: no certificate")));
        }
        for cert in certs {
            roots
                .add(cert)
                .map_err(|e| ConfigError::new(field, format!("{shown}: {e}")))?;
        }
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| ConfigError::new(field, e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

/// The upstream and the client that reaches it, shared by every request of one proxy.
pub(super) struct Upstream {
    client: Client<Stamped<Connector>, Body>,
    /// The same without a pool: every request on a connection of its own, for the one retry
    /// of a request that met a dead pooled connection ([`Again`]).
    fresh: Client<Stamped<Connector>, Body>,
    /// `scheme://authority`, for every request.
    scheme: http::uri::Scheme,
    authority: http::uri::Authority,
    /// The upstream's path and query.
    path_and_query: http::uri::PathAndQuery,
    host: HeaderValue,
    request_timeout: Duration,
    forward: Vec<HeaderName>,
    /// When a failure was last logged (ms since `started`, 0: never): at most one a second.
    last_warned: AtomicU64,
    started: std::time::Instant,
}

impl Upstream {
    /// Sends the notification `body` (JSON-RPC text) with `headers`, at most the request
    /// timeout; its answer read frame by frame and dropped (never kept, whatever its size),
    /// failures ignored (it is a courtesy).
    pub(super) async fn notify(&self, headers: HeaderMap, body: String) {
        let uri = Uri::builder()
            .scheme(self.scheme.clone())
            .authority(self.authority.clone())
            .path_and_query(self.path_and_query.clone())
            .build()
            .unwrap_or_default();
        let mut req = Request::new(Body::from(body));
        *req.method_mut() = http::Method::POST;
        *req.uri_mut() = uri;
        *req.headers_mut() = headers;
        let sent = async {
            if let Ok(answer) = self.client.request(req).await {
                let mut body = answer.into_body();
                while let Some(Ok(_)) = http_body_util::BodyExt::frame(&mut body).await {}
            }
        };
        let _ = tokio::time::timeout(self.request_timeout, sent).await;
    }

    /// Whether this failure is logged: the first, then at most one a second (a storm against
    /// a dead upstream would otherwise write a line per request; the counter counts each).
    fn should_warn(&self) -> bool {
        let now = (self.started.elapsed().as_millis() as u64).max(1);
        let last = self.last_warned.load(Ordering::Relaxed);
        (last == 0 || now.saturating_sub(last) >= 1000)
            && self
                .last_warned
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }
}

/// The transparent proxy to one upstream MCP server, as a tower service: put it inside the
/// stack (`Control::wrap(Router::new().route_service("/mcp", proxy))`) and the stack
/// protects the upstream as it would a local server, learning outcomes from the upstream's
/// answers.
///
/// * Every method is forwarded to the upstream URL (the request's query string replaces the
///   upstream's when it has one); the request and answer bodies are streamed, never
///   buffered, so SSE events pass one by one and long-lived GET streams are held.
/// * Request headers: the ones in [`FORWARDED`], plus the credentials named in
///   `forward_headers`; `Host` is the upstream's. Answer headers: all but the hop-by-hop
///   ones.
/// * A request that met a pooled connection the upstream had closed (its keep-alive ended
///   while the connection sat idle) is sent again, once, on a fresh connection: only when
///   it failed before any byte of an answer, on a connection that had carried an answer
///   before, and its whole body is at hand (see `pool_idle_timeout_ms`, which lets idle
///   connections go before the usual servers close them). A fresh connection that breaks is
///   the upstream's failure, and nothing is sent twice.
/// * No answer from the upstream: 502 (unreachable, broken) or 504 (no headers within
///   `request_timeout_ms`) with a JSON-RPC error per request id of the body
///   ([`UPSTREAM_ERROR_CODE`], `data.reason` from [`UpstreamFailure::as_str`]); `id: null`
///   when the request carried none the stack classified (GET, DELETE, notifications, or
///   mode `off` with `pass_through`).
/// * Nothing is spawned per request: when the client goes, its response future or body is
///   dropped, and with it the upstream request (its connection is closed). When that request
///   carried calls whose answer had not ended, the upstream is also sent
///   `notifications/cancelled` for each (from one task), since a server may keep running a
///   tool whose connection closed.
#[derive(Clone)]
pub struct Proxy {
    upstream: Arc<Upstream>,
}

impl fmt::Debug for Proxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Proxy")
            .field("upstream", &self.upstream.authority)
            .field("path", &self.upstream.path_and_query)
            .finish_non_exhaustive()
    }
}

impl Proxy {
    /// A proxy to `config.upstream`, validated (an absent upstream is a
    /// `gateway.upstream` error). Needs a tokio runtime when it serves, not when built.
    pub fn new(config: &GatewayConfig) -> Result<Proxy, ConfigError> {
        config.validate()?;
        let url = config
            .upstream
            .as_deref()
            .ok_or_else(|| ConfigError::new("gateway.upstream", "must be set"))?;
        let uri = parse_upstream(url)?;
        let parts = uri.into_parts();
        let (Some(scheme), Some(authority)) = (parts.scheme, parts.authority) else {
            return Err(ConfigError::new(
                "gateway.upstream",
                "needs a scheme and a host",
            ));
        };
        let path_and_query = parts
            .path_and_query
            .unwrap_or_else(|| http::uri::PathAndQuery::from_static("/"));
        let host = HeaderValue::from_str(authority.as_str())
            .map_err(|_| ConfigError::new("gateway.upstream", "the host is not a header value"))?;
        let connector = connector(config)?;
        let client = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(config.pool_idle_timeout.get())
            .pool_max_idle_per_host(config.pool_max_idle)
            .build(Stamped(connector.clone()));
        let fresh = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(0)
            .build(Stamped(connector));
        Ok(Proxy {
            upstream: Arc::new(Upstream {
                client,
                fresh,
                scheme,
                authority,
                path_and_query,
                host,
                request_timeout: config.request_timeout.get(),
                forward: config.forward_header_names()?,
                last_warned: AtomicU64::new(0),
                started: std::time::Instant::now(),
            }),
        })
    }

    /// The upstream URL requests go to.
    pub fn upstream(&self) -> Uri {
        let u = &*self.upstream;
        Uri::builder()
            .scheme(u.scheme.clone())
            .authority(u.authority.clone())
            .path_and_query(u.path_and_query.clone())
            .build()
            .unwrap_or_default()
    }

    /// The upstream request for `req`: its URI, the headers that pass, its body as is.
    fn outbound(&self, req: Request<Body>) -> Request<Body> {
        let u = &*self.upstream;
        let (parts, body) = req.into_parts();
        let path_and_query = match parts.uri.query() {
            Some(q) => format!("{}?{q}", u.path_and_query.path())
                .parse()
                .unwrap_or_else(|_| u.path_and_query.clone()),
            None => u.path_and_query.clone(),
        };
        let uri = Uri::builder()
            .scheme(u.scheme.clone())
            .authority(u.authority.clone())
            .path_and_query(path_and_query)
            .build()
            .unwrap_or_default();
        let mut headers = HeaderMap::with_capacity(FORWARDED.len() + 1);
        headers.insert(header::HOST, u.host.clone());
        for name in FORWARDED.iter().chain(&u.forward) {
            for value in parts.headers.get_all(name) {
                headers.append(name.clone(), value.clone());
            }
        }
        let mut out = Request::new(body);
        *out.method_mut() = parts.method;
        *out.uri_mut() = uri;
        *out.headers_mut() = headers;
        out
    }
}

/// The answer's headers without the hop-by-hop ones (and those its `Connection` names), and
/// without `Content-Length` (the body's own length says it, and the stack may rewrite it).
fn strip_answer_headers(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .take(16)
        .collect();
    for name in named {
        headers.remove(name);
    }
    let hop: Vec<HeaderName> = headers
        .keys()
        .filter(|n| super::config::is_hop_by_hop(n))
        .cloned()
        .collect();
    for name in hop {
        headers.remove(name);
    }
    headers.remove(header::CONTENT_LENGTH);
}

#[derive(serde::Serialize)]
struct ErrorObject {
    code: i32,
    message: &'static str,
    data: ErrorData,
}

#[derive(serde::Serialize)]
struct ErrorData {
    reason: &'static str,
}

#[derive(serde::Serialize)]
struct ErrorAnswer<'a> {
    jsonrpc: &'static str,
    id: Option<&'a RawValue>,
    error: &'a ErrorObject,
}

/// The answer the gateway writes when the upstream gave none: one JSON-RPC error per request
/// id of the body (an array for a batch), `id: null` when there is none.
pub(crate) fn failure_answer(failure: UpstreamFailure, calls: Option<&Calls>) -> Response<Body> {
    let error = ErrorObject {
        code: UPSTREAM_ERROR_CODE,
        message: failure.message(),
        data: ErrorData {
            reason: failure.as_str(),
        },
    };
    let answer = |id| ErrorAnswer {
        jsonrpc: "2.0",
        id,
        error: &error,
    };
    let body = match calls {
        Some(calls) if calls.is_batch() => {
            let answers: Vec<_> = calls
                .iter()
                .filter(|c| c.kind == CallKind::Request)
                .map(|c| answer(c.id.as_ref().map(|id| id.raw())))
                .collect();
            serde_json::to_vec(&answers)
        }
        Some(calls) => serde_json::to_vec(&answer(
            calls
                .single()
                .filter(|c| c.kind == CallKind::Request)
                .and_then(|c| c.id.as_ref())
                .map(|id| id.raw()),
        )),
        None => serde_json::to_vec(&answer(None)),
    }
    .unwrap_or_default();
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = failure.status();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

pin_project_lite::pin_project! {
    /// The future of one proxied request (no box of its own): the upstream's answer, or the
    /// gateway's error answer when none came. Dropping it drops the upstream request, and
    /// cancels its calls upstream (`notifications/cancelled`).
    pub struct ProxyFuture {
        #[pin]
        sent: tokio::time::Timeout<Attempts>,
        calls: Option<Calls>,
        method: http::Method,
        upstream: Arc<Upstream>,
        cancel: Option<Cancel>,
    }
}

impl fmt::Debug for ProxyFuture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProxyFuture")
            .field("method", &self.method)
            .finish_non_exhaustive()
    }
}

impl Future for ProxyFuture {
    type Output = Result<Response<Body>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let failure = match ready!(this.sent.poll(cx)) {
            Ok(Ok(answer)) => {
                let (mut parts, body) = answer.into_parts();
                strip_answer_headers(&mut parts.headers);
                // The calls stay cancellable until their answer's body ends.
                let body = match this.cancel.take() {
                    Some(cancel) => Body::new(CancelOnDrop::new(body, cancel)),
                    None => Body::new(body),
                };
                return Poll::Ready(Ok(Response::from_parts(parts, body)));
            }
            Ok(Err(e)) if e.is_connect() => UpstreamFailure::Connect,
            Ok(Err(_)) => UpstreamFailure::Broken,
            Err(_) => UpstreamFailure::Timeout,
        };
        // Unreachable or broken: nothing runs upstream to cancel. Timed out: it may still
        // run, and the cancellation is sent as the future is dropped.
        if failure != UpstreamFailure::Timeout
            && let Some(cancel) = this.cancel.as_mut()
        {
            cancel.disarm();
        }
        ::metrics::counter!(
            crate::metrics::GATEWAY_UPSTREAM_FAILURES,
            "reason" => failure.as_str()
        )
        .increment(1);
        if this.upstream.should_warn() {
            tracing::warn!(
                reason = failure.as_str(),
                method = %this.method,
                upstream = %this.upstream.authority,
                "no answer from the upstream (logged at most once a second; \
                 stormgate_gateway_upstream_failures_total counts every one)"
            );
        }
        Poll::Ready(Ok(failure_answer(failure, this.calls.as_ref())))
    }
}

/// What is needed to send a request again on a fresh connection: it met a pooled connection
/// the upstream had closed (an upstream closes an idle keep-alive connection at its own
/// timeout, and a request sent on it at that moment is never read). Only a request whose
/// whole body is at hand is sent again (none, or the body the classifier read, unchanged),
/// and only when it failed before any byte of an answer, on a connection the pool reused:
/// a fresh connection that fails is the upstream's failure, answered 502. A request the
/// upstream did read before its connection broke would run twice: an upstream closes an
/// idle connection, not one it is reading from, and the pool drops idle connections after
/// `pool_idle_timeout_ms` (4 s, under the usual servers' 5 s) so that it rarely meets one.
struct Again {
    method: http::Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
    /// The connection it went out on.
    connection: CaptureConnection,
}

impl Again {
    /// What sending `out` again takes, if it can be (its body at hand): `calls` are the
    /// classifier's for it.
    fn of(out: &mut Request<Body>, calls: Option<&Calls>) -> Option<Again> {
        let size = http_body::Body::size_hint(out.body()).exact()?;
        let body = match calls {
            _ if size == 0 => Bytes::new(),
            Some(calls) if calls.body.len() as u64 == size => calls.body.clone(),
            _ => return None,
        };
        Some(Again {
            method: out.method().clone(),
            uri: out.uri().clone(),
            headers: out.headers().clone(),
            body,
            connection: capture_connection(out),
        })
    }

    /// What the connection it went out on carried, once it has one.
    fn connection(&self) -> Option<Answered> {
        let connection = self.connection.connection_metadata();
        let mut extras = http::Extensions::new();
        connection.as_ref()?.get_extras(&mut extras);
        extras.get::<Answered>().cloned()
    }

    /// Whether the connection it failed on had carried an answer before: one the pool reused.
    fn reused(&self) -> bool {
        self.connection().is_some_and(|c| c.any())
    }

    fn request(self) -> Request<Body> {
        let mut req = Request::new(Body::from(self.body));
        *req.method_mut() = self.method;
        *req.uri_mut() = self.uri;
        *req.headers_mut() = self.headers;
        req
    }
}

/// The upstream request: sent once, and once more on a fresh connection when it met a
/// dead pooled one ([`Again`]).
struct Attempts {
    current: ResponseFuture,
    again: Option<Again>,
    upstream: Arc<Upstream>,
}

impl Future for Attempts {
    type Output = Result<Response<hyper::body::Incoming>, hyper_util::client::legacy::Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        loop {
            match ready!(Pin::new(&mut self.current).poll(cx)) {
                Err(e) if !e.is_connect() && self.again.as_ref().is_some_and(Again::reused) => {
                    let again = self.again.take().expect("checked just above");
                    tracing::debug!(error = %e, "a pooled upstream connection was dead; sending again");
                    self.current = self.upstream.fresh.request(again.request());
                }
                answered => return Poll::Ready(answered),
            }
        }
    }
}

impl tower::Service<Request<Body>> for Proxy {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = ProxyFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> ProxyFuture {
        let calls = req.extensions().get::<Calls>().cloned();
        let method = req.method().clone();
        let out = self.outbound(req);
        let upstream = self.upstream.clone();
        let cancel = if method == http::Method::POST {
            Cancel::of(calls.as_ref(), &upstream, out.headers())
        } else {
            None
        };
        let mut out = out;
        let again = Again::of(&mut out, calls.as_ref());
        let sent = tokio::time::timeout(
            upstream.request_timeout,
            Attempts {
                current: upstream.client.request(out),
                again,
                upstream: upstream.clone(),
            },
        );
        ProxyFuture {
            sent,
            calls,
            method,
            upstream,
            cancel,
        }
    }
}
