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

/// A wait no longer than this is ever told (the session window is at most a few minutes):
/// an entry whose time lies further ahead is older than the clock's wrap (49 days) and is
/// judged new.
const LONGEST_WAIT_MS: u32 = 3_600_000;

/// The ids that came back as told. Each slot holds 31 bits of its id's key (the rest of the
/// key picks the slot), whether its last call came back as told, and when it was last told
/// to come back, in ms since the guard began (wrapping).
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

/// What a slot holds for one id.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Entry {
    /// Its call came back as told (at or after `until`).
    returned: bool,
    /// When it was last told to come back, ms (wrapping).
    until: u32,
}

/// The tag of a key: its high bits, never zero (an empty slot is zero).
fn tag(key: u64) -> u64 {
    (key >> 33) | (1 << 30)
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
        (v >> 33 == tag(key)).then_some(Entry {
            returned: v & (1 << 32) != 0,
            until: v as u32,
        })
    }

    fn store(&self, key: u64, e: Entry) {
        let v = (tag(key) << 33) | (u64::from(e.returned) << 32) | u64::from(e.until);
        self.slot(key).store(v, Ordering::Relaxed);
    }

    /// A call on `key` arrives at `now` (ns): whether it comes back as told, at or after the
    /// time its id's last refusal named. An id new to the table is noted as told nothing (its
    /// next call comes back); one that comes back early keeps its time.
    pub(super) fn arrive(&self, key: u64, now: u64) -> bool {
        let now = ms(now);
        let (returned, until) = match self.load(key) {
            None => (false, now),
            Some(e) => {
                // Behind now (wrapping past u32::MAX) or impossibly far ahead: over.
                let ahead = e.until.wrapping_sub(now);
                if ahead == 0 || ahead > LONGEST_WAIT_MS {
                    (true, now)
                } else {
                    (false, e.until)
                }
            }
        };
        self.store(key, Entry { returned, until });
        returned
    }

    /// A call on `key` was refused and told to come back at `until` (ns).
    pub(super) fn told(&self, key: u64, until: u64) {
        self.store(
            key,
            Entry {
                returned: false,
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
                returned: false,
                until: ms(now),
            },
        );
    }

    /// Whether the last call on `key` came back as told.
    pub(super) fn returned(&self, key: u64) -> bool {
        self.load(key).is_some_and(|e| e.returned)
    }
}

/// ns as wrapping ms.
fn ms(ns: u64) -> u32 {
    (ns / 1_000_000) as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn an_id_comes_back_as_told_only_after_its_wait() {
        let t = Returning::new();
        assert!(!t.arrive(7, 0), "new");
        assert!(!t.returned(7));
        assert!(
            t.arrive(7, 5 * MS),
            "told nothing: its next call comes back"
        );
        assert!(t.returned(7));
        t.told(7, 105 * MS);
        assert!(!t.arrive(7, 50 * MS), "early");
        assert!(!t.returned(7));
        assert!(!t.arrive(7, 104 * MS), "still early: the time is kept");
        assert!(t.arrive(7, 105 * MS));
        assert!(t.returned(7));
    }

    #[test]
    fn a_minted_ids_first_call_comes_back_as_told() {
        let t = Returning::new();
        t.minted(7, 5 * MS + 1);
        assert!(t.arrive(7, 5 * MS + 2), "at the same ms");
    }

    #[test]
    fn times_are_compared_to_the_millisecond() {
        // A client that waits its hint from when it read the refusal comes back at or after
        // the hint's end, in whatever part of a millisecond.
        let t = Returning::new();
        t.arrive(7, 0);
        t.told(7, 10 * MS + 900_000);
        assert!(!t.arrive(7, 9 * MS + 999_999));
        assert!(t.arrive(7, 10 * MS + 100));
    }

    #[test]
    fn an_id_pushed_out_of_its_slot_is_new_again() {
        let t = Returning::new();
        let (a, b) = (3, 3 + (1 << 40));
        t.arrive(a, 0);
        t.arrive(b, 0);
        assert!(!t.arrive(a, MS), "b took a's slot");
        assert!(t.arrive(a, 2 * MS));
    }

    #[test]
    fn a_time_read_as_further_ahead_than_any_wait_is_over() {
        let t = Returning::new();
        t.arrive(9, 0);
        t.told(9, 10 * MS);
        // The clock wrapped (after 49 days) to just over the longest wait before that time.
        let now = ((1u64 << 32) + 10 - u64::from(LONGEST_WAIT_MS) - 1) * MS;
        assert!(t.arrive(9, now));
    }

    proptest! {
        /// Against a map of every id: a call comes back as told exactly when the map says so,
        /// for ids whose slots no other id touched.
        #[test]
        fn matches_a_map_for_ids_in_their_own_slots(
            ops in prop::collection::vec((0u64..8, 0u64..3, 0u64..2000), 1..200)
        ) {
            let t = Returning::new();
            let mut map = std::collections::HashMap::<u64, (bool, u64)>::new();
            let mut now = 0u64;
            for (id, op, dt) in ops {
                now += dt * MS;
                let key = id.wrapping_mul(0x9E37_79B9_7F4A_7C15);
                match op {
                    0 | 1 => {
                        let want = match map.get(&id) {
                            None => { map.insert(id, (false, now / MS)); false }
                            Some(&(_, until)) => {
                                let back = now / MS >= until;
                                let until = if back { now / MS } else { until };
                                map.insert(id, (back, until));
                                back
                            }
                        };
                        prop_assert_eq!(t.arrive(key, now), want);
                    }
                    _ => {
                        let until = now + dt * MS + dt;
                        t.told(key, until);
                        map.insert(id, (false, until / MS));
                    }
                }
                prop_assert_eq!(t.returned(key), map.get(&id).is_some_and(|e| e.0));
            }
        }
    }
}
