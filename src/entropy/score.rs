//! The storm score: entropy, errors, latency and how a session treats its refusals,
//! combined.

/// What the score is computed from.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Signals {
    /// Entropy of the session's window, bits.
    pub entropy: f64,
    /// The session's own entropy learned while it was healthy, bits (`None` before any).
    pub entropy_baseline: Option<f64>,
    /// Smoothed share of the session's calls that failed, in [0, 1].
    pub error_rate: f64,
    /// Smoothed ratio of the session's service times to each tool's healthy service time
    /// (1 = as usual).
    pub latency_ratio: f64,
    /// Its calls that arrived while its last refusals all still told it to wait (it ignored
    /// the `retry_after_ms` it was given), within about one window.
    pub ignored_hints: f64,
    /// The share of its recent calls that were refused, in [0, 1] (0 below volume).
    pub refused_share: f64,
}

/// Tolerances of the score: within all three, a session is healthy whatever its entropy.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Tolerances {
    /// Error rate a healthy session may have. Default 0.05.
    pub error_rate: f64,
    /// Latency ratio a healthy session may have. Default 1.5.
    pub latency_ratio: f64,
    /// Calls ignoring its refusals' waits a healthy session may make within a window: the
    /// rest of a burst already in flight when its calls were refused arrives "early" without
    /// ignoring anything. Default [`HINTS_IGNORED_ALLOWED`].
    pub ignored_hints: f64,
}

/// Calls a session may make within about a window while its refusals still tell it to wait,
/// before that counts as ignoring its hints: the rest of a burst of parallel calls already on
/// its way when the first were refused (a call counts only once as many waits as the client
/// has shown callers are all ahead). A client retrying its refusals at once every 20 ms passes
/// it in under half a second.
pub(crate) const HINTS_IGNORED_ALLOWED: f64 = 16.0;

impl Default for Tolerances {
    fn default() -> Self {
        Tolerances {
            error_rate: 0.05,
            latency_ratio: 1.5,
            ignored_hints: HINTS_IGNORED_ALLOWED,
        }
    }
}

/// How far past its tolerances the session is: 0 while healthy, 1 at twice a tolerance, the
/// three summed: errors, latency, and calls that ignored a refusal's wait.
pub(crate) fn distress(s: &Signals, t: &Tolerances) -> f64 {
    let past = |value: f64, tolerance: f64| ((value - tolerance) / tolerance).max(0.0);
    past(s.error_rate, t.error_rate)
        + past(s.latency_ratio, t.latency_ratio)
        + past(s.ignored_hints, t.ignored_hints)
}

/// How diverse the session's calls are, absolute and against its own healthy baseline:
/// `max(0, H - 1) + max(0, H - H_baseline)`, in bits.
pub(crate) fn diversity(s: &Signals) -> f64 {
    let rise = s.entropy_baseline.map_or(0.0, |b| (s.entropy - b).max(0.0));
    (s.entropy - 1.0).max(0.0) + rise
}

/// The storm score: `distress x (1 + diversity + refused share)`.
///
/// * Complex-task protection: a diverse session that is healthy (errors and latency within
///   tolerance, and its refusals' waits honoured) has distress 0 and scores 0, whatever its
///   entropy and however many of its calls a shared budget refused.
/// * A session that fails, slows down or calls straight through its refusals scores by how
///   badly; diversity amplifies it, since a session flailing across ever-new calls is the
///   storm's signature, and so does the share of its calls refused (a client refused on
///   most of its calls that keeps calling is not waiting for anything).
/// * A low-entropy loop of the same failing call is not spared: its distress alone scores.
///
/// A typical storm (entropy 0.8 -> 4.5 bits, success 97% -> 62%, p99 200 ms -> 1.8 s):
pub(crate) fn storm_score(s: &Signals, t: &Tolerances) -> f64 {
    distress(s, t) * (1.0 + diversity(s) + s.refused_share.clamp(0.0, 1.0))
}

/// The budget factor a score calls for: `exp(-coefficient x score)`, at least `min_factor`.
pub(crate) fn budget_factor(score: f64, coefficient: f64, min_factor: f64) -> f64 {
    (-coefficient * score).exp().max(min_factor).min(1.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_failing_loop_scores_without_entropy() {
        let looped = Signals {
            entropy: 0.0,
            entropy_baseline: Some(0.0),
            error_rate: 0.5,
            latency_ratio: 1.0,
            ..Signals::default()
        };
        assert_eq!(storm_score(&looped, &Tolerances::default()), 9.0);
    }

    proptest! {
        /// Healthy sessions score 0 whatever their entropy and refused share; the score never
        /// falls when errors, latency, ignored hints or the refused share rise.
        #[test]
        fn healthy_is_zero_and_the_score_is_monotone(
            h in 0.0f64..10.0, b in 0.0f64..10.0,
            e in 0.0f64..1.0, de in 0.0f64..0.5,
            r in 0.0f64..20.0, dr in 0.0f64..5.0,
            i in 0.0f64..100.0, di in 0.0f64..50.0,
            q in 0.0f64..1.0, dq in 0.0f64..1.0,
        ) {
            let t = Tolerances::default();
            let s = Signals {
                entropy: h, entropy_baseline: Some(b), error_rate: e, latency_ratio: r,
                ignored_hints: i, refused_share: q,
            };
            if e <= t.error_rate && r <= t.latency_ratio && i <= t.ignored_hints {
                prop_assert_eq!(storm_score(&s, &t), 0.0);
            }
            let worse = Signals {
                error_rate: (e + de).min(1.0), latency_ratio: r + dr,
                ignored_hints: i + di, refused_share: (q + dq).min(1.0), ..s
            };
            prop_assert!(storm_score(&worse, &t) >= storm_score(&s, &t));
            let f = budget_factor(storm_score(&s, &t), 0.2, 0.05);
            prop_assert!((0.05..=1.0).contains(&f));
        }
    }
}

/// The examples of this module's documentation, run.
#[cfg(test)]
mod examples {
    #[test]
    fn storm_swarm_and_complex_work_score_as_documented() {
        use crate::entropy::score::{Signals, Tolerances, storm_score};

        let storm = Signals {
            entropy: 4.5,
            entropy_baseline: Some(0.8),
            error_rate: 0.38,
            latency_ratio: 9.0,
            ..Default::default()
        };
        let score = storm_score(&storm, &Tolerances::default());
        // distress (0.38 - 0.05) / 0.05 + (9 - 1.5) / 1.5 = 11.6; diversity 3.5 + 3.7 = 7.2
        assert!((score - 11.6 * 8.2).abs() < 1e-9);

        let complex = Signals {
            entropy: 4.5,
            entropy_baseline: Some(0.8),
            error_rate: 0.0,
            latency_ratio: 1.0,
            ..Default::default()
        };
        assert_eq!(storm_score(&complex, &Tolerances::default()), 0.0);

        // A swarm member retrying its refusals at once: 48 calls within a window while told to
        // wait, 90% of its calls refused, healthy otherwise (its admitted calls were fine).
        let swarm = Signals {
            ignored_hints: 48.0,
            refused_share: 0.9,
            latency_ratio: 1.0,
            ..complex
        };
        // distress (48 - 16) / 16 = 2; x (1 + 7.2 + 0.9)
        assert!((storm_score(&swarm, &Tolerances::default()) - 2.0 * 9.1).abs() < 1e-9);
    }
}
