//! What stormgate costs per call, with its peers in the same run: `cargo bench --bench stack`.
//!
//! * **stack**: one 300-byte `tools/call` HTTP request through `tower::Service`: an instant
//!   inner service (an axum `Router` answering a small JSON-RPC result) alone, inside the whole
//!   [`Control`] stack in `off` mode, in `adaptive` mode, and inside the classify layer alone.
//!   Each iteration builds the request and reads the whole answer body (the FIFO place and the
//!   outcome are settled when the body ends); that work is the same in every variant.
//! * **two threads**: the same calls from two threads at once, each on its own current-thread
//!   runtime and half of the sessions, through one stack (no stack, and `adaptive`): the
//!   measured thread's CPU time per call, with what the other thread's writes to the stack's
//!   shared state (counters, locks, reference counts) cost it, as between a server's two
//!   tokio workers.
//! * **SSE answer**: the same with the answer written as rmcp writes it, an SSE stream of two
//!   events (the outcome layer parses it event by event; every body wrapper polls each frame).
//! * **per layer**: each non-waiting check on a pre-classified [`Call`] (the parse excluded),
//!   through its public `Admission` / `acquire` API, not through its tower layer: the global
//!   budget, the global + tenant budget, the session guard, the FIFO limiter. The classify
//!   layer is the stack group's "classify layer only" minus "no stack".
//! * **admission**: all of stormgate's checks together against governor's keyed `check_key`,
//!   tower's `ConcurrencyLimit` and tower-resilience's rate-limiter layer (both around an
//!   instant service, which is measured alone too), on the same calls: 1 000 sessions of 100
//!   tenants, visited in a scrambled order.
//! * **scaling**: the same admission with 1 000 and 1 000 000 tracked sessions and tenants,
//!   calls spread over all of them (governor's keyed check beside it).
//! * **stack with metrics**: the adaptive stack again with the Prometheus recorder installed,
//!   as the example server runs it (every other group runs with the `metrics` facade's no-op
//!   recorder), and a call the stack refuses (fixed mode, a session rate no call keeps up
//!   with: the refusal written, counted and told to the observers, as in a storm). It runs
//!   last because a recorder is process-wide.
//!
//! **Time is the benchmark thread's CPU time** (`CLOCK_THREAD_CPUTIME_ID`), not wall time:
//! this machine is shared with other builds, and wall-clock medians moved by up to 50% between
//! runs as the thread was descheduled. Every group runs on a current-thread runtime, so all of
//! a call's work is done on that thread.
//!
//! Every budget is far above the offered rate: the admit path is measured, never a refusal
//! (checked before and after the stack group). Every session is accepted, as a real server's
//! are at `initialize`, so calls are charged to their session's own state: the session table
//! is measured, not the tenants' unverified pools.

use std::convert::Infallible;
use std::hint::black_box;
use std::num::{NonZeroU32, NonZeroUsize};
use std::time::Duration;
use stormgate::valid::{AtLeastOne, NonNegative, Positive};

use axum::Router;
use axum::body::Body;
use axum::routing::post;
use bytes::Bytes;
use cpu_time::ThreadTime;
use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use governor::{DefaultKeyedRateLimiter, Quota};
use http::header::{ACCEPT, CONTENT_TYPE};
use http::{HeaderValue, Request};
use http_body_util::BodyExt;
use stormgate::admit::Admission;
use stormgate::budget::{Budget, BudgetConfig, TenantConfig};
use stormgate::classify::ClassifyLayer;
use stormgate::control::{Config, Control, Mode, Off};
use stormgate::entropy::{SessionConfig, SessionGuard};
use stormgate::fifo::{FifoConfig, ResourceLimiter, ResourceLimits};
use stormgate::outcome::OutcomeLayer;
use stormgate::{Call, SessionId, Tenant};
use tokio::runtime::Runtime;
use tower::limit::ConcurrencyLimit;
use tower::{Layer, Service, ServiceExt};
use tower_resilience::ratelimiter::RateLimiterLayer;

