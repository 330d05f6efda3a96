//! The session guard against four agent archetypes, in paused time: every figure is exact.

use std::time::Duration;
use stormgate::valid::{AtLeastOne, Fraction, Positive};

use serde_json::json;
use stormgate::admit::Admission;
use stormgate::entropy::{SessionConfig, SessionGuard};
use stormgate::outcome::{Observation, Observer, Outcome};
use stormgate::{Call, SessionId};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A guard whose sessions are judged from their first call: no probation (tests/hostile.rs
/// covers it), and every session is accepted as the server would on `initialize`.
fn guard() -> SessionGuard {
    guard_of({
        let mut built = SessionConfig::default();
        built.base_budget = Positive::new(2.0).unwrap();
        built.burst = Positive::new(4.0).unwrap();
        built
    })
}

/// [`guard`] with `config`'s other settings.
fn guard_of(config: SessionConfig) -> SessionGuard {
    SessionGuard::new({
        let mut built = config;
        built.probation = Fraction::new(1.0).unwrap();
        built.new_session_burst = AtLeastOne::new(1000.0).unwrap();
        built
    })
    .unwrap()
}

fn call(session: &str, tool: &str, args: serde_json::Value) -> Call {
    Call::request("tools/call")
        .with_tool(tool)
        .with_session(SessionId::new(session))
        .with_arguments(&args.to_string())
}

/// What happened to one call.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Step {
    at: Duration,
    admitted: bool,
    factor: f64,
}

/// Sends `call`; if admitted, reports `outcome` after `latency`. Returns the step.
async fn send(
    g: &SessionGuard,
    c: &Call,
    outcome: Outcome,
    latency: Duration,
    start: tokio::time::Instant,
) -> Step {
    let at = start.elapsed();
    g.accept(&c.session, &c.tenant);
    let admitted = g.admit(c).is_ok();
    if admitted {
        g.observe(&Observation {
            call: c,
            outcome,
            service_time: latency,
            response_bytes: 100,
            queue_wait: Duration::ZERO,
            at: tokio::time::Instant::now(),
        });
    }
    Step {
        at,
        admitted,
        factor: g.summary(&c.session).unwrap().factor,
    }
}

#[tokio::test(start_paused = true)]
async fn a_steady_agent_is_never_penalized() {
    let g = guard();
    let start = tokio::time::Instant::now();
    let c = call("steady", "search", json!({"q": "weather in Paris"}));
    for _ in 0..300 {
        let step = send(&g, &c, Outcome::Ok, ms(200), start).await;
        assert!(step.admitted);
        assert_eq!(step.factor, 1.0);
        tokio::time::advance(ms(1000)).await;
    }
    let s = g.summary(&c.session).unwrap();
    assert_eq!((s.score, s.entropy, s.rejected), (0.0, 0.0, 0));
    assert_eq!(s.call_rate, 1.0, "10 calls in the 10 s window");
}

#[tokio::test(start_paused = true)]
async fn a_complex_healthy_agent_is_not_throttled() {
    let g = guard();
    let start = tokio::time::Instant::now();
    // Five tools round-robin at very different latencies, no errors, one call a second.
    let tools = [
        ("sql", 1000),
        ("search", 200),
        ("cache", 10),
        ("code", 50),
        ("fetch", 400),
    ];
    let mut throttled = 0;
    for i in 0..600 {
        let (tool, latency) = tools[i % tools.len()];
        let c = call("complex", tool, json!({"step": tool}));
        let step = send(&g, &c, Outcome::Ok, ms(latency), start).await;
        if !step.admitted {
            throttled += 1;
        }
        tokio::time::advance(ms(1000)).await;
    }
    let s = g.summary(&SessionId::new("complex")).unwrap();
    assert!(
        (s.entropy - 5f64.log2()).abs() < 1e-9,
        "high entropy: {}",
        s.entropy
    );
    assert_eq!(s.score, 0.0, "complex but healthy: no penalty");
    assert_eq!(throttled, 0, "at most 1% allowed, none seen");
}

