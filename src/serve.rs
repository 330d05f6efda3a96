//! Serving a protected router with graceful shutdown: on SIGTERM (what orchestrators send) or
//! SIGINT (ctrl-c), stop accepting connections, let the calls in flight finish for up to a
//! grace period, then return so the process can exit 0. Event streams opened with `GET` (an
//! MCP session's stream of server messages, which never ends by itself) are ended at the start
//! of the grace: their clients reconnect elsewhere with `Last-Event-ID`, and a drain takes as
//! long as its calls in flight, not the whole grace.
//!
//! The listener keeps idle and slow clients from holding its file descriptors
//! ([`Connections`]): a connection without a whole request head within the header timeout
//! (after it opens, or after its last answer) is closed, and the connections open at once are
//! capped.
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
use std::num::NonZeroUsize;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use crate::valid::NonZeroDuration;
use axum::Router;
use axum::body::Body;
use axum::extract::{ConnectInfo, Request};
use axum::response::Response;
use bytes::Bytes;
use http_body::Frame;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tower::ServiceExt;

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

/// Serves `app` on `listener` with the default [`Connections`] limits until SIGTERM or
/// SIGINT, then drains for at most `grace`: [`serve_with`].
pub async fn serve(
    listener: TcpListener,
    app: Router,
    grace: Duration,
) -> Result<Stopped, ServeError> {
    serve_with(listener, app, grace, Connections::default()).await
}

/// How long a connection may take to send a request's head, by default (30 s: hyper's own
/// default once it has a timer).
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(30);
/// Connections served at once, by default.
pub const DEFAULT_MAX_CONNECTIONS: NonZeroUsize = NonZeroUsize::new(10_000).unwrap();

/// The limits on the connections [`serve_with`] keeps open: what keeps idle and slow clients
/// from holding the process's file descriptors until it can accept no one.
///
/// ```
/// use std::num::NonZeroUsize;
/// use stormgate::serve::Connections;
/// use stormgate::valid::NonZeroDuration;
///
/// let limits = Connections::default()
///     .header_timeout(NonZeroDuration::from_millis(10_000).unwrap())
///     .max_connections(NonZeroUsize::new(2_000).unwrap());
/// assert_eq!(limits.max_connections.get(), 2_000);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Connections {
    /// How long a connection may take to send a whole request head, counted from when the
    /// server starts waiting for one: when the connection opens, and when the previous answer
    /// on a kept-alive connection ends. It is therefore also how long an idle connection stays
    /// open. A connection without a whole head by then is closed, however it trickles its
    /// bytes; a request whose head has arrived is never cut by it (its body has the
    /// classifier's own timeout, and a stream its answer). Default [`DEFAULT_HEADER_TIMEOUT`].
    pub header_timeout: NonZeroDuration,
    /// Connections open at once at most: at the cap the listener accepts no more until one
    /// closes (the others wait in the kernel's backlog). Default [`DEFAULT_MAX_CONNECTIONS`];
    /// keep it below the process's file descriptor limit (`ulimit -n`) with room for the
    /// upstream's connections.
    pub max_connections: NonZeroUsize,
}

impl Default for Connections {
    fn default() -> Self {
        Connections {
            header_timeout: NonZeroDuration::of(DEFAULT_HEADER_TIMEOUT),
            max_connections: DEFAULT_MAX_CONNECTIONS,
        }
    }
}

impl Connections {
    /// With this header timeout.
    pub fn header_timeout(mut self, timeout: NonZeroDuration) -> Self {
        self.header_timeout = timeout;
        self
    }

    /// With this cap on open connections.
    pub fn max_connections(mut self, max: NonZeroUsize) -> Self {
        self.max_connections = max;
        self
    }
}

