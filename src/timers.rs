//! When each stream next needs attention: a min-heap of (deadline, slot) entries, so timers cost
//! O(log n) per event and never a scan of all streams, plus a small table by slot of the time
//! each stream's entry holds and of its deadline as last computed.
//!
//! Entries are re-armed lazily. A packet usually moves its stream's deadline later (the stream
//! timeout, an idle flush), and moving the heap entry each time would cost a sift per packet;
//! instead the table takes the new deadline and the old entry stays. When it falls due, the
//! table says the deadline has moved and the entry is pushed again at it, without reading the
//! stream: with thousands of streams a stream is cold in the cache, and a timer reading six of
//! its lines for every lazy entry was most of the misses not in a packet's own lines
//! (docs/performance.md, section 11). The table is 16 bytes a stream, dense, so it stays cached.
//!
//! The recorded deadline must never be later than the stream's real one (it may be earlier:
//! the stream is then read, and the entry re-armed at the real time). The gateway records it
//! after every change that can bring a deadline nearer: a packet, a timer's work.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::time::Time;

/// Heap entries reserved per slot: one live, and room for as many superseded (an entry is
/// superseded when a deadline moves earlier, as when text follows an idle flush).
const ROOM_PER_SLOT: usize = 2;

#[derive(Debug, Clone, Copy)]
struct Slot {
    /// The time of this slot's live heap entry ([`Time::NEVER`]: none). Entries with another
    /// time are superseded and skipped when popped.
    entry: Time,
    /// The stream's deadline as last recorded: no later than the real one.
    due: Time,
}

const EMPTY: Slot = Slot {
    entry: Time::NEVER,
    due: Time::NEVER,
};

#[derive(Debug, Default)]
pub struct Timers {
    heap: BinaryHeap<Reverse<(Time, u32)>>,
    slots: Vec<Slot>,
}

impl Timers {
    /// The earliest entry: no later than any recorded deadline (it may be a lazy one, which
    /// then only re-arms).
    pub fn next(&self) -> Option<Time> {
        self.heap.peek().map(|Reverse((t, _))| *t)
    }

    /// Records `slot`'s deadline, and pushes an entry for it unless the slot's entry is already
    /// no later.
    #[inline]
    pub fn set(&mut self, slot: u32, due: Time) {
        let i = slot as usize;
        if i >= self.slots.len() {
            // Once per slot the slab hands out: a stream's creation, not a packet.
            self.slots.resize(i + 1, EMPTY);
            let room = ROOM_PER_SLOT * self.slots.len();
            self.heap.reserve(room.saturating_sub(self.heap.len()));
        }
        let s = &mut self.slots[i];
        s.due = due;
        if s.entry > due {
            s.entry = due;
            if self.heap.len() == self.heap.capacity() {
                self.compact();
            }
            self.heap.push(Reverse((due, slot)));
        }
    }

    /// Drops superseded entries. Called when the heap is full: it has room for
    /// [`ROOM_PER_SLOT`] entries a slot and each slot has at most one live entry, so at least
    /// half of them are superseded, and the pushes that superseded them pay for the O(n) pass.
    /// The heap never grows on a packet.
    #[cold]
    fn compact(&mut self) {
        let slots = &self.slots;
        self.heap.retain(|Reverse((at, slot))| {
            slots.get(*slot as usize).is_some_and(|s| s.entry == *at)
        });
    }

    /// The slot's stream is gone: its entries are skipped from now on.
    pub fn remove(&mut self, slot: u32) {
        if let Some(s) = self.slots.get_mut(slot as usize) {
            *s = EMPTY;
        }
    }

    /// The next entry due by `now` whose recorded deadline is due too, as `(deadline, slot)`,
    /// in time order. The slot is left without an entry: the caller does the stream's work and
    /// records its next deadline. Superseded entries are dropped, and lazy ones pushed again at
    /// their recorded deadline, on the way.
    pub fn pop_due(&mut self, now: Time) -> Option<(Time, u32)> {
        while let Some(&Reverse((at, slot))) = self.heap.peek() {
            if at > now {
                return None;
            }
            self.heap.pop();
            let Some(s) = self.slots.get_mut(slot as usize) else {
                continue;
            };
            if s.entry != at {
                continue;
            }
            if s.due > at {
                s.entry = s.due;
                self.heap.push(Reverse((s.due, slot)));
                continue;
            }
            s.entry = Time::NEVER;
            return Some((at, slot));
        }
        None
    }

