//! The per-key limits of the FIFO limiter, and presets for well-known upstreams.

use crate::valid::NonZeroDuration;
use std::num::{NonZeroU32, NonZeroUsize};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// At most `max` admissions in any sliding window `(now - length, now]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct WindowLimit {
    /// Admissions allowed per window.
    pub max: NonZeroU32,
    /// The window's length, in milliseconds in config (`length_ms`).
    #[serde(rename = "length_ms")]
    pub length: NonZeroDuration,
}

impl WindowLimit {
    /// At most `max` admissions in any window of `length`.
    pub fn new(max: NonZeroU32, length: NonZeroDuration) -> Self {
        WindowLimit { max, length }
    }

    /// `max` admissions per second: a provider's QPS.
    pub fn per_second(max: NonZeroU32) -> Self {
        WindowLimit {
            max,
            length: NonZeroDuration::of(Duration::from_secs(1)),
        }
    }
}

/// The limits of one resource key. **Every dimension is optional, and absent means that
/// dimension is off**, never an implicit default: `ResourceLimits::default()` limits nothing.
///
/// ```
/// use std::num::NonZeroUsize;
/// use std::time::Duration;
/// use stormgate::fifo::ResourceLimits;
/// use stormgate::valid::NonZeroDuration;
///
/// let db = ResourceLimits::default()
///     .max_concurrent(NonZeroUsize::new(2).unwrap())
///     .max_queue_depth(4)
///     .queue_timeout(NonZeroDuration::from_millis(1000).unwrap());
/// assert_eq!(db.pacing(), Duration::ZERO);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct ResourceLimits {
    /// Minimum time between two admissions (`min_interval_ms`). Wins over `rate_per_second`;
    /// zero means no pacing.
    #[serde(rename = "min_interval_ms", with = "crate::duration_ms::opt")]
    pub min_interval: Option<Duration>,
    /// Admissions per second, used only to derive `min_interval` as `ceil(1000 / rps)` ms when
    /// `min_interval` is absent.
    pub rate_per_second: Option<NonZeroU32>,
    /// Calls in flight at once.
    pub max_concurrent: Option<NonZeroUsize>,
    /// Waiters in the FIFO queue: 0 never queues (refuse at once); absent is unbounded.
    pub max_queue_depth: Option<usize>,
    /// How long a waiter may wait (`queue_timeout_ms`); absent waits until admitted or
    /// cancelled.
    #[serde(rename = "queue_timeout_ms")]
    pub queue_timeout: Option<NonZeroDuration>,
    /// A sliding admission window; only admitted calls consume it.
    pub window: Option<WindowLimit>,
    /// Calls in flight at once per account inside this key (e.g. provider `gitee`, account
    /// `account-a`: at most 2 running).
    pub max_concurrent_per_account: Option<NonZeroUsize>,
}

impl ResourceLimits {
    /// The time between admissions: `min_interval` if set, else `ceil(1000 / rate_per_second)`
    /// ms, else zero.
    pub fn pacing(&self) -> Duration {
        match (self.min_interval, self.rate_per_second) {
            (Some(interval), _) => interval,
            (None, Some(rps)) => Duration::from_millis(1000u64.div_ceil(u64::from(rps.get()))),
            (None, None) => Duration::ZERO,
        }
    }

    /// Whether every dimension is off.
    pub fn is_unlimited(&self) -> bool {
        self.pacing().is_zero()
            && self.max_concurrent.is_none()
            && self.max_queue_depth.is_none()
            && self.queue_timeout.is_none()
            && self.window.is_none()
            && self.max_concurrent_per_account.is_none()
    }

    /// Sets `min_interval`.
    pub fn min_interval(mut self, interval: Duration) -> Self {
        self.min_interval = Some(interval);
        self
    }

    /// Sets `rate_per_second`.
    pub fn rate_per_second(mut self, rps: NonZeroU32) -> Self {
        self.rate_per_second = Some(rps);
        self
    }

    /// Sets `max_concurrent`.
    pub fn max_concurrent(mut self, n: NonZeroUsize) -> Self {
        self.max_concurrent = Some(n);
        self
    }

    /// Sets `max_queue_depth`.
    pub fn max_queue_depth(mut self, n: usize) -> Self {
        self.max_queue_depth = Some(n);
        self
    }

    /// Sets `queue_timeout`.
    pub fn queue_timeout(mut self, timeout: NonZeroDuration) -> Self {
        self.queue_timeout = Some(timeout);
        self
    }

