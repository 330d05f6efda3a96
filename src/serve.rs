//! Serving a protected router with graceful shutdown: on SIGTERM (what orchestrators send) or
//! SIGINT (ctrl-c), stop accepting connections, let the calls in flight finish for up to a
//! grace period, then return so the process can exit 0.
//!
//! ```no_run
//! # async fn run(app: axum::Router) -> Result<(), stormgate::serve::ServeError> {
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await.map_err(stormgate::serve::ServeError::Io)?;
//! let outcome = stormgate::serve::serve(listener, app, stormgate::serve::DEFAULT_GRACE).await?;
//! println!("stopped: {outcome:?}");
//! # Ok(()) }
//! ```

use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::serve::ListenerExt;
use tokio::net::TcpListener;
use tokio::signal::unix::{SignalKind, signal};

/// How long calls in flight may take to finish after the signal, by default (30 s).
pub const DEFAULT_GRACE: Duration = Duration::from_secs(30);

/// How [`serve`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Stopped {
    /// A signal came and every connection closed within the grace period.
    Drained {
        /// The signal (`SIGTERM` or `SIGINT`).
        signal: &'static str,
    },
    /// A signal came and the grace period ran out: the connections still open were closed.
    GraceExpired {
        /// The signal (`SIGTERM` or `SIGINT`).
        signal: &'static str,
    },
}

/// Why [`serve`] could not serve.
#[derive(Debug)]
#[non_exhaustive]
pub enum ServeError {
    /// The signal handlers could not be installed, or the server failed.
    Io(std::io::Error),
}

impl fmt::Display for ServeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ServeError::Io(e) => write!(f, "serving failed: {e}"),
        }
    }
}

impl std::error::Error for ServeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ServeError::Io(e) => Some(e),
        }
    }
}

impl From<ServeError> for std::io::Error {
    fn from(e: ServeError) -> Self {
        match e {
            ServeError::Io(e) => e,
        }
    }
}

/// Serves `app` on `listener` (with the peer address as `ConnectInfo<SocketAddr>`, and
/// `TCP_NODELAY` on every connection) until SIGTERM or SIGINT, then drains for at most
/// `grace`. The handlers are installed before the first connection is accepted, so a signal
/// is never missed (nor left to the default action, which kills the process mid-call).
/// Logs the signal and the end of the drain through `tracing`.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    grace: Duration,
) -> Result<Stopped, ServeError> {
    let mut term = signal(SignalKind::terminate()).map_err(ServeError::Io)?;
    let mut int = signal(SignalKind::interrupt()).map_err(ServeError::Io)?;
    let (signalled, drained) = tokio::sync::oneshot::channel::<&'static str>();
    // Servers such as rmcp write an SSE answer in several small writes: without TCP_NODELAY
    // each call waits on Nagle's algorithm and the client's delayed ACK (about 40 ms on Linux).
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    let server = axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(async move {
        let name = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        };
        let _ = signalled.send(name);
    })
    .into_future();
    tokio::pin!(server);
    let name = tokio::select! {
        // The signal first: when it came, the server may be done too (nothing in flight), and
        // the signal is what happened.
        biased;
        name = drained => name.unwrap_or("signal"),
        done = &mut server => {
            // axum's server only returns on shutdown; without a signal it is an I/O failure
            // (or the shutdown future's sender went away, which cannot happen here).
            done.map_err(ServeError::Io)?;
            return Ok(Stopped::Drained { signal: "none" });
        }
    };
    tracing::info!(
        signal = name,
        grace_ms = grace.as_millis() as u64,
        "shutting down: no new connections; calls in flight may finish"
    );
    match tokio::time::timeout(grace, server).await {
        Ok(done) => {
            done.map_err(ServeError::Io)?;
            tracing::info!("every call in flight finished; exiting");
            Ok(Stopped::Drained { signal: name })
        }
        Err(_) => {
            tracing::warn!(
                grace_ms = grace.as_millis() as u64,
                "grace period over: the connections still open are closed"
            );
            Ok(Stopped::GraceExpired { signal: name })
        }
    }
}