/// A typical storm: one search tool, ever-new queries, retrying every failure or refusal at
/// once with a new query; healthy for 40 calls, then errors rise to 40% and latency from
/// 200 ms to 1.8 s. Returns every step and the index of the first call after errors start.
async fn storm(g: &SessionGuard) -> (Vec<Step>, usize) {
    let start = tokio::time::Instant::now();
    let mut steps = Vec::new();
    let mut errors_from = None;
    let mut q: u64 = 0;
    while start.elapsed() < Duration::from_secs(240) {
        q += 1;
        let sick = q > 40;
        if sick && errors_from.is_none() {
            errors_from = Some(steps.len());
        }
        let j = q.saturating_sub(41) as f64;
        let p_error = if sick { (0.4 * j / 30.0).min(0.4) } else { 0.0 };
        let failed = sick && ((q * 37) % 100) as f64 / 100.0 < p_error;
        let latency = if sick {
            (200.0 + 1600.0 * (j / 30.0).min(1.0)) as u64
        } else {
            200
        };
        let c = call(
            "storm",
            "search",
            json!({"query": format!("query number {q}")}),
        );
        let outcome = if failed { Outcome::Error } else { Outcome::Ok };
        let step = send(g, &c, outcome, ms(latency), start).await;
        steps.push(step);
        // Healthy: next query in 2 s. Failed or refused: retry at once with a new query.
        let pause = if step.admitted && !failed { 2000 } else { 200 };
        tokio::time::advance(ms(pause)).await;
    }
    (steps, errors_from.unwrap())
}

#[tokio::test(start_paused = true)]
async fn a_storm_agent_is_penalized_early_and_its_admitted_rate_falls() {
    let g = guard();
    let (steps, errors_from) = storm(&g).await;
    let first_penalty = steps[errors_from..]
        .iter()
        .position(|s| s.factor < 1.0)
        .expect("penalized");
    assert!(
        first_penalty < 15,
        "penalized {first_penalty} calls after the errors started"
    );
    // Admitted calls per second: healthy phase vs the storm once penalized.
    let healthy = &steps[..errors_from];
    let healthy_rate = healthy.len() as f64 / healthy.last().unwrap().at.as_secs_f64();
    let storm = &steps[errors_from + first_penalty..];
    let span = storm.last().unwrap().at - storm[0].at;
    let storm_rate = storm.iter().filter(|s| s.admitted).count() as f64 / span.as_secs_f64();
    let fall = 1.0 - storm_rate / healthy_rate;
    assert!(
        fall >= 0.8,
        "admitted rate fell by {:.0}% ({healthy_rate:.3}/s -> {storm_rate:.3}/s)",
        fall * 100.0
    );
    let s = g.summary(&SessionId::new("storm")).unwrap();
    assert!(s.score > 5.0, "score {}", s.score);
    assert!(s.rejected > 0);
}

#[tokio::test(start_paused = true)]
async fn the_top_view_ranks_the_storm_first() {
    let g = guard();
    let start = tokio::time::Instant::now();
    for i in 0..20 {
        let c = call(&format!("calm-{i}"), "search", json!({"q": "same"}));
        send(&g, &c, Outcome::Ok, ms(200), start).await;
    }
    storm(&g).await;
    g.sweep();
    let top = g.top();
    assert_eq!(top.len(), 10, "bounded to top_n");
    assert_eq!(top[0].session, "storm");
    assert!(top[0].score > 5.0 && top[0].rejected > 0);
    assert!(top[1..].iter().all(|s| s.score == 0.0));
}

