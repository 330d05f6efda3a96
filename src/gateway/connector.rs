//! The upstream's connections, each knowing whether the request now on it came after an
//! answer on it, so a request that failed can be told to have failed on a connection the pool
//! reused (one the upstream may have closed while it sat idle) or on a fresh one.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use http::Uri;
use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_util::client::legacy::connect::{Connected, Connection};

/// Whether a connection had carried an answer before the request now written on it, in its
/// [`Connected`] extras (every copy of the extras shares it). Set by the connection itself:
/// a write that comes after bytes were read from the upstream is a request after an answer
/// (HTTP/1 writes a request only once the one before it was answered). So it holds as soon
/// as the request is written, whenever the earlier request's caller gets to its answer: a
/// request that meets the upstream's close of an idle connection is known to have met a
/// reused one even while the caller of the request before it has not yet been polled.
#[derive(Debug, Clone, Default)]
pub(super) struct Answered(Arc<Flags>);

#[derive(Debug, Default)]
struct Flags {
    /// Bytes have come from the upstream on this connection (or its end).
    read: AtomicBool,
    /// The request last written came after them.
    after_answer: AtomicBool,
}

impl Answered {
    /// Bytes came from the upstream (or its end).
    fn read(&self) {
        self.0.read.store(true, Ordering::Relaxed);
    }

    /// A request is being written: after an answer if bytes came before it.
    fn writing(&self) {
        let read = self.0.read.load(Ordering::Relaxed);
        self.0.after_answer.store(read, Ordering::Relaxed);
    }

    /// Whether the request written last came after an answer on this connection: the pool had
    /// it from an earlier request.
    pub(super) fn any(&self) -> bool {
        self.0.after_answer.load(Ordering::Relaxed)
    }
}

/// A connector (plain, or TLS over plain), its connections knowing whether a request came
/// after an answer ([`Answered`]).
#[derive(Debug, Clone)]
pub(super) struct Stamped<C>(pub(super) C);

/// A connection to the upstream and what it carried ([`Answered`]).
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
        let polled = Pin::new(&mut self.io).poll_read(cx, buf);
        // Bytes came, or the upstream closed the connection (after which hyper writes no
        // request on it): the cursor's count is not readable without `unsafe`.
        if matches!(polled, Poll::Ready(Ok(()))) {
            self.answered.read();
        }
        polled
    }
}

impl<T: Write + Unpin> Write for StampedIo<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.answered.writing();
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
        self.answered.writing();
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }
}

#[cfg(test)]
mod tests {
    use std::future::poll_fn;

    use hyper::rt::ReadBuf;
    use hyper_util::rt::TokioIo;
    use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

    use super::*;

    type Io = StampedIo<TokioIo<DuplexStream>>;

    async fn write(io: &mut Io, bytes: &[u8]) {
        poll_fn(|cx| Pin::new(&mut *io).poll_write(cx, bytes))
            .await
            .unwrap();
    }

    async fn read(io: &mut Io) {
        let mut raw = [0u8; 64];
        let mut buf = ReadBuf::new(&mut raw);
        poll_fn(|cx| Pin::new(&mut *io).poll_read(cx, buf.unfilled()))
            .await
            .unwrap();
        assert!(!buf.filled().is_empty());
    }

    #[tokio::test]
    async fn a_request_written_after_an_answer_is_on_a_reused_connection_at_once() {
        let (ours, mut upstream) = tokio::io::duplex(1024);
        let mut io = StampedIo {
            io: TokioIo::new(ours),
            answered: Answered::default(),
        };
        let answered = io.answered.clone();
        // The first request, and its answer coming in: still the first request's connection,
        // fresh when it was written (a failure now would be the upstream's).
        write(&mut io, b"request 1").await;
        assert!(!answered.any());
        let mut got = [0u8; 9];
        upstream.read_exact(&mut got).await.unwrap();
        upstream.write_all(b"answer 1").await.unwrap();
        read(&mut io).await;
        assert!(
            !answered.any(),
            "known when a request is written, not when read"
        );
        // The next request comes after an answer: reused, as soon as it is written (whether or
        // not the first request's caller has taken its answer yet).
        write(&mut io, b"request 2").await;
        assert!(answered.any());
    }
}
