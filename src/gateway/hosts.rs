//! The gateway's DNS-rebinding guard: which `Host` and `Origin` a request to the gateway may
//! carry.
//!
//! The proxy rewrites `Host` to the upstream's own authority, so an upstream that guards
//! itself against DNS rebinding by its `Host` (as the TypeScript SDK's host validation does)
//! would let every request through once it sits behind the gateway. The gateway therefore
//! checks the request's own `Host`, and its `Origin` when a browser sent one, before anything
//! else reads the request: a web page whose name was rebound to the gateway's address is
//! answered 403 and reaches neither the stack nor the upstream.
//!
//! Listening on a loopback address, the gateway accepts `localhost`, `127.0.0.1` and `[::1]`
//! (any port) and the names of `allowed_hosts`; listening elsewhere, only the names of
//! `allowed_hosts`, and anything when it is empty (a gateway on a public address is reached
//! by names it cannot guess; list them to guard it). An absolute-form target
//! (`POST http://name/mcp`) must name an accepted authority too, and a request with more than
//! one `Host` or `Origin` is ambiguous, answered 400 whatever is listed (RFC 9112 section 3.2).

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::response::Response;
use http::{HeaderMap, Request, StatusCode, header};

use crate::error::ConfigError;
use crate::response::ResponseFuture;

/// Names `allowed_hosts` may list at most.
pub const MAX_ALLOWED_HOSTS: usize = 32;
/// The longest name `allowed_hosts` may list, bytes (a DNS name is at most 253).
pub const MAX_HOST_LEN: usize = 255;

/// The names a loopback gateway accepts whatever `allowed_hosts` lists.
const LOOPBACK: [&str; 3] = ["localhost", "127.0.0.1", "[::1]"];

/// Checks `allowed_hosts`: at most [`MAX_ALLOWED_HOSTS`] names, each a host or `host:port`
/// of at most [`MAX_HOST_LEN`] bytes, without a scheme, path or spaces.
pub(crate) fn validate(allowed: &[String]) -> Result<(), ConfigError> {
    let field = "gateway.allowed_hosts";
    if allowed.len() > MAX_ALLOWED_HOSTS {
        return Err(ConfigError::new(
            field,
            format!("at most {MAX_ALLOWED_HOSTS} names"),
        ));
    }
    for name in allowed {
        let bad = name.is_empty()
            || name.len() > MAX_HOST_LEN
            || name
                .bytes()
                .any(|b| b.is_ascii_whitespace() || b.is_ascii_control() || b"/?#@".contains(&b));
        if bad {
            let shown: String = name.chars().take(64).collect();
            return Err(ConfigError::new(
                field,
                format!("{shown:?} is not a host or host:port (at most {MAX_HOST_LEN} bytes)"),
            ));
        }
    }
    Ok(())
}

/// What the guard says of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostVerdict {
    /// It may pass.
    Allowed,
    /// More than one `Host` or `Origin`: answered 400.
    Ambiguous,
    /// Its `Host`, `Origin` or target authority is not accepted: answered 403.
    NotAccepted,
}

/// The `Host` and `Origin` values a gateway accepts: the DNS-rebinding guard the upstream
/// can no longer apply once the proxy rewrites `Host` to the upstream's authority.
///
/// On a loopback listen address: `localhost`, `127.0.0.1` and `[::1]` (any port) and the
/// listed names; on another address only the listed names, and anything when none is listed.
/// A listed name matches a `Host` equal to it or whose host part is it. An `Origin`, when
/// present, must name an accepted host too (`null` never does).
///
/// ```
/// use http::HeaderMap;
/// use stormgate::gateway::Hosts;
///
/// let hosts = Hosts::new(&["mcp.internal".into()], true);
/// let mut h = HeaderMap::new();
/// h.insert("host", "127.0.0.1:4000".parse().unwrap());
/// assert!(hosts.allows(&h));
/// h.insert("origin", "http://evil.example".parse().unwrap());
/// assert!(!hosts.allows(&h), "a page on another site");
/// h.insert("host", "mcp.internal:4000".parse().unwrap());
/// h.remove("origin");
/// assert!(hosts.allows(&h));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hosts {
    /// Lowercase names, each a host or `host:port`.
    names: Vec<String>,
    /// Whether nothing is checked (not on loopback, and no name listed).
    open: bool,
}

