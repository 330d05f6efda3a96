//! The per-session invocation audit: the recent calls of a session with their queue wait.

use std::borrow::Cow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use serde::Serialize;
use tokio::time::Instant;

use crate::bounded::Bounded;
use crate::call::{Call, SessionId, bounded};
use crate::entropy::SessionGuard;
use crate::outcome::{Observation, Observer, Outcome};
use crate::rejection::{Reason, Rejection};

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
    calls: Mutex<Recent>,
}

/// A session's last [`AUDIT_PER_SESSION`] calls, oldest first once the ring is full.
///
/// An entry is plain data (its names are places in the log's own table), so recording a call
/// writes its entry over the oldest without reading it: no shared name's reference count is
/// written per call. Its entries take at most 2 000 bytes (50 of 40).
#[derive(Default)]
struct Recent {
    entries: Vec<Entry>,
    /// Where the next entry goes once the ring is full (the oldest entry).
    next: usize,
    /// The names the entries refer to. Names no entry refers to any more are forgotten when
    /// the table is full ([`NAMES`] places).
    names: Vec<Arc<str>>,
}

/// The places in a log's table of names: those of the 49 entries kept and of the one being
/// written. When it is full, the names no kept entry refers to are forgotten, so the new
/// entry's two always fit.
const NAMES: usize = 2 * AUDIT_PER_SESSION;

/// No name.
const NO_NAME: u8 = u8::MAX;

/// One call as a log keeps it (its names as places in the log's table).
#[derive(Clone, Copy)]
struct Entry {
    at_ms: u64,
    queue_wait_ms: u64,
    service_ms: Option<u64>,
    method: u8,
    target: u8,
    outcome: Option<Outcome>,
    rejection: Option<Reason>,
}

impl Entry {
    /// An entry made `at_ms`, with no names, outcome or refusal yet.
    fn at(at_ms: u64) -> Entry {
        Entry {
            at_ms,
            queue_wait_ms: 0,
            service_ms: None,
            method: NO_NAME,
            target: NO_NAME,
            outcome: None,
            rejection: None,
        }
    }
}

impl Recent {
    /// Records `entry`, named `method` and `target`, over the oldest entry once full.
    fn push(&mut self, method: Option<&Arc<str>>, target: Option<&Arc<str>>, mut entry: Entry) {
        if self.names.len() + 2 > NAMES {
            self.forget_unused();
        }
        entry.method = self.place(method);
        entry.target = self.place(target);
        let len = self.entries.len();
        if len < AUDIT_PER_SESSION {
            if len == self.entries.capacity() {
                // Grown as a `Vec` grows, but never past the ring's size.
                self.entries
                    .reserve_exact(len.max(4).min(AUDIT_PER_SESSION - len));
            }
            self.entries.push(entry);
        } else {
            self.entries[self.next] = entry;
            self.next = (self.next + 1) % AUDIT_PER_SESSION;
        }
    }

    /// The place of `name` in the table, added if it is not there yet (there is room: see
    /// [`push`](Self::push)).
    fn place(&mut self, name: Option<&Arc<str>>) -> u8 {
        let Some(name) = name else {
            return NO_NAME;
        };
        let text = bounded(name);
        let found = self
            .names
            .iter()
            .position(|n| Arc::ptr_eq(n, name) || **n == *text);
        let at = found.unwrap_or_else(|| {
            self.names.push(match text {
                Cow::Borrowed(_) => name.clone(),
                Cow::Owned(hashed) => hashed.into(),
            });
            self.names.len() - 1
        });
        u8::try_from(at).unwrap_or(NO_NAME)
    }

    /// Forgets the names no entry refers to but the one written over next (once the ring is
    /// full), and renumbers the rest: at most 98 are kept, so the new entry's two fit.
    fn forget_unused(&mut self) {
        let overwritten = (self.entries.len() == AUDIT_PER_SESSION).then_some(self.next);
        let mut used = [false; NAMES];
        for (i, e) in self.entries.iter().enumerate() {
            if Some(i) != overwritten {
                for n in [e.method, e.target] {
                    if n != NO_NAME {
                        used[usize::from(n)] = true;
                    }
                }
            }
        }
        let mut renumbered = [NO_NAME; NAMES];
        let mut kept = 0;
        let names = std::mem::take(&mut self.names);
        for (i, name) in names.into_iter().enumerate() {
            if used[i] {
                renumbered[i] = kept;
                kept += 1;
                self.names.push(name);
            }
        }
        for e in &mut self.entries {
            for n in [&mut e.method, &mut e.target] {
                if *n != NO_NAME {
                    *n = renumbered[usize::from(*n)];
                }
            }
        }
    }

    /// The name at `place`.
    fn name(&self, place: u8) -> Option<Arc<str>> {
        self.names.get(usize::from(place)).cloned()
    }

