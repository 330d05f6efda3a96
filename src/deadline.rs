//! Whole-round deadlines: one time budget per call that covers its queueing and its run, so a
//! slow call never gets two budgets.
//!
//! A deadline per tool (or a default, [`DeadlineConfig`](crate::classify::DeadlineConfig),
//! `[deadlines]`) starts when the classifier reads the call ([`Call::deadline`](crate::Call)). The FIFO limiter refuses at once (`deadline_exceeded`,
//! scope `tool`) a call that could not be admitted before it, instead of letting it wait in
//! vain, and refuses a waiter the moment its deadline passes: waiting is its own concern. The
//! [`DeadlineLayer`] cuts a call still running at its deadline: its future and body are
//! dropped (inside the FIFO limiter, its place is free as the cut passes) and it is answered
//! with the same JSON-RPC error; for a streamed answer, the error is sent as the stream's last
//! event. The deadline reaches the MCP service as a [`Deadline`] request extension, so tool
//! code can pass the remaining time on.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use bytes::{Bytes, BytesMut};
use http::Request;
use http_body::Frame;
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};
use tower::{BoxError, Layer, Service};

use crate::answer::{AnswerBody, Framing, Listener, Message, Scan, Scanned};
use crate::call::{Calls, Unread};
pub use crate::extensions::Deadline;
use crate::extensions::QueueWait;
use crate::mcp::reply;
use crate::rejection::{Reason, Rejection, Scope};
use crate::sse;

pin_project! {
    /// A streamed answer cut at the deadline: the inner body is dropped (the FIFO's places,
    /// held by the body around this one, are freed as the cut passes), and the calls it has
    /// not answered yet get their error as the last event. Until then the answer is scanned
    /// for the ids it answers.
    pub(crate) struct DeadlineBody<B> {
        #[pin]
        inner: Option<AnswerBody<B, Unanswered>>,
        #[pin]
        sleep: Sleep,
        done: bool,
    }
}

impl<B> DeadlineBody<B> {
    pub(crate) fn new(inner: B, deadline: Instant, pending: Vec<(String, Vec<u8>)>) -> Self {
        let scanned = Scanned::new(Scan::new(Framing::Sse), Unanswered(pending));
        DeadlineBody {
            inner: Some(AnswerBody::new(inner, scanned)),
            sleep: tokio::time::sleep_until(deadline),
            done: false,
        }
    }
}

/// (id as JSON, the serialized error answer) of every call not answered yet: a message with
/// its id answers it.
struct Unanswered(Vec<(String, Vec<u8>)>);

impl Listener for Unanswered {
    fn wants(&self) -> bool {
        !self.0.is_empty()
    }

    fn message(&mut self, message: &Message<'_>) {
        self.0.retain(|(p, _)| !message.answers(p));
    }
}

impl<B> http_body::Body for DeadlineBody<B>
where
    B: http_body::Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn is_end_stream(&self) -> bool {
        self.done
    }

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let mut this = self.project();
        if *this.done {
            return Poll::Ready(None);
        }
        let Some(mut inner) = this.inner.as_mut().as_pin_mut() else {
            return Poll::Ready(None);
        };
        if let Poll::Ready(frame) = inner.as_mut().poll_frame(cx) {
            if frame.is_none() {
                *this.done = true;
            }
            return Poll::Ready(frame);
        }
        if this.sleep.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        // The deadline passed: cancel the call and answer what is left.
        let pending = std::mem::take(&mut inner.watch_mut().listener.0);
        this.inner.set(None);
        *this.done = true;
        if pending.is_empty() {
            return Poll::Ready(None);
        }
        let mut out = BytesMut::new();
        for (_, element) in pending {
            sse::write_event(&mut out, &element);
        }
        Poll::Ready(Some(Ok(Frame::data(out.freeze()))))
    }
}

/// Cuts each call still running at its whole-round deadline ([`Call::deadline`], which the
/// classifier sets): a call not answered by then is answered `deadline_exceeded` (scope
/// `tool`) and its future dropped; a streamed answer is cut there, the calls it has not
/// answered yet getting their error as its last event. Requests with no deadline pass through
/// untouched. In the stack it sits inside the FIFO limiter, whose queue wait (a [`QueueWait`]
/// request extension) the refusal reports.
///
/// [`Call::deadline`]: crate::Call
#[derive(Debug, Clone, Default)]
pub struct DeadlineLayer {
    unread: Arc<Unread>,
}

