//! One snapshot per request: every stage's settings at one moment.
//!
//! Each stage keeps its settings in a [`Live`] cell, swapped whole by a reload. A stage built
//! on its own reads its cell. A stack built by [`Control`](crate::control::Control) also keeps
//! one [`Snapshot`] of every cell, replaced whole by each change under the lock that orders
//! them; the classifier loads it once, at the request's head, and hands it to every
//! [`Call`](crate::Call) of the request, so every stage of one request reads the settings of
//! one configuration even while a reload commits. A request started before a change runs
//! under the settings it started with.
//!
//! A leaf: it depends on no other module of the crate.

use std::any::Any;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arc_swap::ArcSwap;

/// Ids of cells: a snapshot finds a stage's settings by the id of its cell.
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

/// A stage's settings: its own, swapped whole, or those of a request's [`Snapshot`].
pub(crate) struct Live<T> {
    id: u64,
    own: ArcSwap<T>,
}

impl<T: Send + Sync + 'static> Live<T> {
    /// A cell holding `value`.
    pub(crate) fn new(value: T) -> Self {
        Live {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            own: ArcSwap::from_pointee(value),
        }
    }

    /// The stage's own settings now: for work outside any request (ticks, sweeps) and for
    /// requests without a snapshot.
    pub(crate) fn load(&self) -> Arc<T> {
        self.own.load_full()
    }

    /// Replaces the settings whole.
    pub(crate) fn store(&self, value: Arc<T>) {
        self.own.store(value);
    }

    /// The settings a request runs under: its snapshot's (borrowed: no reference count is
    /// touched, so the requests of every worker read one snapshot without writing to it),
    /// else the stage's own.
    pub(crate) fn read<'a>(&self, snapshot: Option<&'a Snapshot>) -> Read<'a, T> {
        match snapshot.and_then(|s| s.get(self.id)) {
            Some(settings) => Read::Snapshot(settings),
            None => Read::Own(self.load()),
        }
    }

    /// [`read`](Self::read), shared: for a future that keeps the settings past the request's
    /// borrow.
    pub(crate) fn read_shared(&self, snapshot: Option<&Snapshot>) -> Arc<T> {
        snapshot
            .and_then(|s| s.get_shared(self.id))
            .unwrap_or_else(|| self.load())
    }

    /// The cell's entry in a snapshot taken now.
    pub(crate) fn part(&self) -> Part {
        Part(self.id, self.load())
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
    /// The stage's own now (a request without a snapshot).
    Own(Arc<T>),
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

/// One cell's settings in a snapshot.
pub(crate) struct Part(u64, Arc<dyn Any + Send + Sync>);

/// Every stage's settings at one moment, as one request runs under them. Opaque: built by
/// [`Control`](crate::control::Control), read by the stages.
#[derive(Default)]
pub(crate) struct Snapshot {
    parts: Vec<Part>,
}

impl Snapshot {
    /// A snapshot of these cells' settings.
    pub(crate) fn of(parts: impl IntoIterator<Item = Part>) -> Self {
        Snapshot {
            parts: parts.into_iter().collect(),
        }
    }

    fn part(&self, id: u64) -> Option<&Arc<dyn Any + Send + Sync>> {
        self.parts
            .iter()
            .find(|Part(i, _)| *i == id)
            .map(|Part(_, v)| v)
    }

    fn get<T: Send + Sync + 'static>(&self, id: u64) -> Option<&T> {
        self.part(id)?.downcast_ref()
    }

    fn get_shared<T: Send + Sync + 'static>(&self, id: u64) -> Option<Arc<T>> {
        self.part(id)?.clone().downcast().ok()
    }
}

impl std::fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Snapshot")
            .field("parts", &self.parts.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_reads_its_snapshot_and_a_stage_alone_its_own() {
        let a = Live::new(1u32);
        let b = Live::new("one");
        let snap = Snapshot::of([a.part(), b.part()]);
        a.store(Arc::new(2));
        b.store(Arc::new("two"));
        assert_eq!(*a.read(Some(&snap)), 1);
        assert_eq!(*b.read(Some(&snap)), "one");
        assert_eq!(*a.read(None), 2);
        // A cell the snapshot does not hold: the stage's own.
        let c = Live::new(3u32);
        assert_eq!(*c.read(Some(&snap)), 3);
    }
}