#[tokio::test(start_paused = true)]
async fn a_low_entropy_failing_loop_is_penalized() {
    let g = guard();
    let start = tokio::time::Instant::now();
    let c = call("loop", "search", json!({"q": "the same thing"}));
    let mut steps = Vec::new();
    for i in 0..200 {
        // Errors start at call 58 (three, then a pause) and rise to every call by call 100.
        let failed = i >= 50 && (i - 50) * 2 >= (i * 7) % 100;
        let outcome = if failed { Outcome::Error } else { Outcome::Ok };
        steps.push(send(&g, &c, outcome, ms(200), start).await);
        tokio::time::advance(ms(500)).await;
    }
    assert!(steps[..50].iter().all(|s| s.admitted && s.factor == 1.0));
    // The first errors (calls 58-60) are three among healthy calls: not a storm, no cut.
    assert!(
        steps[50..72].iter().all(|s| s.admitted && s.factor == 1.0),
        "three errors among healthy calls cut nothing"
    );
    // From call 72 on the loop fails at volume (every call but a few): cut within 15 calls.
    let first_penalty = steps[72..].iter().position(|s| s.factor < 1.0).unwrap();
    assert!(
        first_penalty < 15,
        "penalized {first_penalty} calls after the errors came at volume"
    );
    let s = g.summary(&c.session).unwrap();
    assert_eq!(s.entropy, 0.0, "one key: no entropy");
    assert!(s.factor < 0.5 && s.rejected > 0, "{s:?}");
}

#[tokio::test(start_paused = true)]
async fn a_session_whose_slow_calls_are_abandoned_is_scored_as_slow() {
    let g = guard();
    let start = tokio::time::Instant::now();
    // Another session teaches the tool's healthy service time: 100 ms.
    let teacher = call("teacher", "search", json!({"q": "x"}));
    for _ in 0..20 {
        send(&g, &teacher, Outcome::Ok, ms(100), start).await;
        tokio::time::advance(ms(500)).await;
    }
    // New queries each time, every one abandoned by its client after 2 s (20x the norm):
    // no error, no answer, yet distress. (3 s apart: each also costs the 1.9 s it held past
    // the norm, 19 units, and the bucket's debt, at most its burst of 4, is repaid by then.)
    let mut abandoned = Vec::new();
    for i in 0..6 {
        let c = call("abandoning", "search", json!({"q": format!("query {i}")}));
        abandoned.push(send(&g, &c, Outcome::Cancelled, ms(2000), start).await);
        tokio::time::advance(ms(3000)).await;
    }
    assert!(abandoned[..5].iter().all(|s| s.admitted), "{abandoned:?}");
    let s = g.summary(&SessionId::new("abandoning")).unwrap();
    assert!(s.score > 0.0, "{s:?}");
    assert!(s.factor < 1.0, "{s:?}");

    // The same pattern cancelled quickly (the user changed their mind) is not slowness.
    for i in 0..6 {
        let c = call("impatient", "search", json!({"q": format!("query {i}")}));
        send(&g, &c, Outcome::Cancelled, ms(50), start).await;
        tokio::time::advance(ms(1000)).await;
    }
    let s = g.summary(&SessionId::new("impatient")).unwrap();
    assert_eq!((s.score, s.factor), (0.0, 1.0), "{s:?}");
}

#[tokio::test(start_paused = true)]
async fn one_failed_call_is_not_a_bad_session_but_a_failing_one_is_cut_within_15_calls() {
    let g = guard();
    let start = tokio::time::Instant::now();
    // A new session whose very first call fails: an error average that took that one sample
    // as its value would cut the session to the 2% floor for ~11 s.
    let c = call("unlucky", "search", json!({"q": "weather in Paris"}));
    send(&g, &c, Outcome::Error, ms(200), start).await;
    // At most a small cut, quickly recovered.
    let mut last = None;
    for _ in 0..20 {
        tokio::time::advance(ms(1000)).await;
        let step = send(&g, &c, Outcome::Ok, ms(200), start).await;
        assert!(step.admitted);
        assert!(step.factor >= 0.8, "{step:?}");
        last = Some(step);
    }
    assert_eq!(last.unwrap().factor, 1.0, "recovered");
    // Every call failing, from the start: cut once there is evidence, well within 15 calls.
    let bad = call("failing", "search", json!({"q": "weather in Paris"}));
    let mut cut_at = None;
    for i in 1..=15 {
        tokio::time::advance(ms(1000)).await;
        let step = send(&g, &bad, Outcome::Error, ms(200), start).await;
        if step.factor < 0.5 && cut_at.is_none() {
            cut_at = Some(i);
        }
    }
    let cut_at = cut_at.expect("cut within 15 calls");
    assert!(
        cut_at > 5,
        "no penalty before min_calls (5) finished calls: {cut_at}"
    );
}

