//! The FIFO limiter against tokio's Semaphore and tower's ConcurrencyLimit, same workloads,
//! same run: `cargo bench --bench fifo`.

use std::convert::Infallible;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use stormgate::fifo::{ResourceLimiter, ResourceLimits};
use tokio::runtime::Runtime;
use tokio::sync::Semaphore;
use tower::limit::ConcurrencyLimit;
use tower::{Service, ServiceExt};

const PERMITS: usize = 8;
const WAITERS: usize = 64;
const ROUNDS: usize = 50;

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap()
}

fn limiter() -> ResourceLimiter {
    ResourceLimiter::builder()
        .key(
            "db",
            ResourceLimits::default().max_concurrent(NonZeroUsize::new(PERMITS).unwrap()),
        )
        .build()
}

fn instant_service() -> impl Service<
    (),
    Response = (),
    Error = Infallible,
    Future = std::future::Ready<Result<(), Infallible>>,
> + Clone {
    tower::service_fn(|()| std::future::ready(Ok::<_, Infallible>(())))
}

fn uncontended(c: &mut Criterion) {
    let rt = runtime();
    let mut g = c.benchmark_group("uncontended acquire+release");
    let l = limiter();
    g.bench_function("stormgate ResourceLimiter", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let start = Instant::now();
                for _ in 0..iters {
                    drop(l.acquire("db", None).await.unwrap());
                }
                start.elapsed()
            })
        })
    });
    let sem = Semaphore::new(PERMITS);
    g.bench_function("tokio Semaphore", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let start = Instant::now();
                for _ in 0..iters {
                    drop(sem.acquire().await.unwrap());
                }
                start.elapsed()
            })
        })
    });
    let mut svc = ConcurrencyLimit::new(instant_service(), PERMITS);
    g.bench_function("tower ConcurrencyLimit", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let start = Instant::now();
                for _ in 0..iters {
                    svc.ready().await.unwrap().call(()).await.unwrap();
                }
                start.elapsed()
            })
        })
    });
    g.finish();
}

/// `WAITERS` tasks, each taking a place `ROUNDS` times and yielding once while holding it.
fn contended(c: &mut Criterion) {
    let rt = runtime();
    let mut g = c.benchmark_group("contended: 64 waiters, 8 places, 50 rounds each");
    g.sample_size(20).measurement_time(Duration::from_secs(5));
    g.bench_function("stormgate ResourceLimiter", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let l = limiter();
                    let start = Instant::now();
                    let tasks: Vec<_> = (0..WAITERS)
                        .map(|_| {
                            let l = l.clone();
                            tokio::spawn(async move {
                                for _ in 0..ROUNDS {
                                    let lease = l.acquire("db", None).await.unwrap();
                                    tokio::task::yield_now().await;
                                    drop(lease);
                                }
                            })
                        })
                        .collect();
                    for t in tasks {
                        t.await.unwrap();
                    }
                    total += start.elapsed();
                }
                total
            })
        })
    });
    g.bench_function("tokio Semaphore", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let sem = Arc::new(Semaphore::new(PERMITS));
                    let start = Instant::now();
                    let tasks: Vec<_> = (0..WAITERS)
                        .map(|_| {
                            let sem = sem.clone();
                            tokio::spawn(async move {
                                for _ in 0..ROUNDS {
                                    let permit = sem.acquire().await.unwrap();
                                    tokio::task::yield_now().await;
                                    drop(permit);
                                }
                            })
                        })
                        .collect();
                    for t in tasks {
                        t.await.unwrap();
                    }
                    total += start.elapsed();
                }
                total
            })
        })
    });
    g.bench_function("tower ConcurrencyLimit", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let svc = ConcurrencyLimit::new(
                        tower::service_fn(|()| async {
                            tokio::task::yield_now().await;
                            Ok::<_, Infallible>(())
                        }),
                        PERMITS,
                    );
                    let start = Instant::now();
                    let tasks: Vec<_> = (0..WAITERS)
                        .map(|_| {
                            let mut svc = svc.clone();
                            tokio::spawn(async move {
                                for _ in 0..ROUNDS {
                                    svc.ready().await.unwrap().call(()).await.unwrap();
                                }
                            })
                        })
                        .collect();
                    for t in tasks {
                        t.await.unwrap();
                    }
                    total += start.elapsed();
                }
                total
            })
        })
    });
    g.finish();
}

criterion_group!(benches, uncontended, contended);
criterion_main!(benches);