    /// Loads the slot's line of the table, which the slot's next packet writes, for
    /// [`crate::Gateway::warm`].
    #[inline]
    pub fn touch(&self, slot: u32) -> u64 {
        self.slots.get(slot as usize).map_or(0, |s| s.due.0)
    }

    /// No stream left (shutdown).
    pub fn clear(&mut self) {
        self.heap.clear();
        self.slots.clear();
    }

    /// Heap entries, live and superseded.
    #[cfg(test)]
    fn entries(&self) -> usize {
        self.heap.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(t: &mut Timers, now: u64) -> Vec<(u64, u32)> {
        std::iter::from_fn(|| t.pop_due(Time(now)))
            .map(|(at, slot)| (at.0, slot))
            .collect()
    }

    #[test]
    fn deadlines_fire_in_time_order_and_only_when_due() {
        let mut t = Timers::default();
        t.set(2, Time(30));
        t.set(0, Time(10));
        t.set(1, Time(20));
        assert_eq!(t.next(), Some(Time(10)));
        assert_eq!(drain(&mut t, 5), vec![]);
        assert_eq!(drain(&mut t, 20), vec![(10, 0), (20, 1)]);
        assert_eq!(drain(&mut t, 100), vec![(30, 2)]);
        assert_eq!(t.next(), None);
    }

    #[test]
    fn a_later_deadline_rearms_lazily_and_fires_at_its_own_time() {
        let mut t = Timers::default();
        t.set(0, Time(10));
        t.set(0, Time(25)); // a packet moved it: no new entry yet
        assert_eq!(t.entries(), 1);
        assert_eq!(t.next(), Some(Time(10)));
        assert_eq!(drain(&mut t, 20), vec![]);
        assert_eq!(t.next(), Some(Time(25)));
        assert_eq!(drain(&mut t, 25), vec![(25, 0)]);
    }

    #[test]
    fn an_earlier_deadline_supersedes_the_entry() {
        let mut t = Timers::default();
        t.set(0, Time(50));
        t.set(0, Time(15));
        assert_eq!(t.entries(), 2);
        // The old entry is skipped: the slot fires once.
        assert_eq!(drain(&mut t, 100), vec![(15, 0)]);
        assert_eq!(t.entries(), 0);
    }

    #[test]
    fn a_lazy_entry_overtaken_by_others_keeps_time_order() {
        let mut t = Timers::default();
        t.set(0, Time(10));
        t.set(1, Time(12));
        t.set(0, Time(14));
        assert_eq!(drain(&mut t, 100), vec![(12, 1), (14, 0)]);
    }

    #[test]
    fn removed_slots_never_fire_even_when_reused() {
        let mut t = Timers::default();
        t.set(3, Time(10));
        t.remove(3);
        assert_eq!(drain(&mut t, 100), vec![]);
        t.set(3, Time(40));
        t.remove(3);
        t.set(3, Time(60)); // a new stream in the slot
        assert_eq!(drain(&mut t, 100), vec![(60, 3)]);
    }

    #[test]
    fn superseded_entries_are_dropped_instead_of_growing_the_heap() {
        let mut t = Timers::default();
        t.set(0, Time(1_000));
        t.set(1, Time(1_000));
        let capacity = t.heap.capacity();
        // Each deadline moved earlier supersedes an entry: far more than the heap holds.
        for k in 0..100 {
            t.set(0, Time(900 - k));
            t.set(1, Time(900 - k));
        }
        assert_eq!(t.heap.capacity(), capacity);
        assert!(t.entries() <= capacity);
        assert_eq!(drain(&mut t, 2_000), vec![(801, 0), (801, 1)]);
    }

    #[test]
    fn a_fired_slot_is_armed_again_by_its_next_deadline() {
        let mut t = Timers::default();
        t.set(0, Time(10));
        assert_eq!(drain(&mut t, 10), vec![(10, 0)]);
        t.set(0, Time(20));
        assert_eq!(drain(&mut t, 30), vec![(20, 0)]);
        t.set(0, Time::NEVER);
        assert_eq!(t.next(), None);
    }
}
