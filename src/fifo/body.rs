//! A response body that holds FIFO leases until it ends.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use super::Lease;

pin_project! {
    /// A body that keeps its call's [`Lease`]s until the body ends, fails or is dropped.
    ///
    /// MCP servers answer `tools/call` with an SSE stream whose head arrives before the tool
    /// has run, so a lease released with the head would limit nothing: the place is held for
    /// as long as the answer streams.
    pub struct LeaseBody<B> {
        #[pin]
        inner: B,
        leases: Vec<Lease>,
    }
}

impl<B: std::fmt::Debug> std::fmt::Debug for LeaseBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseBody")
            .field("inner", &self.inner)
            .field("leases", &self.leases)
            .finish()
    }
}

impl<B> LeaseBody<B> {
    /// `inner`, holding `leases` until it ends.
    pub fn new(inner: B, leases: Vec<Lease>) -> Self {
        LeaseBody { inner, leases }
    }
}

impl<B: Body> Body for LeaseBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let mut this = self.project();
        let frame = ready!(this.inner.as_mut().poll_frame(cx));
        if crate::answer::is_last(&frame, this.inner.is_end_stream()) {
            this.leases.clear();
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
