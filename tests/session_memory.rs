//! Bytes per tracked session, counted by an instrumented global allocator (live heap bytes).
//! The README quotes the figure this test pins.

use std::alloc::System;
use stormgate::valid::AtLeastOne;

use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};
use stormgate::admit::Admission;
use stormgate::entropy::{SessionConfig, SessionGuard};
use stormgate::outcome::{Observation, Observer, Outcome};
use stormgate::{Call, SessionId};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

#[test]
fn bytes_per_tracked_session() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let _enter = rt.enter();
    let g = SessionGuard::new({
        let mut built = SessionConfig::default();
        built.new_session_burst = AtLeastOne::new(1e6).unwrap();
        built
    })
    .unwrap();
    let n = 100_000;
    // Session ids and calls are made first, so only the guard's own state is counted.
    let calls: Vec<Call> = (0..n)
        .map(|i| {
            Call::request("tools/call")
                .with_tool("search")
                .with_session(SessionId::new(format!("session-{i:08}")))
                .with_arguments(r#"{"q":"x"}"#)
        })
        .collect();
    let region = Region::new(GLOBAL);
    for c in &calls {
        assert!(g.accept(&c.session, &c.tenant));
        g.admit(c).unwrap();
    }
    let stats = region.change();
    let live =
        stats.bytes_allocated as isize - stats.bytes_deallocated as isize + stats.bytes_reallocated;
    let per_session = live as f64 / n as f64;
    // One call each: the session's window (one bucket, one key), health, budget, how it
    // treats its refusals (the waits of its last 16: 128 bytes), and its share of the sharded
    // map.
    assert!(
        per_session < 800.0,
        "{per_session:.0} bytes per session (docs/sessions.md: 782)"
    );
    assert!(
        per_session > 200.0,
        "{per_session:.0} bytes per session: is anything counted?"
    );
    println!("bytes per tracked session: {per_session:.0}");

    // Once each session has finished that call, it also holds its own healthy latency for
    // the tool (`stats::OwnBaselines`, room for four tools).
    let region = Region::new(GLOBAL);
    for c in &calls {
        g.observe(&Observation {
            call: c,
            outcome: Outcome::Ok,
            service_time: std::time::Duration::from_millis(50),
            response_bytes: 100,
            queue_wait: std::time::Duration::ZERO,
            at: tokio::time::Instant::now(),
        });
    }
    let stats = region.change();
    let live =
        stats.bytes_allocated as isize - stats.bytes_deallocated as isize + stats.bytes_reallocated;
    let own = live as f64 / n as f64;
    assert!(
        own <= 400.0,
        "{own:.0} more bytes per session with a finished call (README: 320)"
    );
    assert!(own > 0.0, "{own:.0} bytes: is anything counted?");
    println!("more bytes per session with a finished call: {own:.0}");
}
