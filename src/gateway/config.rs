//! The `[gateway]` settings: where the upstream MCP server is, how long the proxy waits for
//! it, its connection pool, and which credentials pass through.

use crate::valid::NonZeroDuration;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::ConfigError;

/// The most header names `forward_headers` may list.
pub const MAX_FORWARD_HEADERS: usize = 32;

/// The longest upstream URL accepted, bytes.
pub const MAX_UPSTREAM_LEN: usize = 2048;

/// Settings of the proxy in front of an upstream MCP server (`[gateway]`), as the `stormgate`
/// binary and [`Proxy`](super::Proxy) read them. Read when the proxy is built: a reload whose
/// `[gateway]` differs from the running one is refused by name (`gateway: cannot change while
/// running`); a document without `[gateway]`, or without `upstream`, keeps the running one.
///
/// ```
/// use std::time::Duration;
/// use stormgate::gateway::GatewayConfig;
///
/// let c: GatewayConfig = toml::from_str(r#"
///     upstream = "http://127.0.0.1:8000/mcp"
///     request_timeout_ms = 5000
///     forward_headers = ["authorization"]
/// "#).unwrap();
/// assert_eq!(c.request_timeout.get(), Duration::from_secs(5));
/// assert!(c.validate().is_ok());
/// let upstream = |url: &str| {
///     let mut c = GatewayConfig::default(); // non-exhaustive: built from its default
///     c.upstream = Some(url.into());
///     c
/// };
/// assert_eq!(upstream("ftp://x").validate().unwrap_err().field, "gateway.upstream");
/// // No path: refused with a hint (the root must be written out).
/// let no_path = upstream("http://127.0.0.1:3001").validate().unwrap_err();
/// assert!(no_path.to_string().contains("http://127.0.0.1:3001/mcp"));
/// assert!(upstream("http://127.0.0.1:3001/").validate().is_ok());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct GatewayConfig {
    /// The upstream MCP endpoint, `http://host:port/path` or `https://host:port/path` (the
    /// binary's `--upstream` or `STORMGATE_UPSTREAM` sets it too; given both ways, they must
    /// agree). `https` needs the `tls` feature (on in the `stormgate` binary): the upstream's
    /// certificate is checked against the bundled Mozilla roots and [`ca_file`](Self::ca_file)
    /// for the URL's host (sent as SNI). Absent: no upstream configured.
    pub upstream: Option<String>,
    /// A PEM file of CA certificates an `https` upstream's certificate may also chain to (a
    /// private CA), besides the bundled roots. Read when the proxy is built: a file that cannot
    /// be read or holds no certificate is an error then. Default none.
    pub ca_file: Option<PathBuf>,
    /// How long a TCP connection to the upstream may take (`connect_timeout_ms`). Default
    /// 2000 ms; a connection not made by then is answered 502.
    #[serde(rename = "connect_timeout_ms")]
    pub connect_timeout: NonZeroDuration,
    /// How long the upstream may take to answer a request's headers (`request_timeout_ms`),
    /// connection included. Default 60 000 ms; then the client gets 504. A streamed answer
    /// (SSE) is not limited once its headers came: long-lived streams are held.
    #[serde(rename = "request_timeout_ms")]
    pub request_timeout: NonZeroDuration,
    /// How long an idle pooled connection to the upstream is kept (`pool_idle_timeout_ms`).
    /// Default 4 000 ms: below the keep-alive timeout of the usual servers (5 s for uvicorn
    /// and Node), so the pool lets a connection go before the upstream closes it; a request
    /// that still meets a connection the upstream closed is sent again on a fresh one
    /// ([`Proxy`](super::Proxy)).
    #[serde(rename = "pool_idle_timeout_ms")]
    pub pool_idle_timeout: NonZeroDuration,
    /// Idle connections kept to the upstream at most. Default 64.
    pub pool_max_idle: usize,
    /// Credential headers passed to the upstream (`authorization`, `cookie`, `x-api-key`,
    /// ...), by name, case-insensitive. Default none: a client's credentials are meant for
    /// the gateway unless said otherwise. At most [`MAX_FORWARD_HEADERS`]; hop-by-hop headers
    /// (`connection`, `host`, `transfer-encoding`, ...) cannot be listed.
    pub forward_headers: Vec<String>,
    /// Names (`host` or `host:port`) a request's `Host`, and its `Origin` when it has one, may
    /// carry, besides `localhost`, `127.0.0.1` and `[::1]` when the gateway listens on a
    /// loopback address; on another address an empty list checks nothing. Anything else is
    /// answered 403 before the stack reads it: the DNS-rebinding guard the upstream can no
    /// longer apply, since the proxy rewrites `Host` (see [`Hosts`](super::Hosts)). At most
    /// [`MAX_ALLOWED_HOSTS`](super::MAX_ALLOWED_HOSTS) names. Default none.
    pub allowed_hosts: Vec<String>,
}