/// Serves `app` on `listener` (with the peer address as `ConnectInfo<SocketAddr>`, and
/// `TCP_NODELAY` on every connection) over HTTP/1.1, within the `limits` on connections,
/// until SIGTERM or SIGINT; then stops accepting, closes the idle connections, ends the `GET`
/// event streams, and lets the calls in flight finish for at most `grace`. The handlers are
/// installed before the first connection is accepted, so a signal is never missed (nor left
/// to the default action, which kills the process mid-call). Logs the signal and the end of
/// the drain through `tracing`; counts the open connections ([`CONNECTIONS_OPEN`]) and those
/// closed at the header timeout ([`CONNECTIONS_TIMED_OUT`]).
///
/// [`CONNECTIONS_OPEN`]: crate::metrics::CONNECTIONS_OPEN
/// [`CONNECTIONS_TIMED_OUT`]: crate::metrics::CONNECTIONS_TIMED_OUT
pub async fn serve_with(
    listener: TcpListener,
    app: Router,
    grace: Duration,
    limits: Connections,
) -> Result<Stopped, ServeError> {
    let mut term = signal(SignalKind::terminate()).map_err(ServeError::Io)?;
    let mut int = signal(SignalKind::interrupt()).map_err(ServeError::Io)?;
    // Flips when the drain starts: the GET event streams end and the connections close once
    // their calls are answered.
    let (draining, drain) = watch::channel(false);
    let app = app.layer(DrainLayer(drain.clone()));
    let places = Arc::new(Semaphore::new(limits.max_connections.get()));
    // Every connection holds a receiver: when none is left, the drain is over.
    let (open, _) = watch::channel(());
    let name = loop {
        let place = tokio::select! {
            biased;
            _ = term.recv() => break "SIGTERM",
            _ = int.recv() => break "SIGINT",
            place = places.clone().acquire_owned() => place,
        };
        let Ok(place) = place else {
            unreachable!("the semaphore is never closed")
        };
        let (tcp, peer) = tokio::select! {
            biased;
            _ = term.recv() => break "SIGTERM",
            _ = int.recv() => break "SIGINT",
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    accept_failed(e).await;
                    continue;
                }
            },
        };
        tokio::spawn(connection(
            Connection {
                tcp,
                peer,
                app: app.clone(),
                header_timeout: limits.header_timeout.get(),
            },
            drain.clone(),
            (place, open.subscribe()),
        ));
    };
    drop(listener);
    let _ = draining.send(true);
    tracing::info!(
        signal = name,
        grace_ms = grace.as_millis() as u64,
        "shutting down: no new connections; calls in flight may finish"
    );
    if tokio::time::timeout(grace, open.closed()).await.is_ok() {
        tracing::info!("every call in flight finished; exiting");
        Ok(Stopped::Drained { signal: name })
    } else {
        tracing::warn!(
            grace_ms = grace.as_millis() as u64,
            "grace period over: the connections still open are closed"
        );
        Ok(Stopped::GraceExpired { signal: name })
    }
}

/// An accepted connection and what serves it.
struct Connection {
    tcp: TcpStream,
    peer: SocketAddr,
    app: Router,
    header_timeout: Duration,
}

/// Serves one connection until it closes, or until it has answered its calls once the drain
/// starts; `held` (its place under the cap, and its share of the drain's wait) goes with it.
async fn connection(
    c: Connection,
    mut drain: watch::Receiver<bool>,
    held: (OwnedSemaphorePermit, watch::Receiver<()>),
) {
    // Servers such as rmcp write an SSE answer in several small writes: without TCP_NODELAY
    // each call waits on Nagle's algorithm and the client's delayed ACK (about 40 ms on Linux).
    let _ = c.tcp.set_nodelay(true);
    let open = OpenGauge::new();
    let (app, peer) = (c.app, c.peer);
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        let mut req = req.map(Body::new);
        req.extensions_mut().insert(ConnectInfo(peer));
        app.clone().oneshot(req)
    });
    let served = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(c.header_timeout)
        .serve_connection(TokioIo::new(c.tcp), service);
    tokio::pin!(served);
    let ended = tokio::select! {
        ended = served.as_mut() => ended,
        () = async { drop(drain.wait_for(|d| *d).await) } => {
            served.as_mut().graceful_shutdown();
            served.await
        }
    };
    if let Err(e) = ended {
        if e.is_timeout() {
            ::metrics::counter!(crate::metrics::CONNECTIONS_TIMED_OUT).increment(1);
        }
        tracing::debug!(%peer, error = %e, "connection closed");
    }
    drop(open);
    drop(held);
}

/// One open connection in [`CONNECTIONS_OPEN`](crate::metrics::CONNECTIONS_OPEN), while it
/// lives.
struct OpenGauge;

impl OpenGauge {
    fn new() -> Self {
        ::metrics::gauge!(crate::metrics::CONNECTIONS_OPEN).increment(1.0);
        OpenGauge
    }
}

impl Drop for OpenGauge {
    fn drop(&mut self) {
        ::metrics::gauge!(crate::metrics::CONNECTIONS_OPEN).decrement(1.0);
    }
}

/// After a failed `accept`: a connection that failed before it was accepted costs nothing;
/// anything else (out of file descriptors) is logged and the listener pauses a second, so it
/// does not spin while nothing can be accepted.
async fn accept_failed(e: std::io::Error) {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    if matches!(
        e.kind(),
        ConnectionRefused | ConnectionAborted | ConnectionReset
    ) {
        return;
    }
    tracing::error!(error = %e, "accepting a connection failed; retrying in 1 s");
    tokio::time::sleep(Duration::from_secs(1)).await;
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