/// The request body: a `tools/call` of about 300 bytes.
const BODY: &str = concat!(
    r#"{"jsonrpc":"2.0","id":42,"method":"tools/call","params":{"name":"cache_get","#,
    r#""arguments":{"key":"customer:48213:profile","fields":["name","email","plan","#,
    r#""region","created_at","updated_at"],"consistency":"eventual","max_age_ms":30000,"#,
    r#""namespace":"accounts-eu-west"},"_meta":{"progressToken":"tok-7f3a9c21-5d0e"}}}"#
);

/// What the instant inner service answers.
const RESULT: &str = concat!(
    r#"{"jsonrpc":"2.0","id":42,"result":{"content":[{"type":"text","#,
    r#""text":"cached:customer:48213:profile"}],"isError":false}}"#
);

/// rmcp's first SSE event.
const SSE_PRIMING: &str = "data: \nid: 0/0\nretry: 3000\n\n";
/// [`RESULT`] as rmcp's SSE event.
const SSE_RESULT: &str = concat!(
    r#"data: {"jsonrpc":"2.0","id":42,"result":{"content":[{"type":"text","#,
    r#""text":"cached:customer:48213:profile"}],"isError":false}}"#,
    "\nid: 1/0\n\n"
);

/// Sessions the HTTP requests and the admission calls are spread over.
const SESSIONS: usize = 1_000;
/// Tenants the admission calls are spread over.
const TENANTS: usize = 100;
/// A stride coprime with every population size used, to visit them in a scrambled order.
const STRIDE: usize = 7_919;
/// Far above anything the loops can offer: admission always succeeds.
const HUGE: f64 = 1e12;

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn criterion() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(50)
}

// ---------------------------------------------------------------------------------------------
// The whole stack over HTTP requests
// ---------------------------------------------------------------------------------------------

/// The instant inner service: a router whose `/mcp` answers a small JSON-RPC result.
fn inner() -> Router {
    Router::new().route(
        "/mcp",
        post(|| async { ([(CONTENT_TYPE, "application/json")], RESULT) }),
    )
}

/// The answer as an SSE stream of two events, as rmcp's streamable HTTP service writes it.
struct SseBody(u8);

impl http_body::Body for SseBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Infallible>>> {
        let frame = match self.0 {
            0 => SSE_PRIMING,
            1 => SSE_RESULT,
            _ => return std::task::Poll::Ready(None),
        };
        self.0 += 1;
        let frame = http_body::Frame::data(Bytes::from_static(frame.as_bytes()));
        std::task::Poll::Ready(Some(Ok(frame)))
    }
}

/// The instant inner service answering as an SSE stream.
fn inner_sse() -> Router {
    Router::new().route(
        "/mcp",
        post(|| async { ([(CONTENT_TYPE, "text/event-stream")], Body::new(SseBody(0))) }),
    )
}

/// The whole stack's configuration, with every budget far above the offered rate.
fn config() -> Config {
    let mut config = Config::default();
    config.budget.stable_budget = Positive::new(HUGE).unwrap();
    config.tenants.min_budget = Some(NonNegative::new(HUGE / 100.0).unwrap());
    config.sessions.base_budget = Positive::new(HUGE).unwrap();
    config.sessions.burst = Positive::new(HUGE).unwrap();
    // Room for every session to be accepted (`warmed_with` accepts them, as a real server's
    // sessions are at `initialize`): the session table is measured, not the tenant's
    // unverified pool.
    config.sessions.new_session_burst = AtLeastOne::new(HUGE).unwrap();
    config
}

fn session_headers() -> Vec<HeaderValue> {
    (0..SESSIONS)
        .map(|i| HeaderValue::try_from(format!("session-{i:04}")).unwrap())
        .collect()
}

fn request(session: &HeaderValue) -> Request<Body> {
    Request::post("/mcp")
        .header(CONTENT_TYPE, "application/json")
        .header(ACCEPT, "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-11-25")
        .header("mcp-session-id", session.clone())
        .body(Body::from(Bytes::from_static(BODY.as_bytes())))
        .unwrap()
}

/// One call through `svc`, the whole answer read; returns the answer.
async fn one(svc: &mut Router, req: Request<Body>) -> Bytes {
    let res = ServiceExt::<Request<Body>>::ready(svc)
        .await
        .unwrap()
        .call(req)
        .await
        .unwrap();
    res.into_body().collect().await.unwrap().to_bytes()
}

