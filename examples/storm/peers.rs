//! The peers the storm demo measures stormgate against, each built as a stormgate stage in
//! front of the MCP router (where the other policies sit), so every policy sees the same
//! calls and refuses with the same contract (`-32029`, `retry_after_ms`), and the agents
//! back off from a peer exactly as they do from stormgate:
//!
//! * [`governor_router`]: the `governor` crate's keyed rate limiter, keyed by the MCP
//!   session id, on tokio's clock ([`TokioClock`]);
//! * [`adaptive_router`]: tower-resilience's adaptive concurrency algorithms (`Aimd`,
//!   `Vegas`), driven by a stage of ours that times calls on tokio's clock
//!   ([`AdaptiveLimit`]).
//!
//! Both peers use tokio's clock because the demo runs on tokio's paused clock: governor's
//! default clock and tower-resilience's own `AdaptiveService` read the real time, which does
//! not move with it.

use std::collections::HashSet;
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use governor::clock::{Clock, ReasonablyRealtime};
use governor::middleware::NoOpMiddleware;
use governor::nanos::Nanos;
use governor::state::keyed::DashMapStateStore;
use governor::{Quota, RateLimiter};
use stormgate::admit::{Admission, AdmitLayer};
use stormgate::classify::ClassifyLayer;
use stormgate::outcome::{Observation, Observer, Outcome, OutcomeLayer};
use stormgate::{Call, Reason, Rejection, Scope, SessionId};
use tower_resilience::adaptive::ConcurrencyAlgorithm;

/// governor's clock over tokio's: time since the clock was made, read from
/// [`tokio::time::Instant`], so quotas refill with the paused clock.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TokioClock {
    start: tokio::time::Instant,
}

impl TokioClock {
    /// A clock whose zero is now.
    pub(crate) fn new() -> Self {
        TokioClock {
            start: tokio::time::Instant::now(),
        }
    }
}

impl Clock for TokioClock {
    type Instant = Nanos;

    fn now(&self) -> Nanos {
        Nanos::from(self.start.elapsed())
    }
}

impl ReasonablyRealtime for TokioClock {}

/// governor's keyed limiter on tokio's clock.
type Keyed =
    RateLimiter<SessionId, DashMapStateStore<SessionId>, TokioClock, NoOpMiddleware<Nanos>>;

/// An admission stage that checks governor's limiter keyed by the call's MCP session, for
/// `tools/call` (and other targeted) calls only; `initialize`, `tools/list` and the like
/// pass. A refusal says when the session's next call conforms.
pub(crate) struct GovernorAdmission {
    limiter: Keyed,
    clock: TokioClock,
}

impl GovernorAdmission {
    /// `rate` calls per second per session, bursts of up to `burst` calls.
    pub(crate) fn new(rate: u32, burst: u32) -> Self {
        let quota = Quota::per_second(NonZeroU32::new(rate).expect("a rate above 0"))
            .allow_burst(NonZeroU32::new(burst).expect("a burst above 0"));
        let clock = TokioClock::new();
        GovernorAdmission {
            limiter: RateLimiter::new(quota, DashMapStateStore::default(), clock),
            clock,
        }
    }
}

impl Admission for GovernorAdmission {
    type Permit = ();

    fn admit(&self, call: &Call) -> Result<(), Rejection> {
        if call.target().is_none() {
            return Ok(());
        }
        self.limiter.check_key(&call.session).map_err(|not_until| {
            Rejection::new(
                Reason::FixedLimitExceeded,
                Scope::AgentSession,
                not_until
                    .wait_time_from(self.clock.now())
                    .max(Duration::from_millis(1)),
            )
        })
    }
}

/// `router` behind governor's keyed limiter: `rate` calls per second per session, bursts of
/// `burst`.
pub(crate) fn governor_router(router: Router, rate: u32, burst: u32) -> Router {
    router
        .layer(AdmitLayer::new(GovernorAdmission::new(rate, burst)))
        .layer(ClassifyLayer::new())
}

