//! Per-session entropy scoring: what no plain rate limiter sees.
//!
//! An agent in a storm does not send more of the same call; it flails: new queries, new
//! parameters, other tools, while its calls fail and slow down. [`SessionGuard`] keeps, per
//! session:
//!
//! * a sliding window (`window_size`, 10 s, bucketed) of calls per resource key (the tool and,
//!   by default, a short hash of its canonical arguments, so the same search with ever-new
//!   queries looks diverse), and its Shannon entropy, kept in O(1) per call and per expiry
//!   (`Shannon`);
//! * its health from the outcome hook: smoothed error rate, and service time relative to each
//!   tool's healthy service time; the error rate counts only at volume (nothing for up to
//!   [`ERRORS_ALLOWED`] failures within about a window, in full from twice that), so a few
//!   ordinary tool errors are not a storm;
//! * how it treats its refusals, from every stage's (the guard observes them through the
//!   classifier, [`Observer::refused`](crate::outcome::Observer::refused)): the waits of its
//!   last [`HINTS_KEPT`] session-wide refusals, and its calls that arrived while its last
//!   refusals, one per caller it runs (the most calls it has had in flight at once or sent at
//!   once, at least [`HINTS_CALLERS`]), were all still ahead (it ignored its hints: a client whose callers
//!   each wait their own hint never has more waits ahead than callers; refusals given each
//!   within [`HINTS_REACTION`] of the one before went to one burst and do not count), and the
//!   share of its calls refused;
//! * a storm score (`storm_score`): `distress x (1 + diversity + refused share)`, where
//!   distress is how far errors, latency and ignored hints are past their tolerances
//!   (`HINTS_IGNORED_ALLOWED` for the hints) and diversity is the entropy above 1 bit plus
//!   its rise over the session's own healthy baseline;
//! * a budget: `base_budget` cost units per second times `exp(-entropy_coefficient x score)`
//!   (at least `min_factor`), cut at once when the score rises, regained by `recover_step` per
//!   second once the session is healthy again (errors and latency back within tolerance).
//!   Refusals name their cause, scope `agent_session`: `session_storm` (the score cut the
//!   budget), `session_probation` (a new session past what probation lends it), else
//!   `session_budget_exceeded`. `retry_after_ms` is the session's own slot in the refill: the
//!   real deficit, and after the slot of the refusal before it, so a burst refused together
//!   comes back spread and is admitted.
//!
//! Complex-task protection: a diverse session whose calls succeed at normal latency and that
//! waits its refusals' hints has no distress and scores 0: it is never penalized for its
//! entropy, nor for a shared budget refusing it. A low-entropy loop of the same failing call is
//! caught by its distress alone.
//!
//! Identities earn nothing until the MCP server accepts them: a session gets its own state
//! only once the server minted its id on `initialize` or answered a call on it with success
//! ([`SessionGuard::accept`]); calls on other ids are charged to and judged by their tenant's
//! unverified pool, one state per tenant. An accepted session starts on probation (a full
//! bucket refilled at `probation` of its budget, doubled per healthy call) and takes one of its
//! tenant's newcomer places (`new_session_burst`, refilled at `new_session_rate`, given back
//! when it graduates healthy after `min_calls`). The places go only to ids that **come back as
//! told**: a call on an id not yet accepted that its tenant's pool refuses is told when to come
//! back (100 ms while a place is free), and the guard remembers when, in a fixed table; a call
//! that comes back at or after that time and that the pool refuses is the id's **trial** while
//! the tenant has a place: admitted on that place, so a client that reads its hints is not
//! refused for what the pool's other clients did; the server's success on it (or on any call
//! that came back as told) accepts the id with that place, a refund gives the place back, any
//! other end spends it (an id gets one trial, of the last 16 its pool remembers). Ids made up
//! per call never come back, so they take no place. A call that comes before its id's wait is
//! charged to and judged by the pool's early state (its bucket starts empty), so clients that
//! call through their hints do not storm the pool for the tenant's new clients.
//!
//! State is bounded: at most `max_sessions` are tracked (past it, new sessions stay in their
//! tenant's pool and no tracked session is evicted for them), at most `max_tenants` pools,
//! [`MAX_TOOLS`] tool baselines; all are keyed by a SipHash of the client's string under a key
//! random per guard. Sessions and pools idle for `idle_ttl` are swept, and each window stores
//! at most `max_keys` keys.

mod guard;
mod key;
mod score;
mod shannon;
mod window;

pub use guard::{
    ERRORS_ALLOWED, HINTS_CALLERS, HINTS_KEPT, HINTS_REACTION, MAX_TOOLS, SessionConfig,
    SessionGuard, SessionPermit, SessionSummary, UNVERIFIED_EARLY_PREFIX, UNVERIFIED_PREFIX,
};
pub use key::MAX_HASHED_ARGS;