#[tokio::test(start_paused = true)]
async fn milliseconds_of_noise_on_a_fast_tool_are_not_slowness() {
    let g = guard();
    let start = tokio::time::Instant::now();
    // The tool's healthy latency: 0.35 ms (a cache).
    let warm = call("warm", "cache_get", json!({"key": "k"}));
    for _ in 0..50 {
        send(&g, &warm, Outcome::Ok, Duration::from_micros(350), start).await;
        tokio::time::advance(ms(500)).await;
    }
    // A steady agent whose calls take 2 ms (a ratio of 6, but 1.65 ms over the baseline,
    // under the 5 ms floor): judged by the ratio alone, it would be scored as slow and cut.
    let steady = call("steady", "cache_get", json!({"key": "k"}));
    for _ in 0..60 {
        let step = send(&g, &steady, Outcome::Ok, ms(2), start).await;
        assert!(step.admitted);
        assert_eq!(step.factor, 1.0, "{step:?}");
        tokio::time::advance(ms(500)).await;
    }
    // A session that answered in 0.35 ms for a whole period, then in 20 ms: over the floor
    // and 57x both the tool's and its own healthy latency: slow.
    let slowed = call("slowed", "cache_get", json!({"key": "k"}));
    for _ in 0..60 {
        send(&g, &slowed, Outcome::Ok, Duration::from_micros(350), start).await;
        tokio::time::advance(ms(500)).await;
    }
    let mut last = None;
    for _ in 0..30 {
        last = Some(send(&g, &slowed, Outcome::Ok, ms(20), start).await);
        tokio::time::advance(ms(500)).await;
    }
    assert!(last.unwrap().factor < 1.0, "{last:?}");
}

/// A session whose work is slow by nature (a new, cold query every call, 12x the tool's warm
/// latency), one call at a time with pauses and no errors, is not in distress: it is judged
/// against its own healthy latency too. It still pays for the backend time it holds: the
/// same cold calls three at a time run out of its budget.
#[tokio::test(start_paused = true)]
async fn work_slow_by_nature_is_not_distress_but_costs_the_time_it_holds() {
    let g = guard_of({
        let mut built = SessionConfig::default();
        built.base_budget = Positive::new(60.0).unwrap();
        built.burst = Positive::new(120.0).unwrap();
        built
    });
    let start = tokio::time::Instant::now();
    let scan = |session: &str, query: String| {
        call(session, "sql_scan", json!({"filter": query})).with_cost(10)
    };
    // Warm scans of another session teach the tool's healthy latency: 50 ms.
    for _ in 0..60 {
        send(
            &g,
            &scan("warm", "region = 1".into()),
            Outcome::Ok,
            ms(50),
            start,
        )
        .await;
        tokio::time::advance(ms(1000)).await;
    }
    // Novel work: a new cold scan (600 ms), then 1.9 s to read it. 10 units a call, and 110
    // more for the 550 ms past the norm: 48 units/s, under its budget.
    for i in 0..60 {
        let step = send(
            &g,
            &scan("novel", format!("q{i}")),
            Outcome::Ok,
            ms(600),
            start,
        )
        .await;
        assert!(step.admitted, "call {i}: {step:?}");
        assert_eq!(step.factor, 1.0, "call {i}: {step:?}");
        tokio::time::advance(ms(2500)).await;
    }
    let novel = g.summary(&SessionId::new("novel")).unwrap();
    assert_eq!(
        novel.entropy, 2.0,
        "four calls in its window, all new: {novel:?}"
    );
    assert_eq!(novel.score, 0.0, "{novel:?}");
    // The same cold scans, a new one every 200 ms (three running at once): 600 units/s; a
    // refused one waits its hint.
    let mut refused_at = None;
    for i in 0..60 {
        let c = scan("runaway", format!("q{i}"));
        g.accept(&c.session, &c.tenant);
        let wait = match g.admit(&c) {
            Ok(_) => {
                g.observe(&Observation {
                    call: &c,
                    outcome: Outcome::Ok,
                    service_time: ms(600),
                    response_bytes: 100,
                    queue_wait: Duration::ZERO,
                    at: tokio::time::Instant::now(),
                });
                ms(200)
            }
            Err(refusal) => {
                refused_at.get_or_insert(i);
                refusal.retry_after().max(ms(200))
            }
        };
        tokio::time::advance(wait).await;
    }
    // The burst pays for the first scan, 200 ms of refill (12 units) for the second's
    // weight; then it is 108 units in debt.
    assert_eq!(refused_at, Some(2));
    let runaway = g.summary(&SessionId::new("runaway")).unwrap();
    assert_eq!(
        runaway.score, 0.0,
        "refused by what it costs, not scored: {runaway:?}"
    );
}

