//! One snapshot per request: every stage's settings at one moment.
//!
//! Each stage keeps its settings in a [`Live`] cell, swapped whole by a reload. A stage built
//! on its own reads its cell. A stack built by [`Control`](crate::control::Control) also keeps
//! one [`Snapshot`] of every cell: a typed struct of `Arc`s (the control's, one field per
//! cell), replaced whole by each change under the lock that orders them; the classifier loads
//! it once, at the request's head, and hands it to every [`Call`](crate::Call) of the request,
//! so every stage of one request reads the settings of one configuration even while a reload
//! commits. A request started before a change runs under the settings it started with.
//!
//! The control binds each of its stages' cells to that cell's field of its struct
//! ([`Live::bind`], through [`Holds`]): a read is one check of whose snapshot it is and one
//! field, no search. A cell reads its own settings for a request without a snapshot, or with
//! another control's (a stack built of two).
//!
//! A leaf: it depends on no other module of the crate, so it names no stage's type; the
//! struct is behind one `dyn Any` per request, which each bound cell reads as the type it was
//! bound to.

use std::any::Any;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use arc_swap::ArcSwap;

/// Ids of owners: 0 is no owner (the empty snapshot a control holds before its first).
static NEXT_OWNER: AtomicU64 = AtomicU64::new(1);

/// Who takes snapshots and binds cells to them (one per control).
#[derive(Debug)]
pub(crate) struct Owner(u64);

impl Owner {
    /// A new owner, like no other.
    pub(crate) fn new() -> Self {
        Owner(NEXT_OWNER.fetch_add(1, Ordering::Relaxed))
    }
}

/// A struct of every cell's settings that gives the field of `T`'s cell.
pub(crate) trait Holds<T> {
    /// The settings of the cell holding a `T`.
    fn get(&self) -> &Arc<T>;
}

/// Reads a snapshot's settings as `S` and takes the field of `T`.
type Field<T> = for<'a> fn(&'a (dyn Any + Send + Sync)) -> Option<&'a Arc<T>>;

fn field<S: Holds<T> + Any, T>(settings: &(dyn Any + Send + Sync)) -> Option<&Arc<T>> {
    settings.downcast_ref::<S>().map(Holds::get)
}

/// A stage's settings: its own, swapped whole, or those of a request's [`Snapshot`].
pub(crate) struct Live<T> {
    own: ArcSwap<T>,
    /// Whose snapshots hold this cell, and where.
    bound: OnceLock<(u64, Field<T>)>,
}

impl<T: Send + Sync + 'static> Live<T> {
    /// A cell holding `value`.
    pub(crate) fn new(value: T) -> Self {
        Live {
            own: ArcSwap::from_pointee(value),
            bound: OnceLock::new(),
        }
    }

    /// The stage's own settings now: for work outside any request (ticks, sweeps) and for
    /// requests without a snapshot.
    pub(crate) fn load(&self) -> Arc<T> {
        self.own.load_full()
    }

    /// The stage's own settings now, for a short read: no reference count is touched (the
    /// guard holds one of the thread's debt slots), so the calls of every worker reading one
    /// cell do not write to it. Not to be held across an `await`.
    pub(crate) fn peek(&self) -> arc_swap::Guard<Arc<T>> {
        self.own.load()
    }

    /// Replaces the settings whole.
    pub(crate) fn store(&self, value: Arc<T>) {
        self.own.store(value);
    }

    /// From now on, `owner`'s snapshots, structs `S`, hold this cell's settings. A cell is
    /// bound once: a second binding is ignored (a cell belongs to one control).
    pub(crate) fn bind<S: Holds<T> + Any>(&self, owner: &Owner) {
        let _ = self.bound.set((owner.0, field::<S, T>));
    }

    /// This cell's settings in `snapshot`, if it is its owner's.
    fn in_snapshot<'a>(&self, snapshot: Option<&'a Snapshot>) -> Option<&'a Arc<T>> {
        let (snapshot, (owner, field)) = (snapshot?, self.bound.get()?);
        if snapshot.owner != *owner {
            return None;
        }
        field(&*snapshot.settings)
    }

    /// The settings a request runs under: its snapshot's (borrowed: no reference count is
    /// touched, so the requests of every worker read one snapshot without writing to it),
    /// else the stage's own.
    pub(crate) fn read<'a>(&self, snapshot: Option<&'a Snapshot>) -> Read<'a, T> {
        match self.in_snapshot(snapshot) {
            Some(settings) => Read::Snapshot(settings),
            None => Read::Own(self.peek()),
        }
    }

    /// [`read`](Self::read), shared: for a future that keeps the settings past the request's
    /// borrow.
    pub(crate) fn read_shared(&self, snapshot: Option<&Snapshot>) -> Arc<T> {
        match self.in_snapshot(snapshot) {
            Some(settings) => settings.clone(),
            None => self.load(),
        }
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for Live<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.own.load().fmt(f)
    }
}

