//! Which ids the server has not accepted came back as told: a fixed table, sized at start,
//! of when each id's last refusal told it to come back. A tenant's newcomer places go only to
//! ids that did (see [`SessionGuard::accept`](super::SessionGuard::accept)): a client that waits
//! its hint shows it reads them, and ids made up per call, which never come back, take none.
//!
//! The table is direct-mapped: an id's slot is fixed by its key, and a new id takes the slot
//! of whatever was there. A flood of new ids can so push an id out before it comes back; that
//! id is then judged new again (refused once more, and told again). At 800 new ids a second,
//! an id survives a 1 s wait in about 99 cases of 100.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The shortest wait a refusal of an id the server has not accepted names for its trial: a
/// client that waits at least this reads its hints (one retrying at once, or 20 ms later,
/// does not come back as told).
pub(super) const SHORTEST_WAIT: Duration = Duration::from_millis(100);

/// Slots of the table: 8 bytes each, 512 KiB in all, whatever ids clients send.
const SLOTS: usize = 1 << 16;

/// Longer than any wait a refusal names with the session window in its usual range (seconds
/// to minutes): an entry whose time lies further ahead is taken for one older than the
/// clock's wrap (49 days), and its wait as over.
const LONGEST_WAIT_MS: u32 = 3_600_000;

/// The ids that came back as told. Each slot holds 29 bits of its id's key (its lowest 16
/// pick the slot) and a mark that it is in use, how its last call stood, and when it was last
/// told to come back, in ms since the guard began (wrapping).
pub(super) struct Returning {
    slots: Box<[AtomicU64]>,
}

impl std::fmt::Debug for Returning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Returning")
            .field("slots", &self.slots.len())
            .finish()
    }
}

/// How a call on an id the server has not accepted stands as it arrives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Standing {
    /// The first call of the id the table knows of: told nothing yet.
    New,
    /// At or after the time its id's last refusal named (or told nothing).
    Returned,
    /// Before that time: its client did not wait its hint.
    Early,
}

/// What a slot holds for one id.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Entry {
    /// How its last call stood.
    last: Standing,
    /// When it was last told to come back, ms (wrapping).
    until: u32,
}

/// The tag of a key: its high bits, never zero (an empty slot is zero).
fn tag(key: u64) -> u64 {
    (key >> 35) | (1 << 28)
}