/// The backend time a slow call is charged for is counted in healthy latencies, but never in
/// less than `latency_floor_ms` (5 ms): a 6 ms call of a 0.35 ms cache costs about 2.1 weights,
/// not 17.
#[tokio::test(start_paused = true)]
async fn the_time_of_a_call_on_a_fast_tool_is_counted_in_floors() {
    let g = guard_of({
        let mut built = SessionConfig::default();
        built.base_budget = Positive::new(1.0).unwrap();
        built.burst = Positive::new(10.0).unwrap();
        built
    });
    let start = tokio::time::Instant::now();
    let cache = |session: &str| call(session, "cache_get", json!({"key": "k"}));
    // A whole first period (30 s) of 0.35 ms calls: the tool's healthy latency.
    for _ in 0..40 {
        send(
            &g,
            &cache("warm"),
            Outcome::Ok,
            Duration::from_micros(350),
            start,
        )
        .await;
        tokio::time::advance(ms(1000)).await;
    }
    // One 6 ms call: 1 unit and (6 - 0.35) / 5 = 1.13 more; then, at the same instant, fast
    // calls of 1 unit each until the 10-unit bucket is spent.
    let noisy = cache("noisy");
    assert!(send(&g, &noisy, Outcome::Ok, ms(6), start).await.admitted);
    let mut admitted = 0;
    while send(&g, &noisy, Outcome::Ok, Duration::from_micros(350), start)
        .await
        .admitted
    {
        admitted += 1;
    }
    assert_eq!(admitted, 7, "10 - 2.13 = 7.87 units left");
}

