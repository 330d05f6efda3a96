//! A call's client record: what the stage that judges clients found for a call, found once per
//! call and read by every stage after it.
//!
//! The session guard judges who a call's client is (its accepted session, or its tenant's
//! unverified pool) for itself, the budget (its allowance and its census) and the breakers;
//! each asks once or twice per call. Once an ask finds the call's accepted session, the record
//! keeps it, so such a call costs one lookup of the guard's session table. A call on an id
//! not yet accepted finds nothing to keep and looks again on each ask (it is not the hot path,
//! and its id may be accepted while it runs: the stages after see it accepted).
//!
//! The record is opaque here (the judge's own state, behind [`Any`]) and tagged with the judge
//! that found it: another judge reading it looks up its own, every time. Only the calls the
//! classifier makes keep a record; a call built by hand ([`Call::request`](crate::Call)) may be
//! asked about again after its session is forgotten, so it is looked up on every ask. A copy of
//! a call starts with an empty record: a copy may carry another session (the one the server
//! minted for an `initialize`).

use std::any::Any;
use std::fmt;
use std::sync::{Arc, OnceLock};

/// A judge's own record of a client, opaque to the call: `None` when it has none.
pub(crate) type Found = Option<Arc<dyn Any + Send + Sync>>;

/// The record the first ask found, and which judge asked (see the [module docs](self)).
pub(crate) struct Record(Option<OnceLock<(usize, Arc<dyn Any + Send + Sync>)>>);

impl Record {
    /// A record kept for the call's whole pass through the stack.
    pub(crate) fn kept() -> Self {
        Record(Some(OnceLock::new()))
    }

    /// What `judge` (any number naming the judge, the same on every ask) finds for the call:
    /// the record it found on an earlier ask, else `find`'s answer, kept if it is a record and
    /// the first kept.
    pub(crate) fn found(&self, judge: usize, find: impl FnOnce() -> Found) -> Found {
        let Some(kept) = &self.0 else {
            return find();
        };
        if let Some((by, found)) = kept.get() {
            return if *by == judge {
                Some(found.clone())
            } else {
                find()
            };
        }
        let found = find();
        if let Some(record) = &found {
            let _ = kept.set((judge, record.clone()));
        }
        found
    }
}

impl Default for Record {
    /// Not kept: every ask finds afresh.
    fn default() -> Self {
        Record(None)
    }
}

impl Clone for Record {
    /// Kept if this one is, and empty.
    fn clone(&self) -> Self {
        Record(self.0.as_ref().map(|_| OnceLock::new()))
    }
}

impl fmt::Debug for Record {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.0 {
            None => "not kept",
            Some(kept) if kept.get().is_some() => "found",
            Some(_) => "empty",
        };
        f.debug_tuple("Record").field(&state).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    fn record(n: u32) -> Found {
        Some(Arc::new(n))
    }

    fn value(found: &Found) -> Option<u32> {
        found
            .as_ref()
            .and_then(|r| r.downcast_ref::<u32>())
            .copied()
    }

    #[test]
    fn a_kept_record_is_found_once_for_its_judge() {
        let r = Record::kept();
        let finds = Cell::new(0);
        let find = |n| {
            finds.set(finds.get() + 1);
            record(n)
        };
        assert_eq!(value(&r.found(1, || find(7))), Some(7));
        // Found since: the first answer stands.
        assert_eq!(value(&r.found(1, || find(8))), Some(7));
        assert_eq!(finds.get(), 1);
        // Another judge finds its own, every time.
        assert_eq!(value(&r.found(2, || find(9))), Some(9));
        assert_eq!(value(&r.found(2, || find(10))), Some(10));
        assert_eq!(finds.get(), 3);
        // Nothing found is not kept: the next ask looks again.
        let none = Record::kept();
        assert_eq!(value(&none.found(1, || None)), None);
        assert_eq!(value(&none.found(1, || record(3))), Some(3));
        assert_eq!(value(&none.found(1, || record(4))), Some(3));
    }

    #[test]
    fn a_record_not_kept_and_a_copy_find_afresh() {
        let r = Record::default();
        assert_eq!(value(&r.found(1, || record(1))), Some(1));
        assert_eq!(value(&r.found(1, || record(2))), Some(2));
        let kept = Record::kept();
        kept.found(1, || record(1));
        let copy = kept.clone();
        assert_eq!(value(&copy.found(1, || record(5))), Some(5));
        assert_eq!(value(&copy.found(1, || record(6))), Some(5));
        assert_eq!(
            value(&Record::default().clone().found(1, || record(4))),
            Some(4)
        );
        assert_eq!(
            format!("{kept:?} {copy:?}"),
            "Record(\"found\") Record(\"found\")"
        );
    }
}
