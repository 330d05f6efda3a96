//! Settling calls from their answer: the pending set and the observing body.

use std::sync::Arc;

use tokio::time::Instant;

use super::{
    CLIENT_ERROR_CODES, INPUT_VALIDATION_PREFIXES, Observation, Observer, Outcome,
    REQUEST_TIMEOUT_CODE,
};
use crate::answer::json::Id;
use crate::answer::{AnswerBody, Listener, Message};
use crate::call::{Call, SessionId};

/// The observers every outcome goes to.
pub(crate) type Observers = Arc<[Arc<dyn Observer>]>;

/// Request calls waiting for their answer. Dropped with calls left: they were cancelled.
pub(crate) struct Pending {
    calls: Vec<Call>,
    start: Instant,
    queue_wait: std::time::Duration,
    observers: Observers,
}

impl Pending {
    pub(crate) fn new(
        calls: Vec<Call>,
        queue_wait: std::time::Duration,
        observers: Observers,
    ) -> Self {
        Pending {
            calls,
            start: Instant::now(),
            queue_wait,
            observers,
        }
    }

    fn report(&self, call: &Call, outcome: Outcome, bytes: u64) {
        if outcome == Outcome::ClientError {
            // Rejected unrun: every stage gives back what it charged.
            call.charges.refund();
        }
        let observation = Observation {
            call,
            outcome,
            service_time: self.start.elapsed(),
            response_bytes: bytes,
            queue_wait: self.queue_wait,
        };
        for o in self.observers.iter() {
            o.observe(&observation);
        }
    }

    /// Settles the call answered by a message with this id.
    fn settle(&mut self, id: Id<'_>, outcome: Outcome, bytes: u64) {
        if let Some(pos) = self
            .calls
            .iter()
            .position(|c| c.id.as_ref().is_some_and(|i| id.is(i.as_json())))
        {
            let call = self.calls.swap_remove(pos);
            self.report(&call, outcome, bytes);
        }
    }

    /// Settles every call still waiting.
    pub(crate) fn settle_all(&mut self, outcome: Outcome, bytes: u64) {
        for call in std::mem::take(&mut self.calls) {
            self.report(&call, outcome, bytes);
        }
    }

    /// The server minted `session` in its answer: the `initialize` calls waiting belong to it.
    pub(crate) fn minted(&mut self, session: &SessionId) {
        for call in &mut self.calls {
            if call.method.as_deref() == Some("initialize") {
                call.session = session.clone();
            }
        }
    }

    fn is_empty(&self) -> bool {
        self.calls.is_empty()
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.settle_all(Outcome::Cancelled, 0);
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