/// One client can never change what another gets: a client flooding a tool with calls that
/// are fast (a cache hit, an empty table) does not become the tool's healthy latency, so a
/// session whose calls of it take their usual 200 ms is neither judged slow nor charged for
/// its time. The tool's healthy latency is the upper median of its clients' own.
#[tokio::test(start_paused = true)]
async fn a_client_flooding_fast_calls_does_not_make_everyone_else_slow() {
    let g = guard_of({
        let mut built = SessionConfig::default();
        built.base_budget = Positive::new(100.0).unwrap();
        built.burst = Positive::new(100.0).unwrap();
        built
    });
    let start = tokio::time::Instant::now();
    let scan = |session: &str| call(session, "sql_scan", json!({"table": "orders"})).with_cost(10);
    let (victim, flood) = (scan("victim"), scan("flood"));
    let mut refused = 0;
    for step in 0..3000u64 {
        // The flooder: a 1 ms scan every 10 ms, 100 units/s, its whole budget.
        send(&g, &flood, Outcome::Ok, ms(1), start).await;
        // The victim: a 200 ms scan a second, from 1 s on (the flooder taught the tool first).
        if step % 100 == 0 && step >= 100 {
            let s = send(&g, &victim, Outcome::Ok, ms(200), start).await;
            refused += usize::from(!s.admitted);
            assert_eq!(s.factor, 1.0, "step {step}: {s:?}");
        }
        tokio::time::advance(ms(10)).await;
    }
    assert_eq!(refused, 0);
    // Its own budget: 29 scans of 10 units over 29 s, never more than one burst; had each
    // been charged 199 weights for its 199 ms past a 1 ms norm, it would be refused.
    let v = g.summary(&SessionId::new("victim")).unwrap();
    assert_eq!((v.rejected, v.score), (0, 0.0), "{v:?}");
}

/// Calls on ids the server has not accepted share one vote on a tool's healthy latency,
/// whatever tenant they claim: a flood of fast calls under ever-new tenant names (here past
/// `max_sessions`, so none is accepted) is one client beside the accepted sessions.
#[tokio::test(start_paused = true)]
async fn unaccepted_ids_share_one_vote_on_a_tools_latency() {
    let g = guard_of({
        let mut built = SessionConfig::default();
        built.base_budget = Positive::new(100.0).unwrap();
        built.burst = Positive::new(100.0).unwrap();
        built.max_sessions = std::num::NonZeroUsize::new(2).unwrap();
        built
    });
    let start = tokio::time::Instant::now();
    let scan = |session: &str| call(session, "sql_scan", json!({"table": "orders"})).with_cost(10);
    let (victim, other) = (scan("victim"), scan("other"));
    for c in [&victim, &other] {
        assert!(g.accept(&c.session, &c.tenant));
    }
    let mut refused = 0;
    for step in 0..3000u64 {
        let flood = scan(&format!("made-up-{step}"))
            .with_tenant(stormgate::Tenant::new(format!("tenant-{step}")));
        assert!(g.admit(&flood).is_ok());
        g.observe(&Observation {
            call: &flood,
            outcome: Outcome::Ok,
            service_time: ms(1),
            response_bytes: 100,
            queue_wait: Duration::ZERO,
            at: tokio::time::Instant::now(),
        });
        if step % 100 == 0 && step >= 100 {
            for c in [&victim, &other] {
                refused += usize::from(!send(&g, c, Outcome::Ok, ms(200), start).await.admitted);
            }
        }
        tokio::time::advance(ms(10)).await;
    }
    assert_eq!(refused, 0);
    assert_eq!(g.len(), 2, "no made-up id was accepted");
}

/// Four sessions search, one call a second each, at 200 ms; from call 30 on, the backend
/// answers every call in 1.2 s (6x, for everyone at once), or, in the control run, only the
/// one session `alone`'s calls. Returns each session's lowest factor.
async fn slowdown(everyone: bool) -> Vec<(String, f64)> {
    let g = guard();
    let start = tokio::time::Instant::now();
    let mut lowest = vec![1.0f64; 4];
    for i in 0..60u64 {
        for (s, low) in lowest.iter_mut().enumerate() {
            let slow = i >= 30 && (everyone || s == 0);
            let c = call(
                &format!("s{s}"),
                "search",
                json!({"q": format!("q{}", i % 3)}),
            );
            let step = send(
                &g,
                &c,
                Outcome::Ok,
                ms(if slow { 1200 } else { 200 }),
                start,
            )
            .await;
            *low = low.min(step.factor);
        }
        tokio::time::advance(ms(1000)).await;
    }
    lowest
        .into_iter()
        .enumerate()
        .map(|(s, f)| (format!("s{s}"), f))
        .collect()
}