    /// Sets the sliding window.
    pub fn window(mut self, window: WindowLimit) -> Self {
        self.window = Some(window);
        self
    }

    /// Sets `max_concurrent_per_account`.
    pub fn max_concurrent_per_account(mut self, n: NonZeroUsize) -> Self {
        self.max_concurrent_per_account = Some(n);
        self
    }

    /// arXiv: one request every 3 s on a single connection, as its API terms ask; queue 8, 20 s
    /// timeout.
    pub fn arxiv() -> Self {
        ResourceLimits::default()
            .min_interval(Duration::from_millis(3000))
            .max_concurrent(NonZeroUsize::MIN)
            .max_queue_depth(8)
            .queue_timeout(NonZeroDuration::of(Duration::from_secs(20)))
    }

    /// NCBI eutils, shared by PubMed, ClinVar and GEO: 3 per second (334 ms pacing), as NCBI
    /// allows without an API key; 2 in flight, queue 8, 20 s timeout.
    pub fn ncbi_eutils() -> Self {
        ResourceLimits::default()
            .rate_per_second(NonZeroU32::new(3).expect("3 > 0"))
            .max_concurrent(NonZeroUsize::new(2).expect("2 > 0"))
            .max_queue_depth(8)
            .queue_timeout(NonZeroDuration::of(Duration::from_secs(20)))
    }

    /// Other public APIs: 5 per second (200 ms pacing), 2 in flight.
    pub fn public_api() -> Self {
        ResourceLimits::default()
            .rate_per_second(NonZeroU32::new(5).expect("5 > 0"))
            .max_concurrent(NonZeroUsize::new(2).expect("2 > 0"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pacing_derivation() {
        let rps = |n| ResourceLimits::default().rate_per_second(NonZeroU32::new(n).unwrap());
        assert_eq!(rps(3).pacing(), Duration::from_millis(334));
        assert_eq!(rps(5).pacing(), Duration::from_millis(200));
        assert_eq!(rps(1).pacing(), Duration::from_millis(1000));
        assert_eq!(rps(3000).pacing(), Duration::from_millis(1));
        // min_interval wins when both are set, and 0 means no pacing.
        assert_eq!(
            rps(5).min_interval(Duration::from_millis(3000)).pacing(),
            Duration::from_millis(3000)
        );
        assert_eq!(rps(5).min_interval(Duration::ZERO).pacing(), Duration::ZERO);
        assert!(ResourceLimits::default().is_unlimited());
        assert!(!ResourceLimits::arxiv().is_unlimited());
    }

    #[test]
    fn presets_match_the_seed() {
        let a = ResourceLimits::arxiv();
        assert_eq!(a.pacing(), Duration::from_secs(3));
        assert_eq!(a.max_concurrent.map(NonZeroUsize::get), Some(1));
        assert_eq!(a.max_queue_depth, Some(8));
        assert_eq!(
            a.queue_timeout,
            NonZeroDuration::new(Duration::from_secs(20)).ok()
        );
        let n = ResourceLimits::ncbi_eutils();
        assert_eq!(n.pacing(), Duration::from_millis(334));
        assert_eq!(n.max_concurrent.map(NonZeroUsize::get), Some(2));
        let p = ResourceLimits::public_api();
        assert_eq!(p.pacing(), Duration::from_millis(200));
        assert_eq!(
            p.max_queue_depth, None,
            "absent: unbounded, not a hidden default"
        );
    }

    #[test]
    fn config_form_uses_milliseconds_and_absent_means_off() {
        let limits: ResourceLimits = serde_json::from_str(
            r#"{"min_interval_ms":3000,"max_concurrent":1,"max_queue_depth":8,"queue_timeout_ms":20000,
                "window":{"max":2,"length_ms":1000}}"#,
        )
        .unwrap();
        assert_eq!(limits.min_interval, Some(Duration::from_secs(3)));
        assert_eq!(
            limits.window.unwrap().length,
            NonZeroDuration::new(Duration::from_secs(1)).unwrap()
        );
        assert_eq!(limits.max_concurrent_per_account, None);
        let err = serde_json::from_str::<ResourceLimits>(r#"{"max_concurrent":0}"#).unwrap_err();
        assert!(err.to_string().contains("nonzero"), "{err}");
        assert!(serde_json::from_str::<ResourceLimits>(r#"{"max_concurent":1}"#).is_err());
    }
}
