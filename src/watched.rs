//! The one response-body wrapper: a body passed on unchanged, frame by frame, to a [`Watch`]
//! that sees each frame and is told once when the body ends.
//!
//! Every stage that settles something at the end of an answer wraps it the same way and
//! differs only in its watch: the FIFO limiter's leases (held until the answer ends, so a
//! streamed answer keeps its place), the gateway's upstream cancellation (disarmed at the
//! end), and the answer scan of the outcome, idempotency and tool-list listeners (each message
//! read as it passes). Dropped before its end, a body drops its watch, which settles the cut
//! in its own `Drop` (a lease given back, a cancellation sent, a pending call cancelled).
//!
//! A stage of your own can watch an answer the same way, here counting its bytes:
//!
//! ```
//! use bytes::Bytes;
//! use http_body_util::{BodyExt, Full};
//! use stormgate::watched::{Watch, Watched};
//!
//! #[derive(Default)]
//! struct Count { bytes: usize, ended: bool }
//!
//! impl Watch<Bytes> for &mut Count {
//!     fn data(&mut self, data: &Bytes) { self.bytes += data.len(); }
//!     fn end(&mut self, failed: bool) { self.ended = !failed; }
//! }
//!
//! # tokio_test_block_on(async {
//! let mut count = Count::default();
//! let body = Watched::new(Full::new(Bytes::from_static(b"{\"result\":{}}")), &mut count);
//! let passed = body.collect().await.unwrap().to_bytes();
//! assert_eq!(passed, "{\"result\":{}}");
//! assert_eq!((count.bytes, count.ended), (13, true));
//! # });
//! # fn tokio_test_block_on<F: std::future::Future>(f: F) -> F::Output {
//! #     tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(f)
//! # }
//! ```

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

/// What a [`Watched`] body tells as it passes.
pub trait Watch<D> {
    /// A data frame, before it goes on; never after [`end`](Self::end).
    fn data(&mut self, _data: &D) {}

    /// The body ended: called once, after its last frame. `failed`: it ended on an error.
    fn end(&mut self, failed: bool);
}

pin_project! {
    /// A body passed on unchanged, whose [`Watch`] sees every data frame and its end.
    #[derive(Debug)]
    pub struct Watched<B, W> {
        #[pin]
        inner: B,
        watch: W,
        ended: bool,
    }
}

impl<B, W> Watched<B, W> {
    /// `inner`, watched by `watch`.
    pub fn new(inner: B, watch: W) -> Self {
        Watched {
            inner,
            watch,
            ended: false,
        }
    }

    /// The watch.
    pub(crate) fn watch_mut(self: Pin<&mut Self>) -> &mut W {
        self.project().watch
    }
}

/// Whether `frame`, just polled from a body, is the body's last: its end, an error, or a
/// frame after which the body says it has ended (`end_stream`: a sized body such as hyper's
/// `Incoming` with a Content-Length, or a `Full`). A server stops polling a body that says it
/// has ended, so whatever waits for the end must not wait for a `None` that never comes.
fn is_last<D, E>(frame: &Option<Result<Frame<D>, E>>, end_stream: bool) -> bool {
    !matches!(frame, Some(Ok(_))) || end_stream
}

impl<B, W> Body for Watched<B, W>
where
    B: Body,
    W: Watch<B::Data>,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let mut this = self.project();
        let frame = ready!(this.inner.as_mut().poll_frame(cx));
        if !*this.ended {
            if let Some(Ok(f)) = &frame
                && let Some(data) = f.data_ref()
            {
                this.watch.data(data);
            }
            if is_last(&frame, this.inner.is_end_stream()) {
                *this.ended = true;
                this.watch.end(matches!(frame, Some(Err(_))));
            }
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use futures::StreamExt;
    use http_body_util::{BodyExt, Full, StreamBody};

    /// What a watch saw: the data frames' lengths and the ends (`failed` each).
    #[derive(Debug, Default)]
    struct Seen {
        data: Vec<usize>,
        ends: Vec<bool>,
    }

    impl Watch<Bytes> for &mut Seen {
        fn data(&mut self, data: &Bytes) {
            self.data.push(data.len());
        }
        fn end(&mut self, failed: bool) {
            self.ends.push(failed);
        }
    }

    #[tokio::test]
    async fn a_sized_body_ends_at_its_last_frame_without_waiting_for_none() {
        let mut seen = Seen::default();
        let mut body = Watched::new(Full::new(Bytes::from_static(b"abc")), &mut seen);
        let frame = body.frame().await.unwrap().unwrap();
        assert_eq!(frame.into_data().unwrap(), "abc");
        // Full says it has ended: the watch knows before anyone polls for the end.
        drop(body);
        assert_eq!((seen.data, seen.ends), (vec![3], vec![false]));
    }

    #[tokio::test]
    async fn a_stream_is_watched_frame_by_frame_and_ends_once() {
        let chunks: Vec<Result<Frame<Bytes>, std::io::Error>> = vec![
            Ok(Frame::data(Bytes::from_static(b"ab"))),
            Ok(Frame::data(Bytes::from_static(b"cde"))),
        ];
        let mut seen = Seen::default();
        let body = Watched::new(StreamBody::new(futures::stream::iter(chunks)), &mut seen);
        let all = body.collect().await.unwrap().to_bytes();
        assert_eq!(all, "abcde");
        assert_eq!((seen.data, seen.ends), (vec![2, 3], vec![false]));
    }

    #[tokio::test]
    async fn an_error_ends_it_failed_and_a_drop_before_the_end_tells_nothing() {
        let chunks: Vec<Result<Frame<Bytes>, std::io::Error>> = vec![
            Ok(Frame::data(Bytes::from_static(b"ab"))),
            Err(std::io::Error::other("broken")),
        ];
        let mut seen = Seen::default();
        let mut body = Watched::new(StreamBody::new(futures::stream::iter(chunks)), &mut seen);
        assert!(body.frame().await.unwrap().is_ok());
        assert!(body.frame().await.unwrap().is_err());
        drop(body);
        assert_eq!((seen.data, seen.ends), (vec![2], vec![true]));

        let chunks: Vec<Result<Frame<Bytes>, std::io::Error>> =
            vec![Ok(Frame::data(Bytes::from_static(b"ab")))];
        let mut cut = Seen::default();
        let stream = futures::stream::iter(chunks).chain(futures::stream::pending());
        let mut body = Watched::new(StreamBody::new(stream), &mut cut);
        assert!(body.frame().await.unwrap().is_ok());
        drop(body);
        assert_eq!((cut.data, cut.ends), (vec![2], vec![]));
    }
}
