//! Whole-round deadlines: one time budget per call that covers its queueing and its run, so a
//! slow call never gets two budgets.
//!
//! A deadline per tool (or a default) starts when the classifier reads the call
//! ([`Call::deadline`](crate::Call)). The FIFO limiter refuses at once (`deadline_exceeded`,
//! scope `tool`) a call that could not be admitted before it, instead of letting it wait in
//! vain, and refuses a waiter the moment its deadline passes. A call still running at its
//! deadline is cancelled: its future and body are dropped (its place in the limiter is free at
//! once) and it is answered with the same JSON-RPC error; for a streamed answer, the error is
//! sent as the stream's last event. The deadline reaches the MCP service as a [`Deadline`]
//! request extension, so tool code can pass the remaining time on.

use crate::error::ConfigError;
use std::collections::BTreeMap;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body::Frame;
use pin_project_lite::pin_project;
use serde::{Deserialize, Serialize};
use tokio::time::{Instant, Sleep};

use crate::answer::{AnswerBody, Framing, Listener, Message, Scan, Scanned};
use crate::sse;

/// Per-tool deadlines, in milliseconds in config. Absent: no deadline.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct DeadlineConfig {
    /// The deadline of tools not listed (`default_ms`). Absent: none.
    #[serde(rename = "default_ms", with = "crate::duration_ms::opt")]
    pub default: Option<Duration>,
    /// Deadline per tool, milliseconds.
    pub tools_ms: BTreeMap<String, u64>,
}

impl DeadlineConfig {
    /// The deadline of one call of `tool`.
    pub fn for_tool(&self, tool: &str) -> Option<Duration> {
        self.tools_ms
            .get(tool)
            .map(|ms| Duration::from_millis(*ms))
            .or(self.default)
    }

    /// Checks every rule; the error names the field and the rule.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.default.is_some_and(|d| d.is_zero()) {
            return Err(ConfigError::new(
                "deadlines.default_ms",
                "must be greater than 0",
            ));
        }
        if let Some((tool, _)) = self.tools_ms.iter().find(|(_, ms)| **ms == 0) {
            return Err(ConfigError::new(
                format!("deadlines.tools_ms.{tool}"),
                "must be greater than 0",
            ));
        }
        Ok(())
    }
}

/// Request extension: when the call must be answered by. Tool code can read it (rmcp hands
/// the request's extensions to tools) to bound what it does in turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadline(pub Instant);

impl Deadline {
    /// Time left.
    pub fn remaining(&self) -> Duration {
        self.0.saturating_duration_since(Instant::now())
    }
}

pin_project! {
    /// A streamed answer cut at the deadline: the inner body (and the limiter's places it
    /// holds) is dropped, and the calls it has not answered yet get their error as the last
    /// event. Until then the answer is scanned for the ids it answers.
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
