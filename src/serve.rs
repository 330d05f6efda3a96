//! Serving a protected router with graceful shutdown: on SIGTERM (what orchestrators send) or
//! SIGINT (ctrl-c), stop accepting connections, let the calls in flight finish for up to a
//! grace period, then return so the process can exit 0. Event streams opened with `GET` (an
//! MCP session's stream of server messages, which never ends by itself) are ended at the start
//! of the grace: their clients reconnect elsewhere with `Last-Event-ID`, and a drain takes as
//! long as its calls in flight, not the whole grace.
//!
//! ```no_run
//! # async fn run(app: axum::Router) -> Result<(), stormgate::serve::ServeError> {
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await.map_err(stormgate::serve::ServeError::Io)?;
//! let outcome = stormgate::serve::serve(listener, app, stormgate::serve::DEFAULT_GRACE).await?;
//! println!("stopped: {outcome:?}");
//! # Ok(()) }
//! ```

use std::fmt;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::response::Response;
use axum::serve::ListenerExt;
use bytes::Bytes;
use http_body::Frame;
use tokio::net::TcpListener;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;

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
    // Flips when the drain starts: the GET event streams end then.
    let (draining, drain) = watch::channel(false);
    let app = app.layer(DrainLayer(drain));
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
        let _ = draining.send(true);
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

/// Ends the event streams answered to `GET` requests when the drain starts (the receiver
/// flips to `true`). Nothing is boxed per request; a `GET` clones the receiver.
#[derive(Clone)]
struct DrainLayer(watch::Receiver<bool>);

impl<S> tower::Layer<S> for DrainLayer {
    type Service = Drain<S>;

    fn layer(&self, inner: S) -> Drain<S> {
        Drain {
            inner,
            drain: self.0.clone(),
        }
    }
}

/// Built by [`DrainLayer`].
#[derive(Clone)]
struct Drain<S> {
    inner: S,
    drain: watch::Receiver<bool>,
}

impl<S> tower::Service<Request> for Drain<S>
where
    S: tower::Service<Request, Response = Response>,
{
    type Response = Response;
    type Error = S::Error;
    type Future = DrainFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request) -> Self::Future {
        let drain = (req.method() == http::Method::GET).then(|| self.drain.clone());
        DrainFuture {
            inner: self.inner.call(req),
            drain,
        }
    }
}

pin_project_lite::pin_project! {
    /// [`Drain`]'s future: the inner service's, its event stream wrapped for a `GET`.
    struct DrainFuture<F> {
        #[pin]
        inner: F,
        drain: Option<watch::Receiver<bool>>,
    }
}

impl<F, E> Future for DrainFuture<F>
where
    F: Future<Output = Result<Response, E>>,
{
    type Output = Result<Response, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let response = std::task::ready!(this.inner.poll(cx))?;
        let stream = response
            .headers()
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        let Some(mut drain) = this.drain.take().filter(|_| stream) else {
            return Poll::Ready(Ok(response));
        };
        Poll::Ready(Ok(response.map(|inner| {
            Body::new(UntilDrain {
                inner,
                drained: Some(Box::pin(async move {
                    let _ = drain.wait_for(|d| *d).await;
                })),
            })
        })))
    }
}

/// A stream's body that ends (cleanly, after its last whole frame) when the drain starts.
struct UntilDrain {
    inner: Body,
    /// Done when the drain starts; `None` once it has.
    drained: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
}

impl http_body::Body for UntilDrain {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let Some(drained) = self.drained.as_mut() else {
            return Poll::Ready(None);
        };
        if drained.as_mut().poll(cx).is_ready() {
            self.drained = None;
            return Poll::Ready(None);
        }
        Pin::new(&mut self.inner).poll_frame(cx)
    }
}
