//! Per-call cost of the global + tenant admission with 1, 100 and 10 000 tenants, and of
//! recording one outcome, from one thread and from two at once: `cargo bench --bench budget`.

use std::hint::black_box;
use std::time::Duration;
use stormgate::valid::{NonNegative, Positive};

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use stormgate::admit::Admission;
use stormgate::budget::{Budget, BudgetConfig, TenantConfig};
use stormgate::outcome::{Observation, Observer, Outcome};
use stormgate::{Call, Tenant};

fn budget() -> Budget {
    Budget::builder({
        let mut built = BudgetConfig::default(); // Large enough never to refuse: the cost of the decision itself is measured.
        built.stable_budget = Positive::new(1e12).unwrap();
        built
    })
    .tenants({
        let mut built = TenantConfig::default();
        built.min_budget = Some(NonNegative::new(1e6).unwrap());
        built.max_tenants = std::num::NonZeroUsize::new(100_000).unwrap();
        built
    })
    .build()
}

fn admission(c: &mut Criterion) {
    let mut g = c.benchmark_group("budget admission (global + tenant), per call");
    for tenants in [1usize, 100, 10_000] {
        let b = budget();
        let calls: Vec<Call> = (0..tenants)
            .map(|i| {
                Call::request("tools/call")
                    .with_tool("search")
                    .with_tenant(Tenant::new(format!("tenant-{i}")))
            })
            .collect();
        for call in &calls {
            let _ = b.admit(call); // every tenant exists before measuring
        }
        b.tick();
        let mut i = 0;
        g.bench_with_input(
            BenchmarkId::from_parameter(tenants),
            &tenants,
            |bench, _| {
                bench.iter(|| {
                    i = (i + 1) % calls.len();
                    black_box(b.admit(&calls[i]).is_ok())
                })
            },
        );
    }
    g.finish();
}

fn outcome(c: &mut Criterion) {
    let b = budget();
    let call = Call::request("tools/call").with_tool("search");
    let observation = Observation {
        call: &call,
        outcome: Outcome::Ok,
        service_time: Duration::from_millis(12),
        response_bytes: 512,
        queue_wait: Duration::ZERO,
        at: tokio::time::Instant::now(),
    };
    let mut n = 0u64;
    c.bench_function("budget: record one outcome", |bench| {
        bench.iter(|| {
            b.observe(black_box(&observation));
            n += 1;
            if n.is_multiple_of(100_000) {
                b.tick(); // keep the tick's histogram as it is in service
            }
        })
    });
}

/// Two threads recording outcomes at once, each for its own session and tool (so only what
/// the budget shares between calls is shared): what a second tokio worker costs the first.
fn outcome_two_threads(c: &mut Criterion) {
    let b = budget();
    let calls: Vec<Call> = (0..2)
        .map(|i| {
            Call::request("tools/call")
                .with_tool(format!("search-{i}").as_str())
                .with_session(stormgate::SessionId::new(format!("s-{i}")))
        })
        .collect();
    c.bench_function("budget: record one outcome, two threads at once", |bench| {
        bench.iter_custom(|iters| {
            let start = std::sync::Barrier::new(2);
            let took: Vec<Duration> = std::thread::scope(|s| {
                let workers: Vec<_> = calls
                    .iter()
                    .map(|call| {
                        let (b, start) = (&b, &start);
                        s.spawn(move || {
                            let observation = Observation {
                                call,
                                outcome: Outcome::Ok,
                                service_time: Duration::from_millis(12),
                                response_bytes: 512,
                                queue_wait: Duration::ZERO,
                                at: tokio::time::Instant::now(),
                            };
                            start.wait();
                            let t = std::time::Instant::now();
                            for _ in 0..iters {
                                b.observe(black_box(&observation));
                            }
                            t.elapsed()
                        })
                    })
                    .collect();
                workers.into_iter().map(|w| w.join().unwrap()).collect()
            });
            b.tick();
            // Per outcome of one thread: the slower thread's time over its outcomes.
            took.into_iter().max().unwrap()
        })
    });
}

criterion_group!(benches, admission, outcome, outcome_two_threads);
criterion_main!(benches);