/// Panics unless `svc` answers 2 000 calls (spread over the sessions) with the inner result.
fn assert_admitted(rt: &Runtime, svc: &Router, sessions: &[HeaderValue]) {
    assert_every_answer(rt, svc, sessions, RESULT, "a call was refused or changed");
}

/// Panics unless every answer of `svc` to 2 000 calls (spread over the sessions) holds
/// `expected`.
fn assert_every_answer(
    rt: &Runtime,
    svc: &Router,
    sessions: &[HeaderValue],
    expected: &str,
    otherwise: &str,
) {
    rt.block_on(async {
        let mut svc = svc.clone();
        for i in 0..2_000 {
            let body = one(&mut svc, request(&sessions[i % sessions.len()])).await;
            let body = String::from_utf8_lossy(&body);
            assert!(body.contains(expected), "{otherwise}: {body}");
        }
    });
}

fn bench_http(
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    rt: &Runtime,
    svc: &Router,
    sessions: &[HeaderValue],
) {
    g.bench_function(name, |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let mut svc = svc.clone();
                let mut i = 0usize;
                let start = ThreadTime::now();
                for _ in 0..iters {
                    i = (i + STRIDE) % sessions.len();
                    black_box(one(&mut svc, request(&sessions[i])).await);
                }
                start.elapsed()
            })
        })
    });
}

/// [`bench_http`] with a second thread calling `svc` too, on its own runtime and the other
/// half of the sessions, for as long as the measured thread runs: two workers sharing the
/// stack's state, as a server's two tokio workers do. Only the measured thread's CPU time
/// counts; what the other's writes to shared cache lines cost it shows there.
fn bench_two_threads(
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    rt: &Runtime,
    svc: &Router,
    sessions: &[HeaderValue],
) {
    let (mine, theirs) = sessions.split_at(sessions.len() / 2);
    g.bench_function(name, |b| {
        b.iter_custom(|iters| {
            let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let start = std::sync::Arc::new(std::sync::Barrier::new(2));
            let other = {
                let (stop, start, svc) = (stop.clone(), start.clone(), svc.clone());
                let theirs = theirs.to_vec();
                std::thread::spawn(move || {
                    let rt = runtime();
                    rt.block_on(async {
                        let mut svc = svc;
                        let mut i = 0usize;
                        start.wait();
                        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                            i = (i + STRIDE) % theirs.len();
                            black_box(one(&mut svc, request(&theirs[i])).await);
                        }
                    })
                })
            };
            let elapsed = rt.block_on(async {
                let mut svc = svc.clone();
                let mut i = 0usize;
                start.wait();
                let begin = ThreadTime::now();
                for _ in 0..iters {
                    i = (i + STRIDE) % mine.len();
                    black_box(one(&mut svc, request(&mine[i])).await);
                }
                begin.elapsed()
            });
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            other.join().unwrap();
            elapsed
        })
    });
}

/// The whole stack in `mode`, every session and the tenant known and the tenant's share
/// allocated, checked to admit everything.
fn warmed(rt: &Runtime, mode: Mode, inner: Router, sessions: &[HeaderValue]) -> (Control, Router) {
    warmed_with(rt, mode, Off::Measure, inner, sessions)
}

/// [`warmed`], with `off` set as given.
fn warmed_with(
    rt: &Runtime,
    mode: Mode,
    off: Off,
    inner: Router,
    sessions: &[HeaderValue],
) -> (Control, Router) {
    let mut config = config();
    config.off = off;
    let control = Control::new(config).unwrap();
    control.set_mode(mode);
    let protected = control.wrap(inner);
    // Every session accepted, as a real server's are at `initialize` (a call on an id the
    // server has not accepted never makes it a session of its own).
    for s in sessions {
        let id = SessionId::new(s.to_str().unwrap());
        assert!(control.stages().sessions.accept(&id, &Tenant::anonymous()));
    }
    assert_admitted(rt, &protected, sessions);
    control.stages().budget.tick();
    assert_admitted(rt, &protected, sessions);
    if mode == Mode::Adaptive {
        assert_eq!(
            control.sessions().len(),
            sessions.len(),
            "every session accepted"
        );
    }
    (control, protected)
}