    /// The entries, oldest first.
    fn invocations(&self) -> Vec<Invocation> {
        let (newer, older) = self.entries.split_at(self.next);
        older
            .iter()
            .chain(newer)
            .map(|e| Invocation {
                at_ms: e.at_ms,
                method: self.name(e.method),
                target: self.name(e.target),
                outcome: e.outcome.map(Outcome::as_str),
                rejection: e.rejection.map(Reason::as_str),
                queue_wait_ms: e.queue_wait_ms,
                service_ms: e.service_ms,
            })
            .collect()
    }
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

    fn record(&self, call: &Call, entry: Entry) {
        let Some(log) = self.log_of(call) else {
            return;
        };
        let target = call.target_name().map(|t| t.shared());
        log.calls
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(call.method.as_ref(), target, entry);
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
                calls: Mutex::new(Recent::default()),
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

    /// An entry of a call settled `at` (its names are placed when it is recorded).
    fn entry(&self, at: Instant) -> Entry {
        Entry::at(ms(at.saturating_duration_since(self.epoch)))
    }

    /// The recent calls of a session, oldest first.
    pub fn invocations(&self, session: &SessionId) -> Vec<Invocation> {
        let key = session.key();
        self.sessions.get(key).map_or_else(Vec::new, |log| {
            log.calls
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .invocations()
        })
    }
}

impl Observer for Audit {
    fn observe(&self, o: &Observation<'_>) {
        let entry = Entry {
            outcome: Some(o.outcome),
            queue_wait_ms: ms(o.queue_wait),
            service_ms: Some(ms(o.service_time)),
            ..self.entry(o.at)
        };
        self.record(o.call, entry);
    }

    fn refused(&self, call: &Call, rejection: &Rejection) {
        let entry = Entry {
            rejection: Some(rejection.reason()),
            queue_wait_ms: rejection.queue_wait_ms(),
            ..self.entry(Instant::now())
        };
        self.record(call, entry);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The name of index `i`: a few short ones, many distinct ones, long ones (kept hashed).
    fn name(i: u16) -> String {
        match i % 3 {
            0 => format!("tool_{}", i % 7),
            1 => format!("t{i}"),
            _ => format!("{i}{}", "x".repeat(200)),
        }
    }

    #[test]
    fn a_full_log_takes_2000_bytes_of_entries() {
        let mut log = Recent::default();
        let name: Arc<str> = "cache_get".into();
        for at in 0..(3 * AUDIT_PER_SESSION as u64) {
            log.push(None, Some(&name), Entry::at(at));
        }
        assert_eq!(log.entries.capacity(), AUDIT_PER_SESSION);
        assert_eq!(std::mem::size_of::<Entry>() * log.entries.capacity(), 2000);
        assert_eq!(log.names.len(), 1, "one name, kept once");
    }

    /// Calls that each name two names no other call does fill the table to its last place,
    /// and never past it.
    #[test]
    fn names_never_outgrow_the_table() {
        let mut log = Recent::default();
        let mut most = 0;
        for at in 0..(4 * NAMES as u64) {
            let (m, t): (Arc<str>, Arc<str>) = (format!("m{at}").into(), format!("t{at}").into());
            log.push(Some(&m), Some(&t), Entry::at(at));
            most = most.max(log.names.len());
            let last = log.invocations().pop().unwrap();
            assert_eq!((last.method, last.target), (Some(m), Some(t)));
        }
        assert_eq!(most, NAMES);
    }

    proptest! {
        /// A log holds what a plain queue of the last 50 calls with their names (bounded) would,
        /// oldest first, after every call, however many names pass through it; its table of
        /// names stays within its places.
        #[test]
        fn a_log_is_the_last_calls_in_order(
            calls in proptest::collection::vec(
                (proptest::option::of(0u16..400), proptest::option::of(0u16..400), any::<bool>()),
                0..400,
            ),
        ) {
            let mut log = Recent::default();
            let mut reference = std::collections::VecDeque::new();
            // One shared copy of each name, as the classifier's cache hands them out; a fresh
            // copy now and then (the cache forgot it), which must find the same place.
            let mut shared: std::collections::HashMap<u16, Arc<str>> = Default::default();
            for (at, (method, target, fresh)) in calls.into_iter().enumerate() {
                let mut arc = |i: u16| -> Arc<str> {
                    if fresh {
                        Arc::from(name(i))
                    } else {
                        shared.entry(i).or_insert_with(|| Arc::from(name(i))).clone()
                    }
                };
                let (m, t) = (method.map(&mut arc), target.map(&mut arc));
                log.push(m.as_ref(), t.as_ref(), Entry::at(at as u64));
                if reference.len() == AUDIT_PER_SESSION {
                    reference.pop_front();
                }
                let kept = |n: Option<u16>| n.map(|i| bounded(&name(i)).into_owned());
                reference.push_back((at as u64, kept(method), kept(target)));
                prop_assert!(log.names.len() <= NAMES);
                let got: Vec<_> = log
                    .invocations()
                    .into_iter()
                    .map(|i| (i.at_ms, i.method.map(|n| n.to_string()), i.target.map(|n| n.to_string())))
                    .collect();
                prop_assert_eq!(got, reference.iter().cloned().collect::<Vec<_>>());
            }
        }
    }
}
