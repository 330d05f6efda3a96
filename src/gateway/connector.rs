//! The upstream's connections, each with a count of the answers it carried, so a request that
//! failed can be told to have failed on a connection the pool reused (one the upstream may
//! have closed while it sat idle) or on a fresh one.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use http::Uri;
use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_util::client::legacy::connect::{Connected, Connection};

/// The answers a connection carried, in its [`Connected`] extras (every copy of the extras
/// shares the count).
#[derive(Debug, Clone, Default)]
pub(super) struct Answered(Arc<AtomicU64>);

impl Answered {
    /// One more answer came on it.
    pub(super) fn count(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }

    /// Whether an answer came on it before: the pool had it from an earlier request.
    pub(super) fn any(&self) -> bool {
        self.0.load(Ordering::Relaxed) > 0
    }
}

/// A connector (plain, or TLS over plain), its connections counting their answers
/// ([`Answered`]).
#[derive(Debug, Clone)]
pub(super) struct Stamped<C>(pub(super) C);

/// A connection to the upstream and its count of answers.
#[derive(Debug)]
pub(super) struct StampedIo<T> {
    io: T,
    answered: Answered,
}

impl<C> tower::Service<Uri> for Stamped<C>
where
    C: tower::Service<Uri>,
    C::Future: Send + 'static,
{
    type Response = StampedIo<C::Response>;
    type Error = C::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, C::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let connecting = self.0.call(uri);
        Box::pin(async move {
            let io = connecting.await?;
            Ok(StampedIo {
                io,
                answered: Answered::default(),
            })
        })
    }
}

impl<T: Connection> Connection for StampedIo<T> {
    fn connected(&self) -> Connected {
        self.io.connected().extra(self.answered.clone())
    }
}

impl<T: Read + Unpin> Read for StampedIo<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: Write + Unpin> Write for StampedIo<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }
}