fn stack(c: &mut Criterion) {
    assert!(
        (280..=320).contains(&BODY.len()),
        "body is {} bytes",
        BODY.len()
    );
    let rt = runtime();
    let _enter = rt.enter();
    let sessions = session_headers();
    let bare = inner();
    let classify_only = inner().layer(ClassifyLayer::new());
    // One stack per mode, built and warmed alike, so neither inherits the other's state.
    let adaptive = warmed(&rt, Mode::Adaptive, inner(), &sessions);
    let off = warmed(&rt, Mode::Off, inner(), &sessions);
    let passing = warmed_with(&rt, Mode::Off, Off::PassThrough, inner(), &sessions);

    let mut g = c.benchmark_group("stack: one 300-byte tools/call");
    bench_http(
        &mut g,
        "no stack (inner service alone)",
        &rt,
        &bare,
        &sessions,
    );
    bench_http(
        &mut g,
        "classify layer only",
        &rt,
        &classify_only,
        &sessions,
    );
    bench_http(&mut g, "stormgate adaptive", &rt, &adaptive.1, &sessions);
    bench_http(&mut g, "stormgate off", &rt, &off.1, &sessions);
    bench_http(
        &mut g,
        "stormgate off, passing through",
        &rt,
        &passing.1,
        &sessions,
    );
    g.finish();
    // Nothing was refused while measuring either.
    assert_admitted(&rt, &adaptive.1, &sessions);
    assert_admitted(&rt, &off.1, &sessions);

    // Two threads calling one stack at once, each measured per call on its own CPU time.
    let mut g = c.benchmark_group("stack on two threads at once (per call of one)");
    bench_two_threads(
        &mut g,
        "no stack (inner service alone)",
        &rt,
        &bare,
        &sessions,
    );
    bench_two_threads(&mut g, "stormgate adaptive", &rt, &adaptive.1, &sessions);
    g.finish();
    assert_admitted(&rt, &adaptive.1, &sessions);

    // The answer as rmcp writes it: an SSE stream of two events (a priming event, then the
    // result), which the outcome layer parses event by event and every body wrapper polls.
    let sse_bare = inner_sse();
    let sse_adaptive = warmed(&rt, Mode::Adaptive, inner_sse(), &sessions);
    let mut g = c.benchmark_group("stack, answer as an SSE stream (as rmcp answers)");
    bench_http(
        &mut g,
        "no stack (inner service alone)",
        &rt,
        &sse_bare,
        &sessions,
    );
    bench_http(
        &mut g,
        "stormgate adaptive",
        &rt,
        &sse_adaptive.1,
        &sessions,
    );
    g.finish();
    assert_admitted(&rt, &sse_adaptive.1, &sessions);

    // The same request through the layers added one at a time, in the stack's order (the
    // composition of the README's `protected()`): what each layer adds over HTTP.
    let budget = budget(true, 10_000);
    let sessions_guard = guard(100_000);
    let fifo = FifoConfig::default().layer();
    let outcome = OutcomeLayer::new([budget.observer(), sessions_guard.observer()]);
    let classify = || ClassifyLayer::new().costs(budget.costs());
    let stages: [(&str, Router); 4] = [
        (
            "classify + budget",
            inner().layer(budget.layer()).layer(classify()),
        ),
        (
            "classify + budget + session guard",
            inner()
                .layer(sessions_guard.layer())
                .layer(budget.layer())
                .layer(classify()),
        ),
        (
            "classify + budget + session guard + FIFO",
            inner()
                .layer(fifo.clone())
                .layer(sessions_guard.layer())
                .layer(budget.layer())
                .layer(classify()),
        ),
        (
            "classify + budget + session guard + FIFO + outcome",
            inner()
                .layer(outcome)
                .layer(fifo)
                .layer(sessions_guard.layer())
                .layer(budget.layer())
                .layer(classify()),
        ),
    ];
    for (_, svc) in &stages {
        assert_admitted(&rt, svc, &sessions);
    }
    budget.tick();
    let mut g = c.benchmark_group("stack layers, cumulative (adaptive)");
    for (name, svc) in &stages {
        bench_http(&mut g, name, &rt, svc, &sessions);
    }
    g.finish();
    for (_, svc) in &stages {
        assert_admitted(&rt, svc, &sessions);
    }
}

