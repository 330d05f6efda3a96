//! Settling calls from their answer: the pending set and the observing body.

use std::sync::Arc;

use tokio::time::Instant;

use super::{
    CLIENT_ERROR_CODES, INPUT_VALIDATION_PREFIXES, Observation, Observer, Outcome,
    REQUEST_TIMEOUT_CODE,
};
use crate::answer::json::Id;
use crate::answer::{AnswerBody, Listener, Message};
use crate::call::{Call, Calls, SessionId};

/// The observers every outcome goes to.
pub(crate) type Observers = Arc<[Arc<dyn Observer>]>;

/// Request calls waiting for their answer. Dropped with calls left: they were cancelled.
pub(crate) struct Pending {
    /// The request's calls (shared, not copied).
    calls: Calls,
    /// Which of them still wait.
    open: Open,
    /// The session the server minted in its answer: the `initialize` calls' own.
    minted: Option<SessionId>,
    start: Instant,
    queue_wait: std::time::Duration,
    observers: Observers,
}

impl Pending {
    /// The chargeable calls of `calls`, waiting; `None` when there are none.
    pub(crate) fn new(
        calls: &Calls,
        queue_wait: std::time::Duration,
        observers: Observers,
    ) -> Option<Self> {
        let open = Open::of(calls.iter().map(Call::is_chargeable));
        (!open.is_empty()).then(|| Pending {
            calls: calls.clone(),
            open,
            minted: None,
            start: Instant::now(),
            queue_wait,
            observers,
        })
    }

    fn report(&self, call: &Call, outcome: Outcome, bytes: u64) {
        if outcome == Outcome::ClientError {
            // Rejected unrun: every stage gives back what it charged.
            call.charges().refund();
        }
        let minted;
        let call = match &self.minted {
            Some(session) if call.method.as_deref() == Some("initialize") => {
                minted = Call {
                    session: session.clone(),
                    ..call.clone()
                };
                &minted
            }
            _ => call,
        };
        let at = Instant::now();
        let observation = Observation {
            call,
            outcome,
            service_time: at.saturating_duration_since(self.start),
            at,
            response_bytes: bytes,
            queue_wait: self.queue_wait,
        };
        for o in self.observers.iter() {
            o.observe(&observation);
        }
    }

    /// Settles the call answered by a message with this id.
    fn settle(&mut self, id: Id<'_>, outcome: Outcome, bytes: u64) {
        let calls = self.calls.clone();
        let answered = calls
            .iter()
            .enumerate()
            .find(|(i, c)| self.open.has(*i) && c.id.as_ref().is_some_and(|i| id.is(i.as_bytes())));
        if let Some((i, call)) = answered {
            self.open.clear(i);
            self.report(call, outcome, bytes);
        }
    }

    /// Settles every call still waiting.
    pub(crate) fn settle_all(&mut self, outcome: Outcome, bytes: u64) {
        let calls = self.calls.clone();
        for (i, call) in calls.iter().enumerate() {
            if self.open.has(i) {
                self.open.clear(i);
                self.report(call, outcome, bytes);
            }
        }
    }

    /// The server minted `session` in its answer: the `initialize` calls waiting belong to it.
    pub(crate) fn minted(&mut self, session: &SessionId) {
        self.minted = Some(session.clone());
    }

    fn is_empty(&self) -> bool {
        self.open.is_empty()
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.settle_all(Outcome::Cancelled, 0);
    }
}

/// Which calls of a request still wait for their answer: a bit per call, in a word for the
/// first 64 (no allocation), in more words for a longer batch.
#[derive(Debug, Default)]
struct Open {
    first: u64,
    more: Vec<u64>,
}

impl Open {
    /// The calls for which `waits` says so.
    fn of(waits: impl Iterator<Item = bool>) -> Self {
        let mut open = Open::default();
        for (i, waits) in waits.enumerate() {
            if waits {
                let (word, bit) = open.word(i);
                *word |= bit;
            }
        }
        open
    }

    /// The word and bit of call `i`, the words grown to hold it.
    fn word(&mut self, i: usize) -> (&mut u64, u64) {
        let bit = 1 << (i % 64);
        if i < 64 {
            return (&mut self.first, bit);
        }
        let at = i / 64 - 1;
        if self.more.len() <= at {
            self.more.resize(at + 1, 0);
        }
        (&mut self.more[at], bit)
    }

    fn has(&self, i: usize) -> bool {
        let word = if i < 64 {
            self.first
        } else {
            self.more.get(i / 64 - 1).copied().unwrap_or(0)
        };
        word & (1 << (i % 64)) != 0
    }

    fn clear(&mut self, i: usize) {
        let (word, bit) = self.word(i);
        *word &= !bit;
    }

