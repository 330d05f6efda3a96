//! Several admissions as one stage: a tuple of [`Admission`]s is an `Admission`, admitting
//! at one instant (one clock reading for all).

use tokio::time::Instant;

use super::layer::Admission;
use crate::call::Call;
use crate::rejection::Rejection;

/// Both, in order: a call is charged by both or by neither. When the second refuses, what the
/// first took is given back at once; a refund gives back the second's charge, then the first's.
impl<A: Admission, B: Admission> Admission for (A, B) {
    type Permit = (A::Permit, B::Permit);

    fn admit(&self, call: &Call) -> Result<Self::Permit, Rejection> {
        self.admit_at(call, Instant::now())
    }

    fn admit_at(&self, call: &Call, now: Instant) -> Result<Self::Permit, Rejection> {
        let a = self.0.admit_at(call, now)?;
        match self.1.admit_at(call, now) {
            Ok(b) => Ok((a, b)),
            Err(rejection) => {
                self.0.refund(a);
                Err(rejection)
            }
        }
    }

    fn refund(&self, (a, b): Self::Permit) {
        self.1.refund(b);
        self.0.refund(a);
    }
}

/// All three, in order: a call is charged by all or by none. When one refuses, what those
/// before it took is given back at once, latest first; so is a refund.
impl<A: Admission, B: Admission, C: Admission> Admission for (A, B, C) {
    type Permit = (A::Permit, B::Permit, C::Permit);

    fn admit(&self, call: &Call) -> Result<Self::Permit, Rejection> {
        self.admit_at(call, Instant::now())
    }

    fn admit_at(&self, call: &Call, now: Instant) -> Result<Self::Permit, Rejection> {
        let a = self.0.admit_at(call, now)?;
        let b = match self.1.admit_at(call, now) {
            Ok(b) => b,
            Err(rejection) => {
                self.0.refund(a);
                return Err(rejection);
            }
        };
        match self.2.admit_at(call, now) {
            Ok(c) => Ok((a, b, c)),
            Err(rejection) => {
                self.1.refund(b);
                self.0.refund(a);
                Err(rejection)
            }
        }
    }

    fn refund(&self, (a, b, c): Self::Permit) {
        self.2.refund(c);
        self.1.refund(b);
        self.0.refund(a);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::Duration;

    use super::*;
    use crate::rejection::{Reason, Scope};

    /// Admits while it has units, logging what it took and gave back.
    struct Units {
        name: &'static str,
        left: Mutex<u32>,
        log: std::sync::Arc<Mutex<Vec<String>>>,
    }

    impl Admission for Units {
        type Permit = u32;

        fn admit(&self, _call: &Call) -> Result<u32, Rejection> {
            let mut left = self.left.lock().unwrap();
            if *left == 0 {
                return Err(Rejection::new(
                    Reason::GlobalBudgetExceeded,
                    Scope::Global,
                    Duration::from_secs(1),
                ));
            }
            *left -= 1;
            self.log.lock().unwrap().push(format!("{} took", self.name));
            Ok(1)
        }

        fn refund(&self, permit: u32) {
            *self.left.lock().unwrap() += permit;
            self.log
                .lock()
                .unwrap()
                .push(format!("{} gave back", self.name));
        }
    }

    fn units(name: &'static str, left: u32, log: &std::sync::Arc<Mutex<Vec<String>>>) -> Units {
        Units {
            name,
            left: Mutex::new(left),
            log: log.clone(),
        }
    }

    #[test]
    fn a_call_is_charged_by_all_or_by_none() {
        let log = std::sync::Arc::default();
        let call = Call::request("tools/call");
        let three = (
            units("a", 5, &log),
            units("b", 5, &log),
            units("c", 1, &log),
        );
        let permit = three.admit(&call).unwrap();
        // The third has nothing left: the first two give back what they took, latest first.
        assert!(three.admit(&call).is_err());
        assert_eq!(*three.0.left.lock().unwrap(), 4);
        assert_eq!(*three.1.left.lock().unwrap(), 4);
        three.refund(permit);
        assert_eq!(
            *log.lock().unwrap(),
            [
                "a took",
                "b took",
                "c took",
                "a took",
                "b took",
                "b gave back",
                "a gave back",
                "c gave back",
                "b gave back",
                "a gave back",
            ]
        );
        let log = std::sync::Arc::default();
        let two = (units("a", 5, &log), units("b", 0, &log));
        assert!(two.admit(&call).is_err());
        assert_eq!(*two.0.left.lock().unwrap(), 5);
        assert_eq!(*log.lock().unwrap(), ["a took", "a gave back"]);
    }

    /// Records the instant each call was admitted at; reads the clock itself when not given
    /// one.
    #[derive(Default)]
    struct Clocked(Mutex<Vec<Instant>>);

    impl Admission for Clocked {
        type Permit = ();

        fn admit(&self, call: &Call) -> Result<(), Rejection> {
            self.admit_at(call, Instant::now())
        }

        fn admit_at(&self, _call: &Call, now: Instant) -> Result<(), Rejection> {
            self.0.lock().unwrap().push(now);
            Ok(())
        }
    }

    #[test]
    fn a_tuple_admits_at_the_instant_it_is_given_every_stage_at_the_same() {
        let call = Call::request("tools/call");
        let then = Instant::now() - Duration::from_secs(5);
        let two = (Clocked::default(), Clocked::default());
        two.admit_at(&call, then).unwrap();
        let three = (Clocked::default(), Clocked::default(), Clocked::default());
        three.admit_at(&call, then).unwrap();
        for stage in [&two.0, &two.1, &three.0, &three.1, &three.2] {
            assert_eq!(*stage.0.lock().unwrap(), [then]);
        }
        // Without an instant: one reading, shared.
        three.admit(&call).unwrap();
        let at = |c: &Clocked| c.0.lock().unwrap()[1];
        assert!(at(&three.0) > then);
        assert_eq!(at(&three.0), at(&three.1));
        assert_eq!(at(&three.0), at(&three.2));
    }
}