// ---------------------------------------------------------------------------------------------
// Admission on pre-classified calls
// ---------------------------------------------------------------------------------------------

/// The workload: `sessions` calls to `cache_get`, session `i` belonging to tenant
/// `i % tenants`, with the arguments of [`BODY`].
struct Workload {
    sessions: Vec<SessionId>,
    tenants: Vec<Tenant>,
    call: Call,
}

impl Workload {
    fn new(sessions: usize, tenants: usize) -> Self {
        Workload {
            sessions: (0..sessions)
                .map(|i| SessionId::new(format!("session-{i}")))
                .collect(),
            tenants: (0..tenants)
                .map(|i| Tenant::new(format!("tenant-{i}")))
                .collect(),
            call: Call::request("tools/call")
                .with_tool("cache_get")
                .with_arguments(r#"{"key":"customer:48213:profile","consistency":"eventual"}"#),
        }
    }

    /// Points the call at session `i` (and its tenant): two reference-count increments.
    fn set(&mut self, i: usize) -> &Call {
        self.call.session = self.sessions[i].clone();
        self.call.tenant = self.tenants[i % self.tenants.len()].clone();
        &self.call
    }

    fn len(&self) -> usize {
        self.sessions.len()
    }
}

fn budget(tenants: bool, max_tenants: usize) -> Budget {
    Budget::builder({
        let mut built = BudgetConfig::default();
        built.stable_budget = Positive::new(HUGE).unwrap();
        built
    })
    .tenants({
        let mut built = TenantConfig::default();
        built.enabled = tenants;
        built.min_budget = Some(NonNegative::new(HUGE / 100.0).unwrap());
        built.max_tenants = std::num::NonZeroUsize::new(max_tenants).unwrap();
        built
    })
    .build()
}

/// A guard with room for `max` sessions and tenants, every newcomer accepted at once.
fn guard(max: usize) -> SessionGuard {
    SessionGuard::new({
        let mut built = SessionConfig::default();
        built.base_budget = Positive::new(HUGE).unwrap();
        built.burst = Positive::new(HUGE).unwrap();
        built.max_sessions = std::num::NonZeroUsize::new(max).unwrap();
        built.max_tenants = std::num::NonZeroUsize::new(max).unwrap();
        built.new_session_burst = AtLeastOne::new(HUGE).unwrap();
        built
    })
    .unwrap()
}

/// Every session of `w` accepted by `guard`, as the MCP server accepts them at
/// `initialize`: calls are then charged to their own session's state.
fn accept_all(guard: &SessionGuard, w: &mut Workload) {
    for i in 0..w.len() {
        let call = w.set(i);
        assert!(guard.accept(&call.session, &call.tenant));
    }
    assert_eq!(guard.len(), w.len());
}

/// The limiter as the stack has it for `cache_get` (no limits configured), or with a
/// concurrency limit (so a place is really counted, taken and given back).
fn limiter(limited: bool) -> ResourceLimiter {
    let builder = ResourceLimiter::builder();
    if limited {
        builder.default_limits(
            ResourceLimits::default().max_concurrent(NonZeroUsize::new(1024).unwrap()),
        )
    } else {
        builder
    }
    .build()
}

/// Everything stormgate checks for one call before the inner service, minus the parse.
struct Stormgate {
    /// The budget and the session guard, one admitting stage as in the stack (one clock
    /// reading for both).
    admissions: (Budget, SessionGuard),
    fifo: ResourceLimiter,
}

impl Stormgate {
    fn new(max: usize) -> Self {
        Stormgate {
            admissions: (budget(true, max), guard(max)),
            fifo: limiter(false),
        }
    }

    /// Admits `call` everywhere, as the stack does, then lets every permit go.
    async fn admit(&self, call: &Call) -> bool {
        let permits = self.admissions.admit(call).unwrap();
        let lease = self
            .fifo
            .acquire("cache_get", Some(call.tenant.as_str()))
            .await
            .unwrap();
        drop((permits, lease));
        true
    }