/// How long a call refused by the adaptive limit is told to wait.
pub(crate) const ADAPTIVE_RETRY_AFTER: Duration = Duration::from_millis(100);

/// The shortest latency reported to the algorithm. On the paused clock a tool that does no
/// I/O (`cache_get`) answers in exactly 0 ns, and Vegas skips every adjustment while its
/// minimum RTT is 0; a real server's fastest round trip is about a millisecond.
pub(crate) const MIN_LATENCY: Duration = Duration::from_millis(1);

/// A global adaptive concurrency limit in front of the tool service: a targeted call is
/// admitted while fewer than `algorithm.limit()` such calls are in flight, else refused
/// ([`Reason::ConcurrencyLimited`], [`Scope::Global`], [`ADAPTIVE_RETRY_AFTER`]). Each
/// admitted call's end, as stormgate's outcome layer reports it, feeds the algorithm:
/// `record_success(service time)` for an answer, `record_failure()` for an error or a
/// timeout, `record_dropped()` for a call its client gave up on. A call the server rejected
/// unrun (an unknown tool, bad arguments) is refunded by the admit layer first: it leaves the
/// in-flight count and teaches the algorithm nothing.
pub(crate) struct AdaptiveLimit<A> {
    algorithm: A,
    /// The targeted calls in flight, by session and JSON-RPC id.
    in_flight: Mutex<HashSet<(SessionId, String)>>,
}

impl<A: ConcurrencyAlgorithm + 'static> AdaptiveLimit<A> {
    /// A limit driven by `algorithm`.
    pub(crate) fn new(algorithm: A) -> Self {
        AdaptiveLimit {
            algorithm,
            in_flight: Mutex::new(HashSet::new()),
        }
    }

    fn key(call: &Call) -> Option<(SessionId, String)> {
        call.target()?;
        let id = call.id.as_ref()?.as_json().to_owned();
        Some((call.session.clone(), id))
    }
}

impl<A: ConcurrencyAlgorithm + 'static> Admission for AdaptiveLimit<A> {
    /// The call's key while it is in flight (`None`: not counted).
    type Permit = Option<(SessionId, String)>;

    fn admit(&self, call: &Call) -> Result<Self::Permit, Rejection> {
        let Some(key) = Self::key(call) else {
            return Ok(None);
        };
        let mut in_flight = self.in_flight.lock().unwrap();
        if in_flight.len() >= self.algorithm.limit() {
            return Err(Rejection::new(
                Reason::ConcurrencyLimited,
                Scope::Global,
                ADAPTIVE_RETRY_AFTER,
            ));
        }
        in_flight.insert(key.clone());
        Ok(Some(key))
    }

    fn refund(&self, permit: Self::Permit) {
        if let Some(key) = permit {
            self.in_flight.lock().unwrap().remove(&key);
        }
    }
}

impl<A: ConcurrencyAlgorithm + 'static> Observer for AdaptiveLimit<A> {
    fn observe(&self, o: &Observation<'_>) {
        let Some(key) = Self::key(o.call) else {
            return;
        };
        if !self.in_flight.lock().unwrap().remove(&key) {
            return; // refunded (rejected unrun), or never admitted here
        }
        match o.outcome {
            Outcome::Ok => self
                .algorithm
                .record_success(o.service_time.max(MIN_LATENCY)),
            Outcome::Error | Outcome::Timeout => self.algorithm.record_failure(),
            Outcome::Cancelled | Outcome::ClientError => self.algorithm.record_dropped(),
        }
    }
}

/// `router` behind `limit`: classify, then the limit's admission, then the outcome layer
/// reporting to it, right around the MCP router.
pub(crate) fn adaptive_router<A: ConcurrencyAlgorithm + 'static>(
    router: Router,
    limit: Arc<AdaptiveLimit<A>>,
) -> Router {
    let observer: Arc<dyn Observer> = limit.clone();
    router
        .layer(OutcomeLayer::new([observer]))
        .layer(AdmitLayer::from_arc(limit))
        .layer(ClassifyLayer::new())
}
