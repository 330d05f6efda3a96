//! The FIFO limiter's core, under paused tokio time: every figure here is exact.

use std::num::{NonZeroU32, NonZeroUsize};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use stormgate::valid::NonZeroDuration;

use stormgate::fifo::{AcquireError, MAX_KEY_LEN, ResourceLimiter, ResourceLimits, WindowLimit};
use tokio::time::Instant;

const KEY: &str = "db";

fn nz(n: usize) -> NonZeroUsize {
    NonZeroUsize::new(n).unwrap()
}

fn limiter(limits: ResourceLimits) -> ResourceLimiter {
    ResourceLimiter::builder().key(KEY, limits).build()
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Lets spawned tasks run until `cond` holds.
async fn until(mut cond: impl FnMut() -> bool) {
    for _ in 0..10_000 {
        if cond() {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("condition never held");
}

/// Who was admitted when: `(index, admitted at - start)`.
type AdmissionLog = Arc<Mutex<Vec<(usize, Duration)>>>;

/// Spawns `n` acquirers that record `(index, admitted at - start)` and release at once.
fn spawn_recorders(
    limiter: &ResourceLimiter,
    n: usize,
    start: Instant,
) -> (AdmissionLog, Vec<tokio::task::JoinHandle<()>>) {
    let log = Arc::new(Mutex::new(Vec::new()));
    let handles = (0..n)
        .map(|i| {
            let (limiter, log) = (limiter.clone(), log.clone());
            tokio::spawn(async move {
                let lease = limiter.acquire(KEY, None).await.unwrap();
                log.lock().unwrap().push((i, start.elapsed()));
                drop(lease);
            })
        })
        .collect();
    (log, handles)
}

#[tokio::test(start_paused = true)]
async fn fifo_order_with_1000_waiters() {
    let limiter = limiter(ResourceLimits::default().max_concurrent(nz(1)));
    let gate = limiter.acquire(KEY, None).await.unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut handles = Vec::new();
    for i in 0..1000 {
        let (l, log) = (limiter.clone(), log.clone());
        handles.push(tokio::spawn(async move {
            let lease = l.acquire(KEY, None).await.unwrap();
            log.lock().unwrap().push(i);
            drop(lease);
        }));
        // Queue them one by one, so the spawn order is the arrival order.
        until(|| limiter.queue_depth(KEY) == i + 1).await;
    }
    drop(gate);
    for h in handles {
        h.await.unwrap();
    }
    assert_eq!(*log.lock().unwrap(), (0..1000).collect::<Vec<_>>());
    assert_eq!(limiter.in_flight(KEY), 0);
    assert_eq!(limiter.queue_depth(KEY), 0);
}

#[tokio::test(start_paused = true)]
async fn pacing_spacing_is_exact_to_the_millisecond() {
    let limiter = limiter(ResourceLimits::default().min_interval(ms(3000)));
    let start = Instant::now();
    let (log, handles) = spawn_recorders(&limiter, 5, start);
    for h in handles {
        h.await.unwrap();
    }
    let log = log.lock().unwrap();
    let times: Vec<Duration> = log.iter().map(|(_, t)| *t).collect();
    assert_eq!(times, [0, 3000, 6000, 9000, 12000].map(ms));
    assert_eq!(
        log.iter().map(|(i, _)| *i).collect::<Vec<_>>(),
        [0, 1, 2, 3, 4]
    );
}

#[tokio::test(start_paused = true)]
async fn rate_per_second_derives_ceil_1000_over_rps() {
    let limiter = limiter(ResourceLimits::default().rate_per_second(NonZeroU32::new(3).unwrap()));
    let start = Instant::now();
    let (log, handles) = spawn_recorders(&limiter, 4, start);
    for h in handles {
        h.await.unwrap();
    }
    let times: Vec<Duration> = log.lock().unwrap().iter().map(|(_, t)| *t).collect();
    assert_eq!(times, [0, 334, 668, 1002].map(ms));
}

#[tokio::test(start_paused = true)]
async fn queue_full_at_depth() {
    let limiter = limiter(
        ResourceLimits::default()
            .max_concurrent(nz(1))
            .max_queue_depth(2),
    );
    let _running = limiter.acquire(KEY, None).await.unwrap();
    let waiters: Vec<_> = (0..2)
        .map(|_| {
            let l = limiter.clone();
            tokio::spawn(async move { l.acquire(KEY, None).await.map(drop) })
        })
        .collect();
    until(|| limiter.queue_depth(KEY) == 2).await;
    let err = limiter.acquire(KEY, None).await.unwrap_err();
    let AcquireError::QueueFull { depth, retry_after } = err else {
        panic!("expected queue_full, got {err:?}")
    };
    assert_eq!(depth, 2);
    // Nothing was measured yet: one running call of unknown hold (1 s prior), two ahead.
    assert_eq!(retry_after, ms(3000));
    assert_eq!(err.to_rejection().reason().as_str(), "queue_full");
    drop(_running);
    for w in waiters {
        w.await.unwrap().unwrap();
    }
}

#[tokio::test(start_paused = true)]
async fn zero_depth_never_queues() {
    let limiter = limiter(
        ResourceLimits::default()
            .max_concurrent(nz(1))
            .max_queue_depth(0),
    );
    let _running = limiter.acquire(KEY, None).await.unwrap();
    assert!(matches!(
        limiter.acquire(KEY, None).await,
        Err(AcquireError::QueueFull { depth: 0, .. })
    ));
}

#[tokio::test(start_paused = true)]
async fn queue_timeout_reports_the_real_wait() {
    let limiter = limiter(
        ResourceLimits::default()
            .max_concurrent(nz(1))
            .queue_timeout(NonZeroDuration::new(ms(1000)).unwrap()),
    );
    let _running = limiter.acquire(KEY, None).await.unwrap();
    let start = Instant::now();
    let err = limiter.acquire(KEY, None).await.unwrap_err();
    assert_eq!(start.elapsed(), ms(1000));
    let AcquireError::QueueTimeout {
        waited,
        retry_after,
    } = err
    else {
        panic!("expected queue_timeout, got {err:?}")
    };
    assert_eq!(waited, ms(1000));
    assert!(retry_after > Duration::ZERO);
    let rejection = err.to_rejection();
    assert_eq!(rejection.reason().as_str(), "queue_timeout");
    assert_eq!(rejection.queue_wait_ms(), 1000);
    assert_eq!(
        limiter.queue_depth(KEY),
        0,
        "a timed-out waiter leaves the queue"
    );
}

#[tokio::test(start_paused = true)]
async fn cancel_of_a_waiting_future_frees_its_place_at_once() {
    let limiter = limiter(ResourceLimits::default().max_concurrent(nz(1)));
    let running = limiter.acquire(KEY, None).await.unwrap();
    let cancelled = tokio::spawn({
        let l = limiter.clone();
        async move { l.acquire(KEY, None).await.map(drop) }
    });
    until(|| limiter.queue_depth(KEY) == 1).await;
    let next = tokio::spawn({
        let l = limiter.clone();
        async move {
            let lease = l.acquire(KEY, None).await.unwrap();
            (Instant::now(), lease)
        }
    });
    until(|| limiter.queue_depth(KEY) == 2).await;
    cancelled.abort();
    until(|| limiter.queue_depth(KEY) == 1).await;
    let released = Instant::now();
    drop(running);
    let (admitted, _lease) = next.await.unwrap();
    assert_eq!(
        admitted, released,
        "the next waiter is admitted without delay"
    );
}

#[tokio::test(start_paused = true)]
async fn cancel_of_a_paced_head_lets_the_next_waiter_take_its_turn() {
    let limiter = limiter(ResourceLimits::default().min_interval(ms(1000)));
    let start = Instant::now();
    drop(limiter.acquire(KEY, None).await.unwrap()); // t=0: the next may go at 1000
    let head = tokio::spawn({
        let l = limiter.clone();
        async move { l.acquire(KEY, None).await.map(drop) }
    });
    until(|| limiter.queue_depth(KEY) == 1).await;
    let next = tokio::spawn({
        let l = limiter.clone();
        async move { l.acquire(KEY, None).await.map(|_| start.elapsed()) }
    });
    until(|| limiter.queue_depth(KEY) == 2).await;
    tokio::time::advance(ms(400)).await;
    head.abort();
    assert_eq!(next.await.unwrap().unwrap(), ms(1000));
}

async fn release_path(hold: impl FnOnce(stormgate::fifo::Lease) -> tokio::task::JoinHandle<()>) {
    let limiter = limiter(ResourceLimits::default().max_concurrent(nz(1)));
    let lease = limiter.acquire(KEY, None).await.unwrap();
    let waiter = tokio::spawn({
        let l = limiter.clone();
        async move { l.acquire(KEY, None).await.map(drop) }
    });
    until(|| limiter.queue_depth(KEY) == 1).await;
    let _ = hold(lease).await;
    waiter.await.unwrap().unwrap();
    assert_eq!(limiter.in_flight(KEY), 0);
}

#[tokio::test(start_paused = true)]
async fn lease_drop_on_success_frees_the_slot() {
    release_path(|lease| {
        tokio::spawn(async move {
            let result: Result<u32, ()> = Ok(1);
            drop(lease);
            assert!(result.is_ok());
        })
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn lease_drop_on_error_frees_the_slot() {
    release_path(|lease| {
        tokio::spawn(async move {
            let run = move || -> Result<(), &'static str> {
                let _lease = lease;
                Err("tool failed")?;
                Ok(())
            };
            assert!(run().is_err());
        })
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn lease_drop_on_panic_frees_the_slot() {
    release_path(|lease| {
        tokio::spawn(async move {
            let _lease = lease;
            panic!("the tool panicked");
        })
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn lease_drop_on_future_drop_frees_the_slot() {
    release_path(|lease| {
        let task = tokio::spawn(async move {
            let _lease = lease;
            std::future::pending::<()>().await;
        });
        task.abort();
        task
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn cooldown_after_429_with_retry_after_then_drain_in_order() {
    let limiter = limiter(ResourceLimits::default().max_concurrent(nz(1)));
    let start = Instant::now();
    limiter.report_upstream_rate_limit(KEY, Some(Duration::from_secs(5)));
    let (log, handles) = spawn_recorders(&limiter, 3, start);
    for h in handles {
        h.await.unwrap();
    }
    let log = log.lock().unwrap();
    assert_eq!(log.iter().map(|(i, _)| *i).collect::<Vec<_>>(), [0, 1, 2]);
    assert!(log.iter().all(|(_, t)| *t == ms(5000)), "{log:?}");
}

#[tokio::test(start_paused = true)]
async fn cooldown_without_retry_after_is_one_second_and_never_shorter_than_pacing() {
    let plain = ResourceLimiter::builder().build(); // no limits configured at all
    let start = Instant::now();
    plain.report_upstream_rate_limit("api.example", None);
    plain.acquire("api.example", None).await.unwrap();
    assert_eq!(start.elapsed(), ms(1000));

    let paced = limiter(ResourceLimits::default().min_interval(ms(3000)));
    let start = Instant::now();
    paced.report_upstream_rate_limit(KEY, Some(ms(500)));
    paced.acquire(KEY, None).await.unwrap();
    assert_eq!(start.elapsed(), ms(3000));
}

#[tokio::test(start_paused = true)]
async fn a_cooldown_longer_than_the_queue_timeout_is_refused_at_once() {
    let limiter =
        limiter(ResourceLimits::default().queue_timeout(NonZeroDuration::new(ms(1000)).unwrap()));
    limiter.report_upstream_rate_limit(KEY, Some(Duration::from_secs(10)));
    let start = Instant::now();
    let err = limiter.acquire(KEY, None).await.unwrap_err();
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(
        err,
        AcquireError::UpstreamRateLimited {
            retry_after: Duration::from_secs(10)
        }
    );
    assert_eq!(
        err.to_rejection().reason().as_str(),
        "upstream_rate_limited"
    );
    assert_eq!(err.to_rejection().retry_after_ms(), 10_000);
}

#[tokio::test(start_paused = true)]
async fn seed_004_qps_2_example() {
    // QPS 2: A and B admitted at t=1000, C waits at 1500 and is admitted at 2000.
    let limiter = limiter(
        ResourceLimits::default().window(WindowLimit::per_second(NonZeroU32::new(2).unwrap())),
    );
    let zero = Instant::now();
    tokio::time::advance(ms(1000)).await;
    let _a = limiter.acquire(KEY, None).await.unwrap();
    let _b = limiter.acquire(KEY, None).await.unwrap();
    assert_eq!(zero.elapsed(), ms(1000));
    tokio::time::advance(ms(500)).await;
    let c = limiter.acquire(KEY, None).await.unwrap();
    assert_eq!(zero.elapsed(), ms(2000));
    assert_eq!(c.queue_wait(), ms(500));
}

#[tokio::test(start_paused = true)]
async fn seed_004_account_concurrency() {
    // Provider gitee, account-a: at most 2 running; account-b is not held up behind it.
    let limiter = limiter(ResourceLimits::default().max_concurrent_per_account(nz(2)));
    let a1 = limiter.acquire(KEY, Some("account-a")).await.unwrap();
    let _a2 = limiter.acquire(KEY, Some("account-a")).await.unwrap();
    let a3 = tokio::spawn({
        let l = limiter.clone();
        async move { l.acquire(KEY, Some("account-a")).await.map(drop) }
    });
    until(|| limiter.queue_depth(KEY) == 1).await;
    let b = limiter.acquire(KEY, Some("account-b")).await.unwrap();
    assert_eq!(b.queue_wait(), Duration::ZERO);
    assert!(!a3.is_finished());
    drop(a1);
    a3.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn dimensions_combine() {
    // Pacing 100 ms, 2 in flight, window of 3 per second: a call every 100 ms until the window
    // is full, then the window decides.
    let limiter = limiter(
        ResourceLimits::default()
            .min_interval(ms(100))
            .max_concurrent(nz(2))
            .window(WindowLimit::per_second(NonZeroU32::new(3).unwrap())),
    );
    let start = Instant::now();
    let (log, handles) = spawn_recorders(&limiter, 5, start);
    for h in handles {
        h.await.unwrap();
    }
    let times: Vec<Duration> = log.lock().unwrap().iter().map(|(_, t)| *t).collect();
    assert_eq!(times, [0, 100, 200, 1000, 1100].map(ms));
}

#[tokio::test(start_paused = true)]
async fn keys_past_the_cap_share_the_overflow_key() {
    let limiter = ResourceLimiter::builder()
        .default_limits(ResourceLimits::default().max_concurrent(nz(1)))
        .max_keys(2)
        .build();
    let mut leases = Vec::new();
    for i in 0..2 {
        leases.push(limiter.acquire(&format!("tool-{i}"), None).await.unwrap());
    }
    for i in 2..1000 {
        let lease = limiter.acquire(&format!("tool-{i}"), None).await.unwrap();
        assert_eq!(lease.key(), stormgate::OVERFLOW);
    }
    assert_eq!(limiter.key_count(), 3);
}

#[tokio::test(start_paused = true)]
async fn a_long_unconfigured_name_shares_the_overflow_key_and_is_not_stored() {
    let configured = "c".repeat(MAX_KEY_LEN + 10);
    let limiter = ResourceLimiter::builder()
        .key(
            configured.clone(),
            ResourceLimits::default().max_concurrent(nz(1)),
        )
        .build();
    for i in 0..100 {
        // 256 KiB tool names, as a hostile client sends them.
        let name = format!("{i}{}", "x".repeat(256 * 1024));
        let lease = limiter.acquire(&name, None).await.unwrap();
        assert_eq!(lease.key(), stormgate::OVERFLOW);
    }
    let fits = "y".repeat(MAX_KEY_LEN);
    assert_eq!(limiter.acquire(&fits, None).await.unwrap().key(), fits);
    assert_eq!(
        limiter.acquire(&configured, None).await.unwrap().key(),
        configured
    );
    assert_eq!(
        limiter.key_count(),
        3,
        "overflow, the fitting name, the configured key"
    );
}

mod interleavings {
    use std::collections::VecDeque;
    use std::future::Future;
    use std::pin::Pin;
    use std::task::{Context, Poll, Waker};

    use proptest::prelude::*;
    use stormgate::fifo::{Acquire, Lease};

    use super::*;

    #[derive(Debug, Clone)]
    enum Op {
        Acquire,
        Cancel(usize),
        Release(usize),
        Advance(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => Just(Op::Acquire),
            1 => any::<usize>().prop_map(Op::Cancel),
            3 => any::<usize>().prop_map(Op::Release),
            3 => (0u64..400).prop_map(Op::Advance),
        ]
    }

    struct Model {
        waiting: VecDeque<(usize, Pin<Box<Acquire>>)>,
        leases: Vec<(usize, Lease)>,
        admitted: Vec<(usize, Instant)>,
        cancelled: Vec<usize>,
        next: usize,
    }

    impl Model {
        /// Polls every waiter in arrival order; records the ones admitted.
        fn poll_all(&mut self) {
            let mut cx = Context::from_waker(Waker::noop());
            let mut still = VecDeque::new();
            while let Some((i, mut f)) = self.waiting.pop_front() {
                match f.as_mut().poll(&mut cx) {
                    Poll::Ready(Ok(lease)) => {
                        self.admitted.push((i, Instant::now()));
                        self.leases.push((i, lease));
                    }
                    Poll::Ready(Err(e)) => panic!("unbounded queue refused: {e}"),
                    Poll::Pending => still.push_back((i, f)),
                }
            }
            self.waiting = still;
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        /// Random interleavings of acquire, cancel, release and time advances never leak a
        /// slot, never exceed max_concurrent, never break FIFO among survivors and never admit
        /// closer than min_interval; and every survivor is admitted in the end.
        #[test]
        fn interleavings_keep_every_invariant(
            ops in proptest::collection::vec(op(), 1..80),
            max in 1usize..4,
            interval in prop_oneof![Just(0u64), 1u64..300],
        ) {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .start_paused(true)
                .build()
                .unwrap();
            rt.block_on(async {
                let limiter = limiter(
                    ResourceLimits::default().max_concurrent(nz(max)).min_interval(ms(interval)),
                );
                let mut m = Model {
                    waiting: VecDeque::new(),
                    leases: Vec::new(),
                    admitted: Vec::new(),
                    cancelled: Vec::new(),
                    next: 0,
                };
                for op in ops {
                    match op {
                        Op::Acquire => {
                            m.waiting.push_back((m.next, Box::pin(limiter.acquire(KEY, None))));
                            m.next += 1;
                        }
                        Op::Cancel(k) if !m.waiting.is_empty() => {
                            let (i, _) = m.waiting.remove(k % m.waiting.len()).unwrap();
                            m.cancelled.push(i);
                        }
                        Op::Release(k) if !m.leases.is_empty() => {
                            m.leases.remove(k % m.leases.len());
                        }
                        Op::Advance(d) => tokio::time::advance(ms(d)).await,
                        _ => {}
                    }
                    m.poll_all();
                    prop_assert!(m.leases.len() <= max);
                    prop_assert_eq!(limiter.in_flight(KEY), m.leases.len());
                    prop_assert_eq!(limiter.queue_depth(KEY), m.waiting.len());
                }
                // Drain: release everything and let time pass until every survivor ran.
                while !m.waiting.is_empty() {
                    m.leases.clear();
                    m.poll_all(); // record grants at the instant they happen
                    tokio::time::advance(ms(interval.max(1))).await;
                    m.poll_all();
                }
                m.leases.clear();
                prop_assert_eq!(limiter.in_flight(KEY), 0);
                prop_assert_eq!(limiter.queue_depth(KEY), 0);
                let order: Vec<usize> = m.admitted.iter().map(|(i, _)| *i).collect();
                let mut sorted = order.clone();
                sorted.sort_unstable();
                prop_assert_eq!(&order, &sorted, "FIFO among survivors");
                let survivors = m.next - m.cancelled.len();
                prop_assert_eq!(order.len(), survivors);
                for pair in m.admitted.windows(2) {
                    prop_assert!(pair[1].1 - pair[0].1 >= ms(interval));
                }
                Ok(())
            })?;
        }
    }
}
