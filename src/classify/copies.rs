//! The copies of the service a classify layer was built around: one kept per thread between
//! requests.
//!
//! A request reads its body before it calls the rest of the stack, so it needs a service of its
//! own. A fresh copy per request is a write to every shared reference count the stack below
//! holds (each stage's state, the MCP service's), made on whichever worker runs the request and
//! undone when it ends: with two workers, those are the same cache lines written by both. So a
//! copy is handed back once its request has called it and kept for the next request on the
//! same thread (one per thread), and only a request that finds none at hand copies the
//! original: the first on a thread, or one whose thread is still reading another request's
//! body.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};

/// How many copies are kept: one per thread up to this many threads at once (a thread past
/// them shares a slot with another, and copies when that one is busy).
const SLOTS: usize = 32;

/// The service a classify layer was built around and a copy of it kept per thread.
pub(super) struct Copies<S> {
    /// The service as built, copied when a thread has no copy at hand (under a lock, so a
    /// service that is `Send` but not `Sync`, such as tower's `BoxCloneService`, can be
    /// shared).
    original: Mutex<S>,
    /// The copy each thread's last request handed back, if no other request took it since:
    /// the slot of the thread's [`slot`] (so locked by that thread alone, unless more threads
    /// than slots run requests).
    idle: Box<[Slot<S>]>,
}

/// One thread's idle copy, on a cache line of its own (so no two threads write one line).
#[repr(align(128))]
struct Slot<S>(Mutex<Option<S>>);

/// This thread's slot: threads are numbered as they first ask.
fn slot() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static SLOT: usize = NEXT.fetch_add(1, Ordering::Relaxed) % SLOTS;
    }
    SLOT.with(|s| *s)
}

impl<S> Copies<S> {
    pub(super) fn new(original: S) -> Self {
        Copies {
            original: Mutex::new(original),
            idle: (0..SLOTS).map(|_| Slot(Mutex::new(None))).collect(),
        }
    }
}

impl<S: Clone> Copies<S> {
    /// A copy for one request: this thread's idle one, else a fresh copy of the original.
    /// Not readied: the caller readies it before calling it, as with any tower service.
    pub(super) fn take(&self) -> S {
        let idle = self.idle[slot()]
            .0
            .try_lock()
            .ok()
            .and_then(|mut s| s.take());
        idle.unwrap_or_else(|| self.fresh())
    }

    /// Keeps `copy`, called by its request, for this thread's next request (the copy kept
    /// before, if one is, is dropped: one copy per thread).
    pub(super) fn give_back(&self, copy: S) {
        let before = match self.idle[slot()].0.try_lock() {
            Ok(mut idle) => idle.replace(copy),
            Err(_) => Some(copy),
        };
        drop(before);
    }

    fn fresh(&self) -> S {
        self.original
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl<S: fmt::Debug> fmt::Debug for Copies<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Copies")
            .field("original", &self.original)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// Counts the copies made of it, and which copy it is.
    struct Counted {
        made: Arc<AtomicUsize>,
        n: usize,
    }

    impl Clone for Counted {
        fn clone(&self) -> Self {
            let n = self.made.fetch_add(1, Ordering::Relaxed) + 1;
            Counted {
                made: self.made.clone(),
                n,
            }
        }
    }

    fn copies() -> (Copies<Counted>, Arc<AtomicUsize>) {
        let made = Arc::new(AtomicUsize::new(0));
        let original = Counted {
            made: made.clone(),
            n: 0,
        };
        (Copies::new(original), made)
    }

    #[test]
    fn a_copy_handed_back_serves_the_threads_next_request() {
        let (copies, made) = copies();
        let first = copies.take();
        assert_eq!((first.n, made.load(Ordering::Relaxed)), (1, 1));
        copies.give_back(first);
        let again = copies.take();
        assert_eq!(again.n, 1, "the copy handed back");
        assert_eq!(made.load(Ordering::Relaxed), 1, "no copy made");
        // Two requests at once on one thread: the second has none at hand and copies.
        let other = copies.take();
        assert_eq!((other.n, made.load(Ordering::Relaxed)), (2, 2));
        // Both handed back: one is kept, the last.
        copies.give_back(again);
        copies.give_back(other);
        assert_eq!(copies.take().n, 2);
        assert_eq!(copies.take().n, 3, "nothing more kept: a fresh copy");
    }

    #[test]
    fn a_thread_never_takes_another_threads_copy() {
        let (copies, made) = copies();
        copies.give_back(copies.take());
        std::thread::scope(|s| {
            s.spawn(|| {
                let there = copies.take();
                assert_eq!(there.n, 2, "a copy of its own");
                copies.give_back(there);
            });
        });
        assert_eq!(copies.take().n, 1, "this thread's copy is still its own");
        assert_eq!(made.load(Ordering::Relaxed), 2);
    }
}