impl Hosts {
    /// The guard of a gateway listening on `loopback` (or not) with `allowed_hosts` listed.
    pub fn new(allowed_hosts: &[String], loopback: bool) -> Hosts {
        let mut names: Vec<String> = allowed_hosts
            .iter()
            .map(|n| n.to_ascii_lowercase())
            .collect();
        if loopback {
            names.extend(LOOPBACK.iter().map(|n| (*n).to_owned()));
        }
        Hosts {
            open: names.is_empty(),
            names,
        }
    }

    /// Whether `authority` (`host` or `host:port`, as in `Host`) is accepted: listed as it
    /// is, or its host part listed.
    fn accepts(&self, authority: &str) -> bool {
        let authority = authority.trim();
        let host = match authority.rsplit_once(':') {
            // `[::1]:4000`, `a.b:80`; not the inside of a bare `[::1]`.
            Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) => host,
            _ => authority,
        };
        // The names are lowercase; no copy of the client's value is made.
        self.names
            .iter()
            .any(|n| n.eq_ignore_ascii_case(authority) || n.eq_ignore_ascii_case(host))
    }

    /// Whether a request with `headers` (and an origin-form target) may pass:
    /// [`judge`](Self::judge) says [`HostVerdict::Allowed`].
    pub fn allows(&self, headers: &HeaderMap) -> bool {
        self.judge(&http::Uri::from_static("/"), headers) == HostVerdict::Allowed
    }

    /// What a request for `uri` with `headers` gets: ambiguous with more than one `Host` or
    /// `Origin`; else allowed when its `Host` is accepted, its target's authority too when it
    /// has one (absolute form), and its `Origin`, when it has one, names an accepted host. A
    /// missing or unreadable `Host` is not accepted.
    pub fn judge(&self, uri: &http::Uri, headers: &HeaderMap) -> HostVerdict {
        let many = |name| headers.get_all(name).iter().nth(1).is_some();
        if many(header::HOST) || many(header::ORIGIN) {
            return HostVerdict::Ambiguous;
        }
        let verdict = |ok: bool| {
            if ok {
                HostVerdict::Allowed
            } else {
                HostVerdict::NotAccepted
            }
        };
        if self.open {
            return HostVerdict::Allowed;
        }
        if uri.authority().is_some_and(|a| !self.accepts(a.as_str())) {
            return HostVerdict::NotAccepted;
        }
        verdict(self.headers_accepted(headers))
    }

    fn headers_accepted(&self, headers: &HeaderMap) -> bool {
        let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
        if !host.is_some_and(|h| self.accepts(h)) {
            return false;
        }
        match headers.get(header::ORIGIN) {
            None => true,
            Some(origin) => origin
                .to_str()
                .ok()
                .and_then(|o| o.split_once("://"))
                .is_some_and(|(_, authority)| self.accepts(authority)),
        }
    }
}

/// The guard as a tower layer: put it outermost on the gateway's router
/// (`app.layer(HostsLayer::new(hosts))`).
#[derive(Debug, Clone)]
pub struct HostsLayer {
    hosts: Arc<Hosts>,
}

impl HostsLayer {
    /// A layer refusing what `hosts` does not allow.
    pub fn new(hosts: Hosts) -> HostsLayer {
        HostsLayer {
            hosts: Arc::new(hosts),
        }
    }
}

impl<S> tower::Layer<S> for HostsLayer {
    type Service = HostCheck<S>;

    fn layer(&self, inner: S) -> HostCheck<S> {
        HostCheck {
            inner,
            hosts: self.hosts.clone(),
        }
    }
}

/// Answers 403 (a JSON-RPC invalid-request error) to a request whose `Host` or `Origin` the
/// gateway does not accept; passes the others on. Built by [`HostsLayer`].
#[derive(Clone)]
pub struct HostCheck<S> {
    inner: S,
    hosts: Arc<Hosts>,
}

impl<S> fmt::Debug for HostCheck<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostCheck")
            .field("hosts", &self.hosts)
            .finish_non_exhaustive()
    }
}

