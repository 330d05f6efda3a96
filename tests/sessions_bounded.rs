//! Bounded session state: a million idle sessions are all swept after the TTL, the cap holds
//! at insert time, a busy session survives a flood of accepted sessions, and ids the server
//! never accepted are not stored at all; the newcomer places go to ids that come back as told
//! (a trial call when their tenant's unverified pool refuses them), none to ids made up per
//! call; calls before their wait are charged apart from the pool.

use std::time::Duration;
use stormgate::valid::{AtLeastOne, NonZeroDuration, Positive};

use stormgate::admit::Admission;
use stormgate::entropy::{SessionConfig, SessionGuard};
use stormgate::outcome::{Observation, Observer, Outcome};
use stormgate::{Call, SessionId, Tenant};

/// Accepts `session` as the server would (it answered a call on it).
fn accept(g: &SessionGuard, session: &str) -> bool {
    g.accept(&SessionId::new(session), &Tenant::anonymous())
}

fn call(session: &str) -> Call {
    Call::request("tools/call")
        .with_tool("search")
        .with_session(SessionId::new(session))
        .with_arguments(r#"{"q":"x"}"#)
}

#[tokio::test(start_paused = true)]
async fn a_million_idle_sessions_are_all_swept_after_the_ttl() {
    let g = SessionGuard::new({
        let mut built = SessionConfig::default();
        built.max_sessions = std::num::NonZeroUsize::new(1_000_000).unwrap();
        built.new_session_burst = AtLeastOne::new(2e6).unwrap();
        built.idle_ttl = NonZeroDuration::new(Duration::from_secs(300)).unwrap();
        built
    })
    .unwrap();
    for i in 0..1_000_000 {
        assert!(accept(&g, &format!("s{i}")));
        g.admit(&call(&format!("s{i}"))).unwrap();
    }
    assert_eq!(g.len(), 1_000_000);
    tokio::time::advance(Duration::from_secs(299)).await;
    assert_eq!(g.sweep(), 0, "not idle long enough");
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(g.sweep(), 1_000_000);
    assert!(g.is_empty());
}

#[tokio::test(start_paused = true)]
async fn the_cap_holds_and_a_busy_session_survives_a_flood() {
    let g = SessionGuard::new({
        let mut built = SessionConfig::default();
        built.max_sessions = std::num::NonZeroUsize::new(1000).unwrap();
        built.idle_ttl = NonZeroDuration::new(Duration::from_secs(60)).unwrap();
        built.base_budget = Positive::new(1000.0).unwrap();
        built.burst = Positive::new(1000.0).unwrap();
        built.new_session_burst = AtLeastOne::new(1e6).unwrap();
        built
    })
    .unwrap();
    let busy = call("busy");
    assert!(accept(&g, "busy"));
    g.admit(&busy).unwrap();
    for i in 0..100_000 {
        accept(&g, &format!("random-{i}"));
        let _ = g.admit(&call(&format!("random-{i}")));
        if i % 1000 == 0 {
            tokio::time::advance(Duration::from_millis(500)).await;
            g.admit(&busy).unwrap(); // the busy session keeps working
            g.sweep();
        }
        assert!(g.len() <= 1000, "the cap holds at insert time");
    }
    // 50 s passed: the flood's first sessions are idle, the busy one is not.
    tokio::time::advance(Duration::from_secs(30)).await;
    g.admit(&busy).unwrap();
    g.sweep();
    assert!(
        g.summary(&SessionId::new("busy")).is_some(),
        "the busy session is tracked"
    );
    assert!(
        g.summary(&SessionId::new("random-5")).is_none(),
        "idle flood sessions are gone"
    );
}

#[tokio::test(start_paused = true)]
async fn ids_the_server_never_accepted_are_not_stored() {
    let g = SessionGuard::new(SessionConfig::default()).unwrap();
    assert!(accept(&g, "real"));
    for i in 0..200_000 {
        let _ = g.admit(&call(&format!("random-{i}")));
    }
    assert_eq!(g.len(), 1, "only the accepted session");
    assert_eq!(g.pools(), 1, "the flood is one pool: its tenant's");
    assert!(g.summary(&SessionId::new("random-7")).is_none());
    assert_eq!(
        g.unverified(&Tenant::anonymous()).unwrap().calls,
        200_000,
        "every call of the flood was charged to the pool"
    );
}

#[tokio::test(start_paused = true)]
async fn a_tenant_starts_new_sessions_at_its_newcomer_rate() {
    let g = SessionGuard::new({
        let mut built = SessionConfig::default();
        built.new_session_burst = AtLeastOne::new(10.0).unwrap();
        built.new_session_rate = Positive::new(0.2).unwrap();
        built
    })
    .unwrap();
    let accepted = (0..100).filter(|i| accept(&g, &format!("n{i}"))).count();
    assert_eq!(accepted, 10, "the allowance");
    tokio::time::advance(Duration::from_secs(5)).await;
    let accepted = (100..200).filter(|i| accept(&g, &format!("n{i}"))).count();
    assert_eq!(accepted, 1, "one more per 5 s");
    let other = SessionId::new("elsewhere");
    assert!(
        g.accept(&other, &Tenant::new("other-tenant")),
        "another tenant's allowance is its own"
    );
}

/// The server answered `call` with success.
fn answered(g: &SessionGuard, call: &Call) {
    g.observe(&Observation {
        call,
        outcome: Outcome::Ok,
        service_time: Duration::from_millis(10),
        response_bytes: 100,
        queue_wait: Duration::ZERO,
        at: tokio::time::Instant::now(),
    });
}

/// A guard whose pools hold 10 calls (refilled at 2 a second on probation), with 3 newcomer
/// places per tenant, one more every 10 s.
fn small_pools() -> SessionGuard {
    SessionGuard::new({
        let mut built = SessionConfig::default();
        built.base_budget = Positive::new(10.0).unwrap();
        built.burst = Positive::new(10.0).unwrap();
        built.new_session_burst = AtLeastOne::new(3.0).unwrap();
        built.new_session_rate = Positive::new(0.1).unwrap();
        built
    })
    .unwrap()
}

/// Spends the tenant's pool with calls on ids made up per call; returns how many it admitted.
fn spend(g: &SessionGuard, from: usize) -> usize {
    (from..)
        .map_while(|i| g.admit(&call(&format!("made-up-{i}"))).ok())
        .count()
}

/// The refusal of a call on `session`: its wait, ms.
#[track_caller]
fn refused_for(g: &SessionGuard, session: &str) -> u128 {
    g.admit(&call(session))
        .map(drop)
        .expect_err("refused")
        .retry_after()
        .as_millis()
}

/// A new client whose tenant's unverified pool is spent (another unaccepted client calling
/// through its refusals) is refused its first call for the shortest wait a trial is offered
/// after (100 ms), and coming back then, has its trial: the server's success on it accepts the
/// id, and its next calls are its own session's. Before, its first call was its trial; a
/// client refused there was told the pool's wait (35 s in a storm).
#[tokio::test(start_paused = true)]
async fn a_new_client_that_comes_back_as_told_has_its_trial_when_its_tenants_pool_refuses() {
    let g = small_pools();
    let mut held = Vec::new();
    // "busy", never accepted, spends the pool and takes one trial (a place) of its own: it
    // was told nothing before its first refused call.
    let refused = (0..100)
        .filter(|_| match g.admit(&call("busy")) {
            Ok(permit) => {
                held.push(permit);
                false
            }
            Err(_) => true,
        })
        .count();
    assert_eq!(refused, 100 - 10 - 1, "the pool's 10 and busy's one trial");
    assert_eq!(refused_for(&g, "newcomer"), 100, "a new id: told 100 ms");
    tokio::time::advance(Duration::from_millis(99)).await;
    assert_eq!(refused_for(&g, "newcomer"), 100, "back early: no trial");
    tokio::time::advance(Duration::from_millis(100)).await;
    let first = call("newcomer");
    let permit = g.admit(&first).expect("back as told: its trial");
    answered(&g, &first);
    drop(permit);
    assert!(
        g.is_tracked(&SessionId::new("newcomer")),
        "accepted on success"
    );
    let second = call("newcomer");
    g.admit(&second)
        .expect("its next call is its own session's, not the spent pool's");
    assert!(
        !g.is_tracked(&SessionId::new("busy")),
        "busy's trial is still out"
    );
}

/// A tenant's newcomer places go only to ids that come back as told: ids made up per call,
/// admitted by the pool or refused, answered with success or not, take none (before, 3 of them
/// took the places at once, and one more each 10 s); ids that come back after their waits
/// have their trials, no more than the places, one more per `1 / new_session_rate` (an id
/// past them is told when the next is there); an id gets one trial; a trial whose call is refused by a later stage or never ran (refunded)
/// gives its place back, and one that ended without success spends it.
#[tokio::test(start_paused = true)]
async fn newcomer_places_go_only_to_ids_that_come_back_as_told() {
    let g = small_pools();
    let admitted = (0..1000)
        .filter_map(|i| {
            let made_up = call(&format!("made-up-{i}"));
            let permit = g.admit(&made_up).ok()?;
            answered(&g, &made_up);
            Some(permit)
        })
        .count();
    assert_eq!(admitted, 10, "the pool's 10, no trial");
    assert_eq!(g.len(), 0, "no made-up id accepted on its success");
    let told: Vec<u128> = (0..5)
        .map(|i| refused_for(&g, &format!("back-{i}")))
        .collect();
    assert_eq!(told, [100; 5], "each told to come back in 100 ms");
    tokio::time::advance(Duration::from_millis(100)).await;
    spend(&g, 1000);
    let mut held = Vec::new();
    for i in 0..3 {
        held.push(
            g.admit(&call(&format!("back-{i}")))
                .expect("back as told: a trial"),
        );
    }
    let next = refused_for(&g, "back-3");
    assert!(
        (9_999..=10_000).contains(&next),
        "no place left: told when the next is there ({next} ms)"
    );
    tokio::time::advance(Duration::from_millis(next as u64 + 1)).await;
    spend(&g, 2000);
    let trial = g.admit(&call("back-3")).expect("the refilled place");
    assert!(g.admit(&call("back-3")).is_err(), "its trial is out");
    // Refunded: the place is back, for another id.
    g.refund(trial);
    let again = g.admit(&call("back-4")).expect("the refunded place");
    // Ended without success: spent, and the id has had its trial.
    drop(again);
    tokio::time::advance(Duration::from_secs(10)).await;
    spend(&g, 4000);
    assert!(g.admit(&call("back-4")).is_err(), "its one trial is over");
    assert!(
        g.admit(&call("back-3")).is_ok(),
        "its refunded trial, on the next place"
    );
    assert_eq!(g.len(), 0, "nothing accepted: no trial succeeded");
}

/// Calls on an id not yet accepted that come before the wait it was told are charged to the
/// pool's early state, whose bucket starts empty: a client calling through its refusals does
/// not spend what its tenant's pool refills for the tenant's new clients. "busy" is refused
/// once the pool is spent and then calls every 100 ms through its waits for 5 s, while the
/// pool refills (2 calls a second on probation; the early state as much, for busy); a new
/// client then has its first call answered.
/// Charged to the pool itself, busy's calls took each refilled token and the new client was
/// refused.
#[tokio::test(start_paused = true)]
async fn calls_before_their_wait_do_not_spend_the_pool_for_new_clients() {
    let g = small_pools();
    let mut held = Vec::new();
    while let Ok(permit) = g.admit(&call("busy")) {
        held.push(permit);
    }
    for _ in 0..50 {
        tokio::time::advance(Duration::from_millis(100)).await;
        if let Ok(permit) = g.admit(&call("busy")) {
            held.push(permit);
        }
    }
    g.admit(&call("newcomer"))
        .expect("the pool refilled for the tenant's new clients");
}