/// A stage's settings as a request reads them ([`Live::read`]).
pub(crate) enum Read<'a, T> {
    /// Its request's snapshot's.
    Snapshot(&'a T),
    /// The stage's own now (a request without a snapshot), read without touching its
    /// reference count ([`Live::peek`]).
    Own(arc_swap::Guard<Arc<T>>),
}

impl<T> std::ops::Deref for Read<'_, T> {
    type Target = T;

    fn deref(&self) -> &T {
        match self {
            Read::Snapshot(settings) => settings,
            Read::Own(settings) => settings,
        }
    }
}

/// Every stage's settings at one moment, as one request runs under them: its owner's struct.
/// Opaque: taken by [`Control`](crate::control::Control), read by the stages' cells.
pub(crate) struct Snapshot {
    owner: u64,
    settings: Box<dyn Any + Send + Sync>,
}

impl Snapshot {
    /// `owner`'s settings now.
    pub(crate) fn new<S: Any + Send + Sync>(owner: &Owner, settings: S) -> Self {
        Snapshot {
            owner: owner.0,
            settings: Box::new(settings),
        }
    }
}

impl Default for Snapshot {
    /// No one's: every cell reads its own.
    fn default() -> Self {
        Snapshot {
            owner: 0,
            settings: Box::new(()),
        }
    }
}

impl std::fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Snapshot")
            .field("owner", &self.owner)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two cells' settings, as a control's struct holds them.
    struct Both {
        a: Arc<u32>,
        b: Arc<String>,
    }

    impl Holds<u32> for Both {
        fn get(&self) -> &Arc<u32> {
            &self.a
        }
    }

    impl Holds<String> for Both {
        fn get(&self) -> &Arc<String> {
            &self.b
        }
    }

    fn take(owner: &Owner, a: &Live<u32>, b: &Live<String>) -> Snapshot {
        Snapshot::new(
            owner,
            Both {
                a: a.load(),
                b: b.load(),
            },
        )
    }

    #[test]
    fn a_request_reads_its_snapshot_and_a_stage_alone_its_own() {
        let owner = Owner::new();
        let (a, b) = (Live::new(1u32), Live::new("one".to_owned()));
        a.bind::<Both>(&owner);
        b.bind::<Both>(&owner);
        let snap = take(&owner, &a, &b);
        a.store(Arc::new(2));
        b.store(Arc::new("two".to_owned()));
        assert_eq!(*a.read(Some(&snap)), 1);
        assert_eq!(*b.read(Some(&snap)), "one");
        assert_eq!(*a.read_shared(Some(&snap)), 1);
        assert_eq!(*a.read(None), 2);
        // A cell no control bound: its own, whatever the snapshot.
        let c = Live::new(3u32);
        assert_eq!(*c.read(Some(&snap)), 3);
        // The empty snapshot a control starts with: every cell its own.
        assert_eq!(*a.read(Some(&Snapshot::default())), 2);
    }

    #[test]
    fn a_cell_never_reads_another_owners_snapshot() {
        // Two controls, each with its cell: a request classified by the first passing a
        // stage of the second (a stack built of both) reads that stage's own settings, not
        // the first's.
        let (first, second) = (Owner::new(), Owner::new());
        let (a1, b1) = (Live::new(10u32), Live::new("first".to_owned()));
        let (a2, b2) = (Live::new(20u32), Live::new("second".to_owned()));
        for (owner, a, b) in [(&first, &a1, &b1), (&second, &a2, &b2)] {
            a.bind::<Both>(owner);
            b.bind::<Both>(owner);
        }
        let snap = take(&first, &a1, &b1);
        assert_eq!(*a1.read(Some(&snap)), 10);
        assert_eq!(*a2.read(Some(&snap)), 20);
        assert_eq!(*b2.read(Some(&snap)), "second");
        // Bound once: a second binding does not move a cell to another owner.
        a1.bind::<Both>(&second);
        assert_eq!(*a1.read(Some(&snap)), 10);
        a1.store(Arc::new(11));
        assert_eq!(*a1.read(Some(&snap)), 10, "still the first's snapshot");
    }
}