    /// Every session and tenant of `w` tracked, and tenant shares allocated.
    fn populate(&self, rt: &Runtime, w: &mut Workload) {
        accept_all(&self.admissions.1, w);
        rt.block_on(async {
            for i in 0..w.len() {
                let call = w.set(i).clone();
                assert!(self.admit(&call).await);
            }
        });
        self.admissions.0.tick();
    }
}

/// Times `iters` calls of `f` on the workload's calls in a scrambled order, in `rt`.
fn time_calls<F>(rt: &Runtime, w: &mut Workload, iters: u64, mut f: F) -> Duration
where
    F: AsyncFnMut(&Call, usize) -> bool,
{
    rt.block_on(async {
        let n = w.len();
        let mut i = 0usize;
        let start = ThreadTime::now();
        for _ in 0..iters {
            i = (i + STRIDE) % n;
            let call = w.set(i);
            black_box(f(call, i).await);
        }
        start.elapsed()
    })
}

fn per_layer(c: &mut Criterion) {
    let rt = runtime();
    let _enter = rt.enter();
    let mut w = Workload::new(SESSIONS, TENANTS);
    let mut g = c.benchmark_group("per layer: admission on a pre-classified Call");

    for (name, tenants) in [("global budget", false), ("global + tenant budget", true)] {
        let b = budget(tenants, 10_000);
        for i in 0..w.len() {
            drop(b.admit(w.set(i)).unwrap());
        }
        b.tick();
        g.bench_function(name, |bench| {
            bench.iter_custom(|iters| {
                time_calls(&rt, &mut w, iters, async |call, _| b.admit(call).is_ok())
            })
        });
    }

    let s = guard(100_000);
    accept_all(&s, &mut w);
    for i in 0..w.len() {
        drop(s.admit(w.set(i)).unwrap());
    }
    g.bench_function("session guard", |bench| {
        bench.iter_custom(|iters| {
            time_calls(&rt, &mut w, iters, async |call, _| s.admit(call).is_ok())
        })
    });

    for (name, limited) in [
        (
            "FIFO acquire + release (no limits, as the stack's cache_get)",
            false,
        ),
        ("FIFO acquire + release (max_concurrent 1024)", true),
    ] {
        let l = limiter(limited);
        g.bench_function(name, |bench| {
            bench.iter_custom(|iters| {
                time_calls(&rt, &mut w, iters, async |call, _| {
                    l.acquire("cache_get", Some(call.tenant.as_str()))
                        .await
                        .is_ok()
                })
            })
        });
    }
    g.finish();
}

/// An instant service taking the call's index.
fn instant() -> impl Service<
    usize,
    Response = usize,
    Error = Infallible,
    Future = std::future::Ready<Result<usize, Infallible>>,
> + Clone
+ Send
+ 'static {
    tower::service_fn(|i: usize| std::future::ready(Ok::<_, Infallible>(i)))
}

fn keyed_governor() -> DefaultKeyedRateLimiter<SessionId> {
    DefaultKeyedRateLimiter::keyed(Quota::per_second(NonZeroU32::new(1_000_000_000).unwrap()))
}

fn admission(c: &mut Criterion) {
    let rt = runtime();
    let _enter = rt.enter();
    let mut w = Workload::new(SESSIONS, TENANTS);
    let mut g = c.benchmark_group("admission: 1 000 sessions of 100 tenants");

    let sg = Stormgate::new(100_000);
    sg.populate(&rt, &mut w);
    g.bench_function(
        "stormgate: global + tenant budget, session guard, FIFO",
        |b| {
            b.iter_custom(|iters| {
                time_calls(&rt, &mut w, iters, async |call, _| sg.admit(call).await)
            })
        },
    );

    let gov = keyed_governor();
    for id in &w.sessions {
        let _ = gov.check_key(id);
    }
    g.bench_function("governor keyed check_key (by session)", |b| {
        b.iter_custom(|iters| {
            time_calls(&rt, &mut w, iters, async |call, _| {
                gov.check_key(&call.session).is_ok()
            })
        })
    });

    let mut svc = instant();
    g.bench_function("instant service alone (baseline of the layers)", |b| {
        b.iter_custom(|iters| {
            time_calls(&rt, &mut w, iters, async |_, i| {
                svc.ready().await.unwrap().call(i).await.is_ok()
            })
        })
    });

    let mut svc = ConcurrencyLimit::new(instant(), 1024);
    g.bench_function("tower ConcurrencyLimit layer (not keyed)", |b| {
        b.iter_custom(|iters| {
            time_calls(&rt, &mut w, iters, async |_, i| {
                svc.ready().await.unwrap().call(i).await.is_ok()
            })
        })
    });

    let mut svc = RateLimiterLayer::builder()
        .limit_for_period(usize::MAX / 2)
        .refresh_period(Duration::from_secs(1))
        .build()
        .unwrap()
        .layer(instant());
    g.bench_function("tower-resilience RateLimiter layer (not keyed)", |b| {
        b.iter_custom(|iters| {
            time_calls(&rt, &mut w, iters, async |_, i| {
                svc.ready().await.unwrap().call(i).await.is_ok()
            })
        })
    });
    g.finish();
}