impl Returning {
    /// An empty table.
    pub(super) fn new() -> Self {
        Returning {
            slots: (0..SLOTS).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    fn slot(&self, key: u64) -> &AtomicU64 {
        &self.slots[(key as usize) & (SLOTS - 1)]
    }

    fn load(&self, key: u64) -> Option<Entry> {
        let v = self.slot(key).load(Ordering::Relaxed);
        let last = match (v >> 32) & 3 {
            0 => Standing::New,
            1 => Standing::Returned,
            _ => Standing::Early,
        };
        (v >> 34 == tag(key)).then_some(Entry {
            last,
            until: v as u32,
        })
    }

    fn store(&self, key: u64, e: Entry) {
        let last: u64 = match e.last {
            Standing::New => 0,
            Standing::Returned => 1,
            Standing::Early => 2,
        };
        let v = (tag(key) << 34) | (last << 32) | u64::from(e.until);
        self.slot(key).store(v, Ordering::Relaxed);
    }

    /// A call on `key` arrives at `now` (ns): how it stands against the time its id's last
    /// refusal named. An id new to the table is noted as told nothing (its next call comes
    /// back as told); one that comes back early keeps its time.
    pub(super) fn arrive(&self, key: u64, now: u64) -> Standing {
        let now = ms(now);
        let (last, until) = match self.load(key) {
            None => (Standing::New, now),
            Some(e) if over(e.until, now) => (Standing::Returned, now),
            Some(e) => (Standing::Early, e.until),
        };
        self.store(key, Entry { last, until });
        last
    }

    /// Whether a call on `key` arriving at `now` (ns) would come back early.
    pub(super) fn early(&self, key: u64, now: u64) -> bool {
        self.load(key).is_some_and(|e| !over(e.until, ms(now)))
    }

    /// A call on `key` was refused and told to come back at `until` (ns).
    pub(super) fn told(&self, key: u64, until: u64) {
        let last = self.last(key).unwrap_or(Standing::New);
        self.store(
            key,
            Entry {
                last,
                until: ms(until),
            },
        );
    }

    /// The server minted `key` at `now` (ns): told nothing, so its next call comes back as
    /// told.
    pub(super) fn minted(&self, key: u64, now: u64) {
        self.store(
            key,
            Entry {
                last: Standing::New,
                until: ms(now),
            },
        );
    }

    /// How the last call on `key` stood, if the table holds it.
    pub(super) fn last(&self, key: u64) -> Option<Standing> {
        self.load(key).map(|e| e.last)
    }
}

/// Whether a wait until `until` is over at `now` (ms): behind it (wrapping past `u32::MAX`),
/// or impossibly far ahead.
fn over(until: u32, now: u32) -> bool {
    let ahead = until.wrapping_sub(now);
    ahead == 0 || ahead > LONGEST_WAIT_MS
}

/// ns as wrapping ms.
fn ms(ns: u64) -> u32 {
    (ns / 1_000_000) as u32
}

#[cfg(test)]
mod tests {
    use super::Standing::{Early, New, Returned};
    use super::*;
    use proptest::prelude::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn an_id_comes_back_as_told_only_after_its_wait() {
        let t = Returning::new();
        assert_eq!(t.arrive(7, 0), New);
        assert_eq!(t.last(7), Some(New));
        assert_eq!(t.arrive(7, 5 * MS), Returned, "told nothing: its next call");
        t.told(7, 105 * MS);
        assert_eq!(
            t.last(7),
            Some(Returned),
            "the refused call's standing is kept"
        );
        assert!(t.early(7, 50 * MS) && !t.early(7, 105 * MS));
        assert_eq!(t.arrive(7, 50 * MS), Early);
        assert_eq!(t.arrive(7, 104 * MS), Early, "the time is kept");
        assert_eq!(t.last(7), Some(Early));
        assert_eq!(t.arrive(7, 105 * MS), Returned);
        assert_eq!(t.last(8), None);
    }

    #[test]
    fn a_minted_ids_first_call_comes_back_as_told() {
        let t = Returning::new();
        t.minted(7, 5 * MS + 1);
        assert_eq!(t.arrive(7, 5 * MS + 2), Returned, "at the same ms");
    }

    #[test]
    fn times_are_compared_to_the_millisecond() {
        // A client that waits its hint from when it read the refusal comes back at or after
        // the hint's end, in whatever part of a millisecond.
        let t = Returning::new();
        t.arrive(7, 0);
        t.told(7, 10 * MS + 900_000);
        assert_eq!(t.arrive(7, 9 * MS + 999_999), Early);
        assert_eq!(t.arrive(7, 10 * MS + 100), Returned);
    }

    #[test]
    fn an_id_pushed_out_of_its_slot_is_new_again() {
        let t = Returning::new();
        let (a, b) = (3, 3 + (1 << 40));
        t.arrive(a, 0);
        t.arrive(b, 0);
        assert_eq!(t.arrive(a, MS), New, "b took a's slot");
        assert_eq!(t.arrive(a, 2 * MS), Returned);
    }

    #[test]
    fn a_time_read_as_further_ahead_than_any_wait_is_over() {
        let t = Returning::new();
        t.arrive(9, 0);
        t.told(9, 10 * MS);
        // The clock wrapped (after 49 days) to just over the longest wait before that time.
        let now = ((1u64 << 32) + 10 - u64::from(LONGEST_WAIT_MS) - 1) * MS;
        assert_eq!(t.arrive(9, now), Returned);
    }

    proptest! {
        /// Against a map of every id: each call stands as the map says, for ids whose slots
        /// no other id touched.
        #[test]
        fn matches_a_map_for_ids_in_their_own_slots(
            ops in prop::collection::vec((0u64..8, 0u64..3, 0u64..2000), 1..200)
        ) {
            let t = Returning::new();
            let mut map = std::collections::HashMap::<u64, (Standing, u64)>::new();
            let mut now = 0u64;
            for (id, op, dt) in ops {
                now += dt * MS;
                let key = id.wrapping_mul(0x9E37_79B9_7F4A_7C15);
                match op {
                    0 | 1 => {
                        let want = match map.get(&id) {
                            None => (New, now / MS),
                            Some(&(_, until)) if now / MS >= until => (Returned, now / MS),
                            Some(&(_, until)) => (Early, until),
                        };
                        map.insert(id, want);
                        prop_assert_eq!(t.arrive(key, now), want.0);
                    }
                    _ => {
                        let until = now + dt * MS + dt;
                        t.told(key, until);
                        let last = map.get(&id).map_or(New, |e| e.0);
                        map.insert(id, (last, until / MS));
                    }
                }
                prop_assert_eq!(t.last(key), map.get(&id).map(|e| e.0));
            }
        }
    }
}
