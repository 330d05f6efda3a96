//! Per-call cost of the session guard with 1 000, 100 000 and 1 000 000 tracked sessions:
//! `cargo bench --bench sessions`.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use stormgate::admit::Admission;
use stormgate::entropy::{SessionConfig, SessionGuard};
use stormgate::{Call, SessionId};

fn guard_per_call(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let _enter = rt.enter();
    let mut g = c.benchmark_group("session guard, per call");
    for sessions in [1_000usize, 100_000, 1_000_000] {
        let guard = SessionGuard::new(SessionConfig {
            base_budget: 1e12,
            burst: 1e12,
            max_sessions: 2_000_000,
            ..SessionConfig::default()
        })
        .unwrap();
        let calls: Vec<Call> = (0..sessions)
            .map(|i| {
                Call::request("tools/call")
                    .with_tool("search")
                    .with_session(SessionId::new(format!("session-{i}")))
                    .with_arguments(&format!(r#"{{"query":"q{}"}}"#, i % 7))
            })
            .collect();
        for call in &calls {
            guard.admit(call).unwrap();
        }
        // Calls go to sessions in a scrambled order (a stride coprime with the count).
        let mut i = 0usize;
        g.bench_with_input(BenchmarkId::from_parameter(sessions), &sessions, |b, &n| {
            b.iter(|| {
                i = (i + 7919) % n;
                black_box(guard.admit(&calls[i]).is_ok())
            })
        });
    }
    g.finish();
}

criterion_group!(benches, guard_per_call);
criterion_main!(benches);
