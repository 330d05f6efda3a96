//! The gateway: the whole stack in front of any streamable-HTTP MCP server, in any language.
//!
//! [`Proxy`] forwards each request to the upstream named by [`GatewayConfig`] (the
//! `[gateway]` section of the one [`Config`](crate::control::Config)) and streams the answer
//! back; wrapped by [`Control::wrap`](crate::control::Control::wrap) it gets every stage of
//! the stack, with outcomes learned from the upstream's answers. The `stormgate` binary is
//! this, served with `/metrics` and the admin routes:
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use axum::Router;
//! use stormgate::control::{Config, Control};
//! use stormgate::gateway::{GatewayConfig, Proxy};
//!
//! let mut gateway = GatewayConfig::default();
//! gateway.upstream = Some("http://127.0.0.1:8000/mcp".into());
//! let proxy = Proxy::new(&gateway)?;
//! let control = Control::new(Config::default())?;
//! let _tasks = control.spawn();
//! let app = control.wrap(Router::new().route_service("/mcp", proxy));
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:4000").await?;
//! stormgate::serve::serve(listener, app, stormgate::serve::DEFAULT_GRACE).await?;
//! # Ok(()) }
//! ```

#[cfg(feature = "gateway")]
mod cancel;
mod config;
#[cfg(feature = "gateway")]
mod connector;
mod hosts;
#[cfg(feature = "gateway")]
mod proxy;

pub use config::{GatewayConfig, MAX_FORWARD_HEADERS, MAX_UPSTREAM_LEN};
pub use hosts::{HostCheck, HostVerdict, Hosts, HostsLayer, MAX_ALLOWED_HOSTS, MAX_HOST_LEN};
#[cfg(feature = "gateway")]
pub use proxy::{FORWARDED, Proxy, ProxyFuture, UPSTREAM_ERROR_CODE, UpstreamFailure};