impl DeadlineLayer {
    /// The layer.
    pub fn new() -> Self {
        Self::default()
    }
}

impl<S> Layer<S> for DeadlineLayer {
    type Service = Deadlines<S>;

    fn layer(&self, inner: S) -> Deadlines<S> {
        Deadlines {
            inner,
            unread: self.unread.clone(),
        }
    }
}

/// The service of [`DeadlineLayer`].
#[derive(Debug, Clone)]
pub struct Deadlines<S> {
    inner: S,
    unread: Arc<Unread>,
}

impl<S, ResBody> Service<Request<Body>> for Deadlines<S>
where
    S: Service<Request<Body>, Response = http::Response<ResBody>>,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    type Response = Response;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let cut = match req.extensions().get::<Calls>() {
            Some(calls) => calls
                .iter()
                .filter_map(|c| c.deadline())
                .min()
                .map(|deadline| Cut {
                    deadline,
                    calls: calls.clone(),
                    queue_wait: req
                        .extensions()
                        .get::<QueueWait>()
                        .map_or(Duration::ZERO, |w| w.0),
                }),
            None => {
                self.unread.check(&req, "DeadlineLayer");
                None
            }
        };
        ResponseFuture {
            sleep: cut.as_ref().map(|c| tokio::time::sleep_until(c.deadline)),
            cut,
            future: self.inner.call(req),
        }
    }
}

/// A request's deadline: the earliest of its calls', and what its refusal says.
struct Cut {
    deadline: Instant,
    calls: Calls,
    queue_wait: Duration,
}

pin_project! {
    /// Response future of [`Deadlines`].
    pub struct ResponseFuture<F> {
        #[pin]
        future: F,
        #[pin]
        sleep: Option<Sleep>,
        cut: Option<Cut>,
    }
}

impl<F> std::fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("deadline", &self.cut.as_ref().map(|c| c.deadline))
            .finish_non_exhaustive()
    }
}

impl<F, ResBody, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<http::Response<ResBody>, E>>,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    type Output = Result<Response, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        if let Poll::Ready(result) = this.future.poll(cx) {
            let response = result?;
            return Poll::Ready(Ok(match this.cut.take() {
                None => response.map(Body::new),
                Some(cut) => {
                    let pending = deadline_answers(&cut.calls, cut.queue_wait);
                    response.map(|b| Body::new(DeadlineBody::new(b, cut.deadline, pending)))
                }
            }));
        }
        let Some(sleep) = this.sleep.as_mut().as_pin_mut() else {
            return Poll::Pending;
        };
        ready!(sleep.poll(cx));
        // Past its deadline before it answered: answered now; the caller drops the future.
        let cut = this.cut.take().expect("polled after completion");
        this.sleep.set(None);
        Poll::Ready(Ok(past_deadline(&cut.calls, cut.queue_wait)))
    }
}

/// The refusal of a call cut at its deadline.
fn deadline_rejection(queue_wait: Duration) -> Rejection {
    // Nothing limits a retry: the call ran out of its own time.
    Rejection::new(Reason::DeadlineExceeded, Scope::Tool, Duration::ZERO)
        .with_queue_wait(queue_wait)
}

/// The answer to a request whose calls all ran past their deadline before any answer.
fn past_deadline(calls: &Calls, queue_wait: Duration) -> Response {
    let rejected: Vec<(usize, Rejection)> = (0..calls.len())
        .filter(|&i| calls.calls[i].is_chargeable())
        .map(|i| (i, deadline_rejection(queue_wait)))
        .collect();
    reply::rejection_response(calls, &rejected)
}

/// The error answer of each call with an id, to stream if the deadline cuts the answer.
fn deadline_answers(calls: &Calls, queue_wait: Duration) -> Vec<(String, Vec<u8>)> {
    calls
        .iter()
        .filter(|c| c.is_chargeable())
        .filter_map(|c| {
            let id = c.id.as_ref()?.as_json().to_owned();
            let mut out = Vec::new();
            reply::rejection_element(c, &deadline_rejection(queue_wait), calls, &mut out);
            Some((id, out))
        })
        .collect()
}
