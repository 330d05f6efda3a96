//! Numbers and durations that cannot hold a value out of their range.
//!
//! The configuration's rates, budgets, shares and factors are these types, not bare `f64`s,
//! and its positive durations [`NonZeroDuration`] (counts that must not be zero are the
//! standard library's `NonZero` integers). A value is checked once, where it is made: by
//! `new` in code, or by serde when a document is read, so a configuration that holds one is
//! valid in that respect, and no stage checks it again. A document's value out of range is
//! refused with the field's path and the rule (`budget.alpha: must be in (0, 1]`).
//!
//! ```
//! use std::time::Duration;
//! use stormgate::valid::{Fraction, NonZeroDuration, Positive};
//!
//! assert_eq!(Fraction::new(0.4).unwrap().get(), 0.4);
//! assert_eq!(Fraction::new(1.5).unwrap_err().to_string(), "must be in (0, 1]");
//! assert!(Positive::new(f64::NAN).is_err());
//! assert_eq!(
//!     NonZeroDuration::new(Duration::ZERO).unwrap_err().to_string(),
//!     "must be greater than 0"
//! );
//! let f: Fraction = serde_json::from_str("0.25").unwrap();
//! assert_eq!(f.get(), 0.25);
//! assert!(serde_json::from_str::<Fraction>("0").is_err());
//! ```

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// A value out of its type's range: the rule it breaks, in words (`must be in (0, 1]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutOfRange {
    /// The rule.
    pub rule: &'static str,
}

impl fmt::Display for OutOfRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.rule)
    }
}

impl std::error::Error for OutOfRange {}