    fn is_empty(&self) -> bool {
        self.first == 0 && self.more.iter().all(|w| *w == 0)
    }
}

/// The id and outcome a JSON-RPC answer carries, if it is one.
fn outcome_of<'a>(message: &Message<'a>) -> Option<(Id<'a>, Outcome)> {
    let outcome = if message.error {
        match message.code {
            Some(REQUEST_TIMEOUT_CODE) => Outcome::Timeout,
            Some(code) if CLIENT_ERROR_CODES.contains(&code) => Outcome::ClientError,
            _ => Outcome::Error,
        }
    } else if message.result {
        if !message.is_error {
            Outcome::Ok
        } else if INPUT_VALIDATION_PREFIXES
            .iter()
            .any(|p| message.text.starts_with(p.as_bytes()))
        {
            // The server's input validation refused the arguments before the tool ran.
            Outcome::ClientError
        } else {
            Outcome::Error
        }
    } else {
        return None;
    };
    Some((message.id?, outcome))
}

/// The outcome layer's listener: each message settles the call with its id; whatever the
/// answer did not settle by its end was never answered (the server failed it).
impl Listener for Pending {
    fn wants(&self) -> bool {
        !self.is_empty()
    }

    fn message(&mut self, message: &Message<'_>) {
        if let Some((id, outcome)) = outcome_of(message) {
            self.settle(id, outcome, message.len as u64);
        }
    }

    fn end(&mut self) {
        self.settle_all(Outcome::Error, 0);
    }
}

/// A response body that settles its calls as it passes, without holding any chunk back.
pub(crate) type ObservedBody<B> = AnswerBody<B, Pending>;

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The open calls are those a set of indices holds, in a batch of any length.
        #[test]
        fn open_calls_are_a_set(
            waits in proptest::collection::vec(any::<bool>(), 0..200),
            cleared in proptest::collection::vec(0usize..220, 0..50),
        ) {
            let mut open = Open::of(waits.iter().copied());
            let mut reference: std::collections::BTreeSet<usize> =
                waits.iter().enumerate().filter(|(_, w)| **w).map(|(i, _)| i).collect();
            for i in cleared {
                open.clear(i);
                reference.remove(&i);
            }
            for i in 0..220 {
                prop_assert_eq!(open.has(i), reference.contains(&i), "{}", i);
            }
            prop_assert_eq!(open.is_empty(), reference.is_empty());
        }
    }

    /// An answer's body is boxed once per call: up to 1 032 bytes glibc's malloc serves it
    /// from its per-thread cache (about 50 instructions), past that from its bins (about
    /// 1 600 per call in tests/allocations.rs under callgrind).
    #[test]
    fn an_answers_body_fits_the_allocators_thread_cache() {
        let size = std::mem::size_of::<ObservedBody<axum::body::Body>>();
        assert!(size <= 1032, "{size} bytes");
    }

    fn outcome(text: &str) -> Outcome {
        let mut got = None;
        crate::answer::read_each(text.as_bytes(), |m| got = outcome_of(m).map(|o| o.1));
        got.unwrap()
    }

    #[test]
    fn the_clients_mistakes_are_client_errors() {
        for code in CLIENT_ERROR_CODES {
            let text =
                format!(r#"{{"jsonrpc":"2.0","id":1,"error":{{"code":{code},"message":"x"}}}}"#);
            assert_eq!(outcome(&text), Outcome::ClientError, "{code}");
        }
        assert_eq!(
            outcome(r#"{"id":1,"error":{"code":-32603,"message":"internal"}}"#),
            Outcome::Error
        );
        assert_eq!(
            outcome(r#"{"id":1,"error":{"code":-32001,"message":"timeout"}}"#),
            Outcome::Timeout
        );
        for text in [
            "failed to deserialize parameters: missing field `table`",
            "MCP error -32602: Input validation error: Invalid arguments for tool t: x",
            "Input validation error: bad",
        ] {
            let answer = serde_json::json!({"id": 1, "result": {"isError": true,
                "content": [{"type": "text", "text": text}]}});
            assert_eq!(outcome(&answer.to_string()), Outcome::ClientError, "{text}");
        }
        assert_eq!(
            outcome(
                r#"{"id":1,"result":{"isError":true,"content":[{"type":"text","text":"connection pool exhausted"}]}}"#
            ),
            Outcome::Error,
            "a tool's own failure"
        );
        assert_eq!(
            outcome(
                r#"{"id":1,"result":{"content":[{"type":"text","text":"failed to deserialize parameters"}]}}"#
            ),
            Outcome::Ok,
            "only isError results are read"
        );
    }
}
