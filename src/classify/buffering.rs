//! The memory every body being buffered at once may take: one budget of bytes for the whole
//! layer, reserved before a body is read and given back when it has been read (or dropped), so
//! many slow or stalled clients cannot hold more than the cap between them.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The bytes of bodies being buffered now, against a cap.
#[derive(Debug)]
pub(crate) struct Buffering {
    in_use: AtomicUsize,
}

/// Bytes reserved for one body; given back on drop.
#[derive(Debug)]
pub(crate) struct Reservation {
    budget: Arc<Buffering>,
    bytes: usize,
}

impl Buffering {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Buffering {
            in_use: AtomicUsize::new(0),
        })
    }

    /// Reserves `bytes` if they fit under `cap` with every body being read now.
    pub(crate) fn reserve(self: &Arc<Self>, bytes: usize, cap: usize) -> Option<Reservation> {
        self.in_use
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|&n| n <= cap)
            })
            .ok()?;
        Some(Reservation {
            budget: self.clone(),
            bytes,
        })
    }

    /// Bytes reserved now.
    pub(crate) fn in_use(&self) -> usize {
        self.in_use.load(Ordering::Acquire)
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget.in_use.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_fit_under_the_cap_and_give_back_on_drop() {
        let b = Buffering::new();
        let r1 = b.reserve(60, 100).unwrap();
        assert!(b.reserve(41, 100).is_none(), "would pass the cap");
        let r2 = b.reserve(40, 100).unwrap();
        assert_eq!(b.in_use(), 100);
        drop(r1);
        assert_eq!(b.in_use(), 40);
        drop(r2);
        assert_eq!(b.in_use(), 0);
        assert!(b.reserve(usize::MAX, usize::MAX).is_some());
    }
}
