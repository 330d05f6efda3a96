//! The budget's cuts and recoveries as log lines: one when it starts falling, one when it
//! starts rising again, one when it is back at its stable value, and never more than one per
//! [`MIN_GAP`] however the controller flaps (the tick runs ten times a second).

use std::time::Duration;

/// The shortest time between two log lines.
pub(crate) const MIN_GAP: Duration = Duration::from_secs(1);

/// Where the budget is heading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// At its stable value.
    Stable,
    /// Falling: the backend looks unhealthy.
    Cut,
    /// Rising again after a cut.
    Recovering,
}

/// The last phase logged, and when.
#[derive(Debug)]
pub(crate) struct Trend {
    logged: Phase,
    at: Option<Duration>,
}

impl Default for Trend {
    fn default() -> Self {
        Trend {
            logged: Phase::Stable,
            at: None,
        }
    }
}

impl Trend {
    /// After a tick that moved the budget from `before` to `after` (stable value `stable`) at
    /// `now`: the phase to log, if it differs from the last one logged and that was at least
    /// [`MIN_GAP`] ago (a change inside the gap is logged once the gap has passed, if it
    /// still holds).
    pub(crate) fn update(
        &mut self,
        now: Duration,
        before: f64,
        after: f64,
        stable: f64,
    ) -> Option<Phase> {
        let phase = if after >= stable {
            Phase::Stable
        } else if after < before {
            Phase::Cut
        } else if after > before {
            Phase::Recovering
        } else {
            self.logged
        };
        let quiet = self.at.is_none_or(|at| now.saturating_sub(at) >= MIN_GAP);
        if phase == self.logged || !quiet {
            return None;
        }
        self.logged = phase;
        self.at = Some(now);
        Some(phase)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(budgets: &[f64]) -> Vec<(u64, Phase)> {
        let mut trend = Trend::default();
        let mut out = Vec::new();
        for (i, w) in budgets.windows(2).enumerate() {
            let now = Duration::from_millis(100 * (i as u64 + 1));
            if let Some(p) = trend.update(now, w[0], w[1], 1000.0) {
                out.push((100 * (i as u64 + 1), p));
            }
        }
        out
    }

    #[test]
    fn a_cut_and_its_recovery_are_three_lines() {
        let mut b = vec![1000.0, 700.0, 490.0, 343.0];
        b.extend([343.0; 20]);
        b.extend((1..=7).map(|i| 343.0 + 100.0 * f64::from(i)));
        b.extend([1000.0; 20]);
        // Back at stable at 3 000 ms, logged once the gap after 2 400 ms has passed.
        assert_eq!(
            run(&b),
            [
                (100, Phase::Cut),
                (2400, Phase::Recovering),
                (3400, Phase::Stable)
            ]
        );
    }

    #[test]
    fn a_flapping_budget_logs_at_most_once_a_second() {
        let b: Vec<f64> = (0..100)
            .map(|i| if i % 2 == 0 { 900.0 } else { 800.0 })
            .collect();
        let lines = run(&b);
        assert!(lines.len() <= 10, "{lines:?}");
        assert!(
            lines.windows(2).all(|w| w[1].0 - w[0].0 >= 1000),
            "{lines:?}"
        );
    }

    #[test]
    fn steady_at_stable_logs_nothing() {
        assert!(run(&[1000.0; 50]).is_empty());
    }
}
