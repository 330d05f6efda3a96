//! What sharing the budget through Redis adds to an admitted call, and how often a node talks to
//! Redis: `cargo bench --features redis --bench redis`. Starts its own `redis-server` on a free
//! port.
//!
//! * criterion: one admission (global + tenant), local budget vs shared budget (leases);
//! * printed first: median and p99 of single admissions timed one by one (1 000 000 each),
//!   and Redis round trips per 1 000 admitted calls in steady state (nodes paced below the
//!   budget for 5 s, after 1 s of warm-up).

use std::hint::black_box;
use std::time::{Duration, Instant};
use stormgate::valid::{NonNegative, Positive};

use criterion::{Criterion, criterion_group, criterion_main};
use stormgate::admit::Admission;
use stormgate::budget::{Budget, BudgetConfig, TenantConfig};
use stormgate::distributed::{DistributedConfig, SharedBudget};
use stormgate::{Call, Tenant};

#[path = "../tests/redis_support/mod.rs"]
mod redis_support;

fn budget(rate: f64, shared: Option<SharedBudget>) -> Budget {
    let mut b = Budget::builder({
        let mut built = BudgetConfig::default();
        built.stable_budget = Positive::new(rate).unwrap();
        built
    })
    .tenants({
        let mut built = TenantConfig::default();
        built.min_budget = Some(NonNegative::new(0.0).unwrap());
        built
    });
    if let Some(s) = shared {
        b = b.shared(s);
    }
    b.build()
}

/// A node of the cluster `prefix`.
fn shared(rt: &tokio::runtime::Runtime, url: &str, prefix: &str, node: &str) -> SharedBudget {
    rt.block_on(async {
        let s = SharedBudget::new({
            let mut built = DistributedConfig::default();
            built.url = url.to_owned();
            built.prefix = prefix.to_owned();
            built.node_id = Some(node.to_owned());
            built
        })
        .unwrap();
        assert!(
            s.ready(Duration::from_secs(3)).await,
            "Redis did not answer"
        );
        s
    })
}

fn call() -> Call {
    Call::request("tools/call")
        .with_tool("search")
        .with_tenant(Tenant::new("t"))
}

/// Median and p99 of `n` admitted calls timed one by one, and the calls refused meanwhile
/// (the budget is huge; with leases, a call can still find its lease empty while the next one
/// is on its way).
fn percentiles(b: &Budget, n: usize) -> (Duration, Duration, usize) {
    let call = call();
    let mut times = Vec::with_capacity(n);
    let mut refused = 0;
    while times.len() < n {
        let t = Instant::now();
        let ok = b.admit(&call).is_ok();
        let took = t.elapsed();
        if ok {
            times.push(took);
        } else {
            refused += 1;
        }
    }
    times.sort();
    (times[n / 2], times[n * 99 / 100], refused)
}

/// Round trips per 1 000 admitted calls: `nodes` nodes sharing one budget, each offered
/// `per_node` calls per second (below its part of the budget), measured after a warm-up.
fn round_trips(rt: &tokio::runtime::Runtime, url: &str, nodes: usize, per_node: u32) -> f64 {
    let shareds: Vec<SharedBudget> = (0..nodes)
        .map(|i| shared(rt, url, &format!("steady-{nodes}"), &format!("node-{i}")))
        .collect();
    let budgets: Vec<Budget> = shareds
        .iter()
        .map(|s| budget(f64::from(per_node) * nodes as f64 * 2.0, Some(s.clone())))
        .collect();
    rt.block_on(async {
        let tickers: Vec<_> = budgets.iter().map(Budget::spawn_ticker).collect();
        let drive = |run: Duration| {
            let tasks: Vec<_> = budgets
                .iter()
                .map(|b| {
                    let b = b.clone();
                    tokio::spawn(async move {
                        let call = call();
                        let mut admitted = 0u64;
                        let every = Duration::from_secs(1) / per_node * 10;
                        let mut tick = tokio::time::interval(every);
                        let end = tokio::time::Instant::now() + run;
                        while tokio::time::Instant::now() < end {
                            tick.tick().await;
                            for _ in 0..10 {
                                admitted += u64::from(b.admit(&call).is_ok());
                            }
                        }
                        admitted
                    })
                })
                .collect();
            async move {
                let mut total = 0;
                for t in tasks {
                    total += t.await.unwrap();
                }
                total
            }
        };
        drive(Duration::from_secs(1)).await;
        let before: u64 = shareds.iter().map(|s| s.stats().round_trips).sum();
        let admitted = drive(Duration::from_secs(5)).await;
        let after: u64 = shareds.iter().map(|s| s.stats().round_trips).sum();
        for t in tickers {
            t.abort();
        }
        (after - before) as f64 * 1000.0 / admitted as f64
    })
}

fn benches(c: &mut Criterion) {
    let redis = redis_support::RedisServer::start();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let _guard = rt.enter();
    let local = budget(1e9, None);
    let leased = budget(1e9, Some(shared(&rt, &redis.url(), "latency", "node")));
    let _ = percentiles(&local, 100_000); // warm both up
    let _ = percentiles(&leased, 100_000);
    let (lm, lp, _) = percentiles(&local, 1_000_000);
    let (sm, sp, refused) = percentiles(&leased, 1_000_000);
    println!("admission, timed one by one (1 000 000 admitted calls each):");
    println!("  local budget:  median {lm:?}, p99 {lp:?}");
    println!(
        "  shared budget: median {sm:?}, p99 {sp:?} (added: median {:?}, p99 {:?}); \
         {refused} calls found the lease empty meanwhile",
        sm.saturating_sub(lm),
        sp.saturating_sub(lp)
    );
    for nodes in [1, 3] {
        let rt_per_1000 = round_trips(&rt, &redis.url(), nodes, 2000);
        println!(
            "steady state, {nodes} node(s) at 2000 calls/s each (budget twice the demand): \
             {rt_per_1000:.2} Redis round trips per 1000 admitted calls"
        );
    }

    let call = call();
    let mut g = c.benchmark_group("admission (global + tenant), per call");
    g.bench_function("local budget", |b| {
        b.iter(|| black_box(local.admit(&call).is_ok()))
    });
    g.bench_function("shared budget (Redis leases)", |b| {
        b.iter(|| black_box(leased.admit(&call).is_ok()))
    });
    g.finish();
}

criterion_group!(redis_benches, benches);
criterion_main!(redis_benches);
