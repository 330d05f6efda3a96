//! The per-session invocation audit (seed 000 section 5: the recent calls of a session with
//! their queue wait).

use std::collections::VecDeque;
use std::sync::{Mutex, PoisonError};

use dashmap::DashMap;
use serde::Serialize;
use tokio::time::Instant;

use crate::call::{Call, SessionId};
use crate::outcome::{Observation, Observer};
use crate::rejection::Rejection;

/// Invocations kept per session.
pub const AUDIT_PER_SESSION: usize = 50;
/// Sessions audited at most (later ones are not recorded).
pub const AUDIT_MAX_SESSIONS: usize = 10_000;

/// One call of a session, as the audit keeps it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Invocation {
    /// Milliseconds since the audit started.
    pub at_ms: u64,
    /// The method.
    pub method: Option<String>,
    /// The tool, resource or prompt.
    pub target: Option<String>,
    /// How it ended (`ok`, `error`, `timeout`, `cancelled`, `client_error`), if it ran.
    pub outcome: Option<&'static str>,
    /// Why it was refused, if it was.
    pub rejection: Option<&'static str>,
    /// Time waited in a FIFO queue.
    pub queue_wait_ms: u64,
    /// Service time, if it ran.
    pub service_ms: Option<u64>,
}

/// The bounded audit: the last [`AUDIT_PER_SESSION`] calls of up to [`AUDIT_MAX_SESSIONS`]
/// sessions. An [`Observer`] of outcomes and refusals.
#[derive(Debug)]
pub struct Audit {
    epoch: Instant,
    sessions: DashMap<SessionId, Mutex<VecDeque<Invocation>>>,
}

impl Default for Audit {
    fn default() -> Self {
        Audit {
            epoch: Instant::now(),
            sessions: DashMap::new(),
        }
    }
}

fn ms(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Audit {
    fn record(&self, call: &Call, entry: Invocation) {
        if !self.sessions.contains_key(&call.session) && self.sessions.len() >= AUDIT_MAX_SESSIONS {
            return;
        }
        let log = self.sessions.entry(call.session.clone()).or_default();
        let mut log = log.lock().unwrap_or_else(PoisonError::into_inner);
        if log.len() == AUDIT_PER_SESSION {
            log.pop_front();
        }
        log.push_back(entry);
    }

    fn entry(&self, call: &Call) -> Invocation {
        Invocation {
            at_ms: ms(self.epoch.elapsed()),
            method: call.method.clone(),
            target: call.target().map(str::to_owned),
            outcome: None,
            rejection: None,
            queue_wait_ms: 0,
            service_ms: None,
        }
    }

    /// The recent calls of a session, oldest first.
    pub fn invocations(&self, session: &SessionId) -> Vec<Invocation> {
        self.sessions.get(session).map_or_else(Vec::new, |log| {
            log.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .iter()
                .cloned()
                .collect()
        })
    }
}

impl Observer for Audit {
    fn observe(&self, o: &Observation<'_>) {
        let entry = Invocation {
            outcome: Some(o.outcome.as_str()),
            queue_wait_ms: ms(o.queue_wait),
            service_ms: Some(ms(o.service_time)),
            ..self.entry(o.call)
        };
        self.record(o.call, entry);
    }

    fn refused(&self, call: &Call, rejection: &Rejection) {
        let entry = Invocation {
            rejection: Some(rejection.reason().as_str()),
            queue_wait_ms: rejection.queue_wait_ms(),
            ..self.entry(call)
        };
        self.record(call, entry);
    }
}