fn scaling(c: &mut Criterion) {
    let rt = runtime();
    let _enter = rt.enter();
    let mut g = c.benchmark_group("scaling: admission, N sessions and N tenants, calls spread");
    for n in [1_000usize, 1_000_000] {
        let mut w = Workload::new(n, n);
        let sg = Stormgate::new(2 * n);
        sg.populate(&rt, &mut w);
        g.bench_with_input(BenchmarkId::new("stormgate", n), &n, |b, _| {
            b.iter_custom(|iters| {
                time_calls(&rt, &mut w, iters, async |call, _| sg.admit(call).await)
            })
        });
        drop(sg);
        let gov = keyed_governor();
        for id in &w.sessions {
            let _ = gov.check_key(id);
        }
        g.bench_with_input(BenchmarkId::new("governor check_key", n), &n, |b, _| {
            b.iter_custom(|iters| {
                time_calls(&rt, &mut w, iters, async |call, _| {
                    gov.check_key(&call.session).is_ok()
                })
            })
        });
    }
    g.finish();
}

/// The adaptive stack with the Prometheus recorder installed (process-wide: runs last).
fn stack_with_metrics(c: &mut Criterion) {
    let rt = runtime();
    let _enter = rt.enter();
    let _handle = stormgate::metrics::prometheus_builder()
        .install_recorder()
        .unwrap();
    let sessions = session_headers();
    let (_control, protected) = warmed(&rt, Mode::Adaptive, inner(), &sessions);
    let mut g = c.benchmark_group("stack with the Prometheus recorder");
    bench_http(&mut g, "stormgate adaptive", &rt, &protected, &sessions);
    let refusing = refusing(&rt, &sessions);
    bench_http(&mut g, "a refused call", &rt, &refusing, &sessions);
    g.finish();
    assert_admitted(&rt, &protected, &sessions);
    assert_refused(&rt, &refusing, &sessions);
}

/// The whole stack in fixed mode with a session rate no call keeps up with: after each
/// session's first call, every call is refused by the session guard (the storm's path: the
/// refusal written, counted in the metrics and told to every observer), checked.
fn refusing(rt: &Runtime, sessions: &[HeaderValue]) -> Router {
    let mut config = config();
    config.fixed.session_rate = Some(Positive::new(1e-9).unwrap());
    let control = Control::new(config).unwrap();
    control.set_mode(Mode::Fixed);
    let protected = control.wrap(inner());
    for s in sessions {
        let id = SessionId::new(s.to_str().unwrap());
        assert!(control.stages().sessions.accept(&id, &Tenant::anonymous()));
    }
    rt.block_on(async {
        let mut svc = protected.clone();
        for s in sessions {
            one(&mut svc, request(s)).await; // each session's one admitted call
        }
    });
    assert_refused(rt, &protected, sessions);
    protected
}

/// Panics unless `svc` refuses 2 000 calls (spread over the sessions) as rate limited.
fn assert_refused(rt: &Runtime, svc: &Router, sessions: &[HeaderValue]) {
    assert_every_answer(
        rt,
        svc,
        sessions,
        "fixed_limit_exceeded",
        "a call was not refused",
    );
}

criterion_group! {
    name = benches;
    config = criterion();
    targets = stack, per_layer, admission, scaling, stack_with_metrics
}
criterion_main!(benches);