impl Default for GatewayConfig {
    fn default() -> Self {
        GatewayConfig {
            upstream: None,
            ca_file: None,
            connect_timeout: NonZeroDuration::of(Duration::from_secs(2)),
            request_timeout: NonZeroDuration::of(Duration::from_secs(60)),
            pool_idle_timeout: NonZeroDuration::of(Duration::from_secs(4)),
            pool_max_idle: 64,
            forward_headers: Vec::new(),
            allowed_hosts: Vec::new(),
        }
    }
}

/// The upstream URL, checked: `http` (or `https` with the `tls` feature), with a host and a
/// path, at most [`MAX_UPSTREAM_LEN`] bytes.
pub(crate) fn parse_upstream(url: &str) -> Result<http::Uri, ConfigError> {
    let field = "gateway.upstream";
    if url.len() > MAX_UPSTREAM_LEN {
        return Err(ConfigError::new(
            field,
            format!("longer than {MAX_UPSTREAM_LEN} bytes"),
        ));
    }
    let uri: http::Uri = url
        .parse()
        .map_err(|_| ConfigError::new(field, format!("{url:?} is not a URL")))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") if cfg!(feature = "tls") => {}
        Some("https") => {
            return Err(ConfigError::new(
                field,
                "https upstreams need the `tls` feature (this build has no TLS client)",
            ));
        }
        _ => {
            return Err(ConfigError::new(
                field,
                format!("{url:?} is not an http:// or https:// URL"),
            ));
        }
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(ConfigError::new(field, format!("{url:?} has no host")));
    }
    // `http://host:port` alone: every request would get the server's answer for `/` (an
    // HTML 404 from most); MCP servers serve their endpoint at a path.
    let after_scheme = &url[url.find("://").map_or(0, |i| i + 3)..];
    if !after_scheme.contains('/') {
        return Err(ConfigError::new(
            field,
            format!(
                "{url:?} has no path: MCP servers serve at one, such as {:?} (write {:?} for the root)",
                format!("{url}/mcp"),
                format!("{url}/")
            ),
        ));
    }
    Ok(uri)
}

impl GatewayConfig {
    /// Checks every rule; the error names the field and the rule.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if let Some(url) = &self.upstream {
            parse_upstream(url)?;
        }
        self.forward_header_names()?;
        super::hosts::validate(&self.allowed_hosts)?;
        Ok(())
    }

    /// `forward_headers` as header names, checked.
    pub(crate) fn forward_header_names(&self) -> Result<Vec<http::HeaderName>, ConfigError> {
        let field = "gateway.forward_headers";
        if self.forward_headers.len() > MAX_FORWARD_HEADERS {
            return Err(ConfigError::new(
                field,
                format!("at most {MAX_FORWARD_HEADERS} names"),
            ));
        }
        self.forward_headers
            .iter()
            .map(|h| {
                let name = http::HeaderName::from_bytes(h.as_bytes())
                    .map_err(|_| ConfigError::new(field, format!("{h:?} is not a header name")))?;
                if is_hop_by_hop(&name) || name == http::header::HOST {
                    return Err(ConfigError::new(
                        field,
                        format!("{h:?} is hop-by-hop: the proxy sets it itself"),
                    ));
                }
                Ok(name)
            })
            .collect()
    }
}

/// Whether a header only concerns one connection (RFC 9110 section 7.6.1), so a proxy never
/// forwards it.
pub(crate) fn is_hop_by_hop(name: &http::HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
    )
}
