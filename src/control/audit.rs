//! The per-session invocation audit: the recent calls of a session with their queue wait.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use serde::Serialize;
use tokio::time::Instant;

use crate::bounded::Bounded;
use crate::call::{Call, SessionId, bounded_name};
use crate::entropy::SessionGuard;
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
    /// The method (shared with the call that named it: kept once however many calls do).
    #[serde(serialize_with = "shared")]
    pub method: Option<Arc<str>>,
    /// The tool, resource or prompt (shared likewise).
    #[serde(serialize_with = "shared")]
    pub target: Option<Arc<str>>,
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
///
/// Following a [`SessionGuard`] (as [`Control`](super::Control) builds it), it starts a log
/// only for a session the guard tracks, one the MCP server accepted, so ids a client makes up
/// never take its places; when its places are all taken, it forgets the sessions the guard no
/// longer tracks. A call of a session with a log is recorded without asking the guard again
/// (one lookup per call, not two). Names are kept as the session ids are: up to 128 bytes,
/// longer ones as a 17-byte hash.
pub struct Audit {
    epoch: Instant,
    /// Each session's log, by a keyed hash of its id (the id kept in the log, for the sweep).
    sessions: Bounded<Arc<Log>>,
    guard: Option<SessionGuard>,
    /// When the audit last forgot the sessions the guard no longer tracks (ms since epoch).
    swept_ms: AtomicU64,
}

/// One session's recent calls.
struct Log {
    session: SessionId,
    calls: Mutex<VecDeque<Invocation>>,
}

impl std::fmt::Debug for Audit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Audit")
            .field("sessions", &self.sessions.len())
            .field("following", &self.guard.is_some())
            .finish()
    }
}

impl Default for Audit {
    /// An audit of every session, up to the cap.
    fn default() -> Self {
        Audit {
            epoch: Instant::now(),
            sessions: Bounded::new(),
            guard: None,
            swept_ms: AtomicU64::new(0),
        }
    }
}

/// Writes a shared name as a string.
fn shared<S: serde::Serializer>(name: &Option<Arc<str>>, s: S) -> Result<S::Ok, S::Error> {
    name.as_deref().serialize(s)
}

fn ms(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Audit {
    /// An audit of the sessions `guard` tracks.
    pub fn following(guard: SessionGuard) -> Self {
        Audit {
            guard: Some(guard),
            ..Audit::default()
        }
    }

    fn record(&self, call: &Call, entry: Invocation) {
        let Some(log) = self.log_of(call) else {
            return;
        };
        let mut calls = log.calls.lock().unwrap_or_else(PoisonError::into_inner);
        if calls.len() == AUDIT_PER_SESSION {
            calls.pop_front();
        }
        calls.push_back(entry);
    }

    /// The log of `call`'s session: the one it has, else a new one if the guard tracks the
    /// session and a place is free (when none is, after forgetting the sessions the guard no
    /// longer tracks).
    fn log_of(&self, call: &Call) -> Option<Arc<Log>> {
        let key = call.session.key();
        if let Some(log) = self.sessions.get(key) {
            return Some(log);
        }
        if let Some(guard) = &self.guard
            && !guard.is_tracked(&call.session)
        {
            return None;
        }
        let make = || {
            Arc::new(Log {
                session: call.session.clone(),
                calls: Mutex::new(VecDeque::new()),
            })
        };
        self.sessions
            .get_or_insert(key, AUDIT_MAX_SESSIONS, make)
            .or_else(|| {
                self.sweep();
                self.sessions.get_or_insert(key, AUDIT_MAX_SESSIONS, make)
            })
    }

    /// Forgets the sessions the guard no longer tracks, at most once a second.
    fn sweep(&self) {
        let Some(guard) = &self.guard else {
            return;
        };
        let now = ms(self.epoch.elapsed());
        let last = self.swept_ms.load(Ordering::Relaxed);
        if now.saturating_sub(last) < 1000
            || self
                .swept_ms
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        self.sessions.retain(|log| guard.is_tracked(&log.session));
    }

    /// Sessions audited now.
    pub fn len(&self) -> usize {
        self.sessions.len()
    }

    /// Whether no session is audited.
    pub fn is_empty(&self) -> bool {
        self.sessions.is_empty()
    }

    fn entry(&self, call: &Call) -> Invocation {
        Invocation {
            at_ms: ms(self.epoch.elapsed()),
            method: call.method.as_ref().map(bounded_name),
            target: call.target_name().map(|t| bounded_name(t.shared())),
            outcome: None,
            rejection: None,
            queue_wait_ms: 0,
            service_ms: None,
        }
    }

    /// The recent calls of a session, oldest first.
    pub fn invocations(&self, session: &SessionId) -> Vec<Invocation> {
        let key = session.key();
        self.sessions.get(key).map_or_else(Vec::new, |log| {
            log.calls
                .lock()
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
