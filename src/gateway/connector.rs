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
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

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

/// [`HttpConnector`], its connections counting their answers ([`Answered`]).
#[derive(Debug, Clone)]
pub(super) struct Stamped(pub(super) HttpConnector);

/// A connection to the upstream and its count of answers.
#[derive(Debug)]
pub(super) struct StampedIo {
    io: TokioIo<TcpStream>,
    answered: Answered,
}

impl tower::Service<Uri> for Stamped {
    type Response = StampedIo;
    type Error = <HttpConnector as tower::Service<Uri>>::Error;
    type Future = Pin<Box<dyn Future<Output = Result<StampedIo, Self::Error>> + Send>>;

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

impl Connection for StampedIo {
    fn connected(&self) -> Connected {
        self.io.connected().extra(self.answered.clone())
    }
}

impl Read for StampedIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl Write for StampedIo {
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