/// Slowness the backend shows to every session at once is the backend's (the global budget
/// owns it): no session is penalised for it, beyond a dip of the first sessions to see it
/// (their calls are judged before the others' show it: 0.88 for one round). The same slowness
/// on one session alone is its own, and cuts it.
#[tokio::test(start_paused = true)]
async fn a_slowdown_everyone_sees_penalises_no_session() {
    let everyone = slowdown(true).await;
    assert!(everyone.iter().all(|(_, f)| *f >= 0.85), "{everyone:?}");
    let alone = slowdown(false).await;
    assert!(alone[0].1 < 0.5, "the slow session alone is cut: {alone:?}");
    assert!(alone[1..].iter().all(|(_, f)| *f >= 0.9), "{alone:?}");
}

/// A client whose calls the budget refuses before they reach the guard is judged by how it
/// treats those refusals (the classifier tells the guard of them): calling every 20 ms through
/// 1 s waits, one caller (never two calls in flight), each call from its 5th on arrives while
/// its last 4 waits ([`HINTS_CALLERS`](stormgate::entropy::HINTS_CALLERS)) are all ahead and is
/// counted as ignoring them; past the allowance of 16 such calls (decaying over the 10 s
/// window: at its 21st call) it scores, and once it reaches the guard its budget is cut to a
/// storm's and it is refused `session_storm`. The same calls spaced by their waits score 0.
#[tokio::test(start_paused = true)]
async fn a_client_calling_through_the_budgets_refusals_is_scored() {
    use stormgate::{Reason, Rejection, Scope};
    let g = guard();
    let refusal = Rejection::new(Reason::GlobalBudgetExceeded, Scope::Global, ms(1000));
    let through = call("through", "search", json!({"q": "x"}));
    let waiting = call("waiting", "search", json!({"q": "x"}));
    g.accept(&through.session, &through.tenant);
    g.accept(&waiting.session, &waiting.tenant);
    let score = |c: &Call| g.summary(&c.session).unwrap().score;
    for i in 1..=200 {
        g.refused(&through, &refusal);
        if i < 21 {
            assert_eq!(score(&through), 0.0, "call {i}: within the allowance");
        } else {
            assert!(score(&through) > 0.0, "call {i}: past it");
        }
        tokio::time::advance(ms(20)).await;
    }
    assert!(
        g.admit(&through).is_ok(),
        "one call's tokens are always there"
    );
    assert!(g.summary(&through.session).unwrap().factor < 0.5);
    let err = g.admit(&through).unwrap_err();
    assert_eq!(
        (err.reason(), err.scope()),
        (Reason::SessionStorm, Scope::AgentSession)
    );
    for _ in 0..60 {
        g.refused(&waiting, &refusal);
        tokio::time::advance(ms(1000)).await;
    }
    assert_eq!(score(&waiting), 0.0);
    assert!(g.admit(&waiting).is_ok());
    assert_eq!(g.summary(&waiting.session).unwrap().factor, 1.0);
}

#[tokio::test(start_paused = true)]
async fn a_call_is_judged_at_the_instant_its_stage_admits_it() {
    // 2 calls/s, a burst of 4: the clock never moves here, only the instants given.
    let g = guard();
    let c = call("s", "search", json!({"q": "x"}));
    assert!(g.accept(&c.session, &c.tenant));
    let t0 = tokio::time::Instant::now();
    for _ in 0..4 {
        assert!(g.admit_at(&c, t0).is_ok());
    }
    let refused = g.admit_at(&c, t0).unwrap_err();
    assert_eq!(refused.retry_after(), ms(500), "one call's refill at 2/s");
    // Half a second later by the instant given: one call's tokens are back.
    assert!(g.admit_at(&c, t0 + ms(500)).is_ok());
    assert!(g.admit_at(&c, t0 + ms(500)).is_err());
    // `admit` reads the clock, which still says t0: nothing more refilled.
    assert!(g.admit(&c).is_err());
}