impl<S, B> tower::Service<Request<B>> for HostCheck<S>
where
    S: tower::Service<Request<B>, Response = Response>,
{
    type Response = Response;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let (status, message) = match self.hosts.judge(req.uri(), req.headers()) {
            HostVerdict::Allowed => {
                return ResponseFuture::inner(self.inner.call(req));
            }
            HostVerdict::Ambiguous => (
                StatusCode::BAD_REQUEST,
                "more than one Host or Origin header",
            ),
            HostVerdict::NotAccepted => (
                StatusCode::FORBIDDEN,
                "Host, Origin or target not accepted by this gateway (see gateway.allowed_hosts)",
            ),
        };
        tracing::debug!(%status, "a request's Host, Origin or target is refused");
        ResponseFuture::own(crate::mcp::reply::invalid_request(status, message))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(host: Option<&str>, origin: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Some(host) = host {
            h.insert(header::HOST, host.parse().unwrap());
        }
        if let Some(origin) = origin {
            h.insert(header::ORIGIN, origin.parse().unwrap());
        }
        h
    }

    #[test]
    fn a_loopback_gateway_accepts_loopback_names_and_refuses_a_rebound_one() {
        let hosts = Hosts::new(&[], true);
        for host in [
            "127.0.0.1:4000",
            "localhost:4000",
            "LOCALHOST",
            "[::1]:4000",
            "[::1]",
        ] {
            assert!(hosts.allows(&headers(Some(host), None)), "{host}");
        }
        for host in [
            "evil.example:4000",
            "127.0.0.2:4000",
            "localhost.evil.example",
            "[::2]:4000",
        ] {
            assert!(!hosts.allows(&headers(Some(host), None)), "{host}");
        }
        assert!(!hosts.allows(&headers(None, None)), "no Host");
        // A browser's page: its Origin counts too, whatever the Host.
        assert!(hosts.allows(&headers(
            Some("127.0.0.1:4000"),
            Some("http://localhost:3000")
        )));
        for origin in ["http://evil.example", "null", "evil.example"] {
            assert!(
                !hosts.allows(&headers(Some("127.0.0.1:4000"), Some(origin))),
                "{origin}"
            );
        }
    }

    #[test]
    fn listed_names_are_accepted_by_host_or_by_host_and_port() {
        let hosts = Hosts::new(&["MCP.internal".into(), "gw.example:8443".into()], false);
        assert!(hosts.allows(&headers(Some("mcp.internal:4000"), None)));
        assert!(hosts.allows(&headers(Some("gw.example:8443"), None)));
        assert!(!hosts.allows(&headers(Some("gw.example:9000"), None)));
        assert!(
            !hosts.allows(&headers(Some("127.0.0.1:4000"), None)),
            "not on loopback"
        );
        // Not on loopback and nothing listed: nothing to check against.
        assert!(Hosts::new(&[], false).allows(&headers(Some("anything:1"), None)));
    }

    #[test]
    fn two_hosts_or_origins_are_ambiguous_and_an_absolute_target_must_be_accepted() {
        let origin = http::Uri::from_static("/mcp");
        for hosts in [Hosts::new(&[], true), Hosts::new(&[], false)] {
            let mut h = headers(Some("127.0.0.1:4000"), Some("http://localhost:3000"));
            assert_eq!(hosts.judge(&origin, &h), HostVerdict::Allowed);
            h.append(header::HOST, "evil.example".parse().unwrap());
            assert_eq!(hosts.judge(&origin, &h), HostVerdict::Ambiguous, "two Host");
            let mut h = headers(Some("127.0.0.1:4000"), Some("http://localhost:3000"));
            h.append(header::ORIGIN, "http://evil.example".parse().unwrap());
            assert_eq!(
                hosts.judge(&origin, &h),
                HostVerdict::Ambiguous,
                "two Origin"
            );
        }
        let hosts = Hosts::new(&[], true);
        let h = headers(Some("127.0.0.1:4000"), None);
        let evil = http::Uri::from_static("http://evil.test/mcp");
        assert_eq!(hosts.judge(&evil, &h), HostVerdict::NotAccepted);
        let local = http::Uri::from_static("http://127.0.0.1:4000/mcp");
        assert_eq!(hosts.judge(&local, &h), HostVerdict::Allowed);
    }

    #[test]
    fn the_list_is_bounded_and_checked() {
        assert!(validate(&["a.b".into(), "a.b:80".into(), "[::1]:4000".into()]).is_ok());
        for bad in [
            "",
            "http://a.b",
            "a b",
            "a.b/x",
            &"x".repeat(MAX_HOST_LEN + 1),
        ] {
            let err = validate(&[bad.to_owned()]).unwrap_err();
            assert_eq!(err.field, "gateway.allowed_hosts", "{bad:?}");
        }
        let many: Vec<String> = (0..=MAX_ALLOWED_HOSTS).map(|i| format!("h{i}")).collect();
        assert!(validate(&many).is_err());
    }
}
