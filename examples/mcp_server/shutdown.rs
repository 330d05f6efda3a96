//! Graceful shutdown for the example server (and a pattern for library users): on SIGTERM
//! (what orchestrators send) or SIGINT (ctrl-c), stop accepting connections, let the calls in
//! flight finish for up to a grace period, then return so the process exits 0.

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::serve::ListenerExt;
use tokio::net::TcpListener;
use tokio::signal::unix::{SignalKind, signal};

/// How long calls in flight may take to finish after the signal, by default.
pub(crate) const DEFAULT_GRACE: Duration = Duration::from_secs(30);

/// Serves `app` on `listener` until SIGTERM or SIGINT, then drains for at most `grace`.
/// The handlers are installed before the first connection is accepted, so a signal is never
/// missed (nor left to the default action, which kills the process mid-call).
pub(crate) async fn serve(
    listener: TcpListener,
    app: Router,
    grace: Duration,
) -> std::io::Result<()> {
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let (signalled, drained) = tokio::sync::oneshot::channel::<&'static str>();
    // rmcp writes its SSE answer in several small writes: without TCP_NODELAY each call waits
    // on Nagle's algorithm and the client's delayed ACK (about 40 ms on Linux).
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
        done = &mut server => return done,
        name = drained => name.unwrap_or("signal"),
    };
    tracing::info!(
        signal = name,
        grace_ms = grace.as_millis() as u64,
        "shutting down: no new connections; calls in flight may finish"
    );
    match tokio::time::timeout(grace, server).await {
        Ok(done) => {
            tracing::info!("every call in flight finished; exiting");
            done
        }
        Err(_) => {
            tracing::warn!(
                grace_ms = grace.as_millis() as u64,
                "grace period over: the connections still open are closed"
            );
            Ok(())
        }
    }
}
