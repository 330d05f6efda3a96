//! Per-call cost of the session guard with 1 000, 100 000 and 1 000 000 tracked (accepted)
//! sessions, calls spread over all of them and one busy session among them:
//! `cargo bench --bench sessions`. Also the resource key of large arguments.

use std::hint::black_box;
use stormgate::valid::{AtLeastOne, Positive};

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use stormgate::admit::Admission;
use stormgate::entropy::{SessionConfig, SessionGuard};
use stormgate::{Call, SessionId};

/// A guard tracking `sessions` sessions (one call each) and a call to reuse.
fn populated(sessions: usize) -> (SessionGuard, Call) {
    let guard = SessionGuard::new({
        let mut built = SessionConfig::default();
        built.base_budget = Positive::new(1e12).unwrap();
        built.burst = Positive::new(1e12).unwrap();
        built.max_sessions = std::num::NonZeroUsize::new(2_000_000).unwrap();
        built.new_session_burst = AtLeastOne::new(1e7).unwrap();
        built
    })
    .unwrap();
    let mut call = Call::request("tools/call")
        .with_tool("search")
        .with_arguments(r#"{"query":"q1"}"#);
    for i in 0..sessions {
        call.session = SessionId::new(i.to_string());
        assert!(guard.accept(&call.session, &call.tenant));
        guard.admit(&call).unwrap();
    }
    (guard, call)
}

fn guard_per_call(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let _enter = rt.enter();
    let mut g = c.benchmark_group("session guard, per call");
    for sessions in [1_000usize, 100_000, 1_000_000] {
        let (guard, mut call) = populated(sessions);
        // Calls go to sessions in a scrambled order (a stride coprime with the count). Each
        // iteration builds the session id (one small allocation, the same at every size), so
        // only the guard's own state grows with the number of sessions.
        let mut i = 0usize;
        g.bench_with_input(BenchmarkId::from_parameter(sessions), &sessions, |b, &n| {
            b.iter(|| {
                i = (i + 7919) % n;
                call.session = SessionId::new(i.to_string());
                black_box(guard.admit(&call).is_ok())
            })
        });
    }
    g.finish();
}

/// One busy session among N tracked ones: what the number of sessions itself costs a call.
fn busy_session_among(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let _enter = rt.enter();
    let mut g = c.benchmark_group("session guard, one busy session among N");
    for sessions in [1_000usize, 100_000, 1_000_000] {
        let (guard, mut call) = populated(sessions);
        g.bench_with_input(BenchmarkId::from_parameter(sessions), &sessions, |b, _| {
            b.iter(|| {
                call.session = SessionId::new("17");
                black_box(guard.admit(&call).is_ok())
            })
        });
    }
    g.finish();
}

/// The resource key of a call with 4 MiB of arguments and of one with 100 bytes, against
/// parsing the arguments into a `serde_json::Value` tree (the plain way, which the guard
/// avoids).
fn resource_key_of_large_arguments(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let _enter = rt.enter();
    let guard = SessionGuard::new(SessionConfig::default()).unwrap();
    let mut g = c.benchmark_group("resource key");
    for (name, len) in [("100 B", 100usize), ("4 MiB", 4 << 20)] {
        let args = format!(r#"{{"query":"{}","top_k":5}}"#, "x".repeat(len));
        let call = Call::request("tools/call")
            .with_tool("search")
            .with_arguments(&args);
        g.bench_function(BenchmarkId::new("stormgate", name), |b| {
            b.iter(|| black_box(guard.resource_key(&call)))
        });
        g.bench_function(BenchmarkId::new("serde_json::Value tree", name), |b| {
            b.iter(|| black_box(serde_json::from_str::<serde_json::Value>(&args).unwrap()))
        });
    }
    g.finish();
}

criterion_group!(
    benches,
    guard_per_call,
    busy_session_among,
    resource_key_of_large_arguments
);
criterion_main!(benches);
