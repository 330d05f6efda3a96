//! Statistics every stage shares, as a leaf no stage module is imported by: the
//! exponentially weighted moving average. Pure logic, no runtime.

/// An EWMA of `alpha` in (0, 1]: each sample moves the average `alpha` of the way to it.
///
/// ```
/// use stormgate::stats::Ewma;
///
/// let mut e = Ewma::new(0.5);
/// assert_eq!(e.value(), None);
/// e.update(10.0); // the first sample is taken as is
/// e.update(20.0);
/// assert_eq!(e.value(), Some(15.0));
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ewma {
    alpha: f64,
    value: Option<f64>,
}

impl Ewma {
    /// An empty average. `alpha` must be in (0, 1] (validated by the config).
    pub fn new(alpha: f64) -> Self {
        debug_assert!(alpha > 0.0 && alpha <= 1.0, "alpha in (0, 1]");
        Ewma { alpha, value: None }
    }

    /// An average that starts at `prior`, as if it had seen it already: the first sample then
    /// moves it only `alpha` of the way (one bad call is not a bad session).
    pub fn with_prior(alpha: f64, prior: f64) -> Self {
        debug_assert!(alpha > 0.0 && alpha <= 1.0, "alpha in (0, 1]");
        Ewma {
            alpha,
            value: Some(prior),
        }
    }

    /// Folds in one sample and returns the new average.
    pub fn update(&mut self, sample: f64) -> f64 {
        let next = match self.value {
            None => sample,
            Some(v) => v + self.alpha * (sample - v),
        };
        self.value = Some(next);
        next
    }

    /// The average, `None` before the first sample.
    pub fn value(&self) -> Option<f64> {
        self.value
    }

    /// The smoothing factor.
    pub fn alpha(&self) -> f64 {
        self.alpha
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The textbook closed form: s_n = a * sum_{k=1..n} (1-a)^(n-k) x_k + (1-a)^(n-1) * x_1 * (1-a)
    /// written as the direct weighted sum with the first sample as the seed.
    fn naive(alpha: f64, xs: &[f64]) -> f64 {
        let n = xs.len();
        let mut total = xs[0] * (1.0 - alpha).powi(n as i32 - 1);
        for (k, x) in xs.iter().enumerate().skip(1) {
            total += alpha * (1.0 - alpha).powi((n - 1 - k) as i32) * x;
        }
        total
    }

    proptest! {
        #[test]
        fn matches_the_closed_form(
            alpha in 0.01f64..=1.0,
            xs in proptest::collection::vec(-1e6f64..1e6, 1..60),
        ) {
            let mut e = Ewma::new(alpha);
            for &x in &xs {
                e.update(x);
            }
            let expected = naive(alpha, &xs);
            let got = e.value().unwrap();
            prop_assert!((got - expected).abs() <= 1e-6 * (1.0 + expected.abs()), "{got} vs {expected}");
        }

        #[test]
        fn stays_within_the_range_of_its_samples(
            alpha in 0.01f64..=1.0,
            xs in proptest::collection::vec(0f64..1e6, 1..60),
        ) {
            let mut e = Ewma::new(alpha);
            for &x in &xs {
                e.update(x);
            }
            let (lo, hi) = xs.iter().fold((f64::MAX, f64::MIN), |(l, h), &x| (l.min(x), h.max(x)));
            let v = e.value().unwrap();
            prop_assert!(v >= lo - 1e-6 && v <= hi + 1e-6);
        }
    }
}