/// A number type that holds only the `f64`s `$ok` accepts.
macro_rules! ranged {
    ($(#[$doc:meta])* $name:ident, $rule:literal, |$v:ident| $ok:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, PartialOrd, Serialize, Deserialize)]
        #[serde(try_from = "f64", into = "f64")]
        pub struct $name(f64);

        impl $name {
            /// `value`, if it is in range.
            pub const fn new($v: f64) -> Result<Self, OutOfRange> {
                if $ok {
                    Ok($name($v))
                } else {
                    Err(OutOfRange { rule: $rule })
                }
            }

            /// The value of a constant known to be in range (a default): out of range, it
            /// does not compile where it is a constant, and panics elsewhere.
            pub(crate) const fn of(value: f64) -> Self {
                match Self::new(value) {
                    Ok(v) => v,
                    Err(_) => panic!("out of range"),
                }
            }

            /// The number.
            pub const fn get(self) -> f64 {
                self.0
            }
        }

        impl TryFrom<f64> for $name {
            type Error = OutOfRange;

            fn try_from(value: f64) -> Result<Self, OutOfRange> {
                Self::new(value)
            }
        }

        impl From<$name> for f64 {
            fn from(value: $name) -> f64 {
                value.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }
    };
}

ranged!(
    /// A finite number greater than 0: a rate, a budget, a tolerance.
    Positive,
    "must be greater than 0",
    |value| value.is_finite() && value > 0.0
);

ranged!(
    /// A finite number, 0 or more.
    NonNegative,
    "must be 0 or more",
    |value| value.is_finite() && value >= 0.0
);

ranged!(
    /// A finite number, 1 or more: a bucket that holds at least one call.
    AtLeastOne,
    "must be at least 1",
    |value| value.is_finite() && value >= 1.0
);

ranged!(
    /// A fraction in (0, 1]: a smoothing factor, a share that may be whole.
    Fraction,
    "must be in (0, 1]",
    |value| value > 0.0 && value <= 1.0
);

ranged!(
    /// A share in [0, 1]: an error or slow rate.
    Share,
    "must be in [0, 1]",
    |value| value >= 0.0 && value <= 1.0
);

ranged!(
    /// A factor in (0, 1): a multiplicative cut that always cuts and never to nothing.
    Factor,
    "must be in (0, 1)",
    |value| value > 0.0 && value < 1.0
);

/// A duration longer than zero; whole milliseconds in a configuration document (the `*_ms`
/// keys), as every duration there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "u64", into = "u64")]
pub struct NonZeroDuration(Duration);

impl NonZeroDuration {
    /// `duration`, if it is longer than zero.
    pub const fn new(duration: Duration) -> Result<Self, OutOfRange> {
        if duration.is_zero() {
            Err(OutOfRange {
                rule: "must be greater than 0",
            })
        } else {
            Ok(NonZeroDuration(duration))
        }
    }

    /// `ms` milliseconds, if more than 0.
    pub const fn from_millis(ms: u64) -> Result<Self, OutOfRange> {
        Self::new(Duration::from_millis(ms))
    }

    /// The duration of a constant known to be longer than zero (a default).
    pub(crate) const fn of(duration: Duration) -> Self {
        match Self::new(duration) {
            Ok(d) => d,
            Err(_) => panic!("zero duration"),
        }
    }

    /// The duration.
    pub const fn get(self) -> Duration {
        self.0
    }
}

impl TryFrom<u64> for NonZeroDuration {
    type Error = OutOfRange;

    fn try_from(ms: u64) -> Result<Self, OutOfRange> {
        Self::from_millis(ms)
    }
}

impl From<NonZeroDuration> for u64 {
    fn from(d: NonZeroDuration) -> u64 {
        u64::try_from(d.0.as_millis()).unwrap_or(u64::MAX)
    }
}

impl From<NonZeroDuration> for Duration {
    fn from(d: NonZeroDuration) -> Duration {
        d.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A rule's words, the rule as a predicate (the reference), and the type made of a number.
    type Rule = (
        &'static str,
        fn(f64) -> bool,
        fn(f64) -> Result<f64, OutOfRange>,
    );

    /// Each type's rule.
    fn rules() -> [Rule; 6] {
        [
            (
                "must be greater than 0",
                |v| v.is_finite() && v > 0.0,
                |v| Positive::new(v).map(Positive::get),
            ),
            (
                "must be 0 or more",
                |v| v.is_finite() && v >= 0.0,
                |v| NonNegative::new(v).map(NonNegative::get),
            ),
            (
                "must be at least 1",
                |v| v.is_finite() && v >= 1.0,
                |v| AtLeastOne::new(v).map(AtLeastOne::get),
            ),
            (
                "must be in (0, 1]",
                |v| v > 0.0 && v <= 1.0,
                |v| Fraction::new(v).map(Fraction::get),
            ),
            (
                "must be in [0, 1]",
                |v| (0.0..=1.0).contains(&v),
                |v| Share::new(v).map(Share::get),
            ),
            (
                "must be in (0, 1)",
                |v| v > 0.0 && v < 1.0,
                |v| Factor::new(v).map(Factor::get),
            ),
        ]
    }

    fn edges() -> impl Strategy<Value = f64> {
        prop_oneof![
            Just(0.0),
            Just(-0.0),
            Just(1.0),
            Just(f64::NAN),
            Just(f64::INFINITY),
            Just(f64::NEG_INFINITY),
            Just(f64::MIN_POSITIVE),
            Just(1.0 - f64::EPSILON),
            Just(1.0 + f64::EPSILON),
            -2.0..2.0f64,
            any::<f64>(),
        ]
    }

    proptest! {
        #[test]
        fn each_type_holds_exactly_what_its_rule_allows(v in edges()) {
            for (rule, allowed, made) in rules() {
                match made(v) {
                    Ok(held) => {
                        prop_assert!(allowed(v), "{} held {}", rule, v);
                        prop_assert_eq!(held.to_bits(), v.to_bits());
                    }
                    Err(e) => {
                        prop_assert!(!allowed(v), "{} refused {}", rule, v);
                        prop_assert_eq!(e.rule, rule);
                    }
                }
            }
        }

        #[test]
        fn a_document_holds_what_code_may(v in -2.0..2.0f64) {
            let text = serde_json::to_string(&v).unwrap();
            let number: f64 = serde_json::from_str(&text).unwrap();
            let read = serde_json::from_str::<Fraction>(&text).ok().map(Fraction::get);
            prop_assert_eq!(read, Fraction::new(number).ok().map(Fraction::get));
        }
    }

    #[test]
    fn a_document_out_of_range_is_refused_with_the_rule() {
        let err = serde_json::from_str::<Fraction>("1.5").unwrap_err();
        assert!(err.to_string().starts_with("must be in (0, 1]"), "{err}");
        assert_eq!(serde_json::to_string(&Fraction::of(0.5)).unwrap(), "0.5");
    }

    #[test]
    fn a_duration_is_whole_milliseconds_and_never_zero() {
        let d: NonZeroDuration = serde_json::from_str("250").unwrap();
        assert_eq!(d.get(), Duration::from_millis(250));
        assert_eq!(serde_json::to_string(&d).unwrap(), "250");
        let err = serde_json::from_str::<NonZeroDuration>("0").unwrap_err();
        assert!(
            err.to_string().starts_with("must be greater than 0"),
            "{err}"
        );
        assert!(NonZeroDuration::new(Duration::from_nanos(1)).is_ok());
    }
}
