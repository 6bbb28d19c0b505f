//! When each stream next needs attention: a timing wheel of 16 ms ticks spanning 67 s for the
//! deadlines ahead, a small min-heap for those within the current tick (and any beyond the
//! wheel), plus a small table by slot of the time each stream's entry holds and of its deadline
//! as last computed. Timers cost O(1) per entry and never a scan of all streams; deadlines fire
//! exactly at their own microsecond, in (time, slot) order.
//!
//! Entries are re-armed lazily. A packet usually moves its stream's deadline later (the stream
//! timeout, an idle flush), and moving the entry each time would cost work per packet; instead
//! the table takes the new deadline and the old entry stays. When its tick comes round, the
//! table says the deadline has moved and the entry is put in the wheel again at it, without
//! reading the stream: with thousands of streams a stream is cold in the cache, and a timer
//! reading six of its lines for every lazy entry was most of the misses not in a packet's own
//! lines (docs/performance.md, section 11). The table is 16 bytes a stream, dense, so it stays
//! cached.
//!
//! Why a wheel: with 10,000 streams typing, a lazy entry falls due every six or seven packets,
//! and popping it from a heap of every stream's entry (a sift through 14 levels, the lower ones
//! out of the first-level cache) and pushing it back was about 350 instructions and a sixth of a
//! packet's time (docs/performance.md, section 23). Through the wheel it is a copy between two
//! blocks of entries that are read in order.
//!
//! The recorded deadline must never be later than the stream's real one (it may be earlier:
//! the stream is then read, and the entry re-armed at the real time). The gateway records it
//! after every change that can bring a deadline nearer: a packet, a timer's work.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::time::Time;

/// Entries reserved per slot: one live, and room for as many superseded (an entry is
/// superseded when a deadline moves earlier, as when text follows an idle flush).
const ROOM_PER_SLOT: usize = 2;

/// A tick is 2^14 µs (16.4 ms): with 10,000 streams typing, about 80 entries fall in a tick.
const TICK_SHIFT: u32 = 14;
/// Ticks in the wheel: 4,096 ticks span 67 s, longer than the default stream timeout (60 s), so
/// every deadline the defaults give is in the wheel, not the heap.
const WHEEL: u64 = 4096;
/// `Timers::summary` has a bit per 64 buckets.
const _: () = assert!(WHEEL / 64 <= 64);
/// Entries in a block: a block is one cache line.
const PER_BLOCK: usize = 4;
/// No block.
const NIL: u32 = u32::MAX;
/// Entries the heap takes before the wheel is used: a heap this small is a few levels in the
/// first-level cache, cheaper than a trip through the wheel for a gateway with few streams
/// (the heap may hold any entry; only the wheel's are bound to its range).
const HEAP_FIRST: usize = 64;

#[derive(Debug, Clone, Copy)]
struct Slot {
    /// The time of this slot's live entry ([`Time::NEVER`]: none). Entries with another time
    /// are superseded and skipped when reached.
    entry: Time,
    /// The stream's deadline as last recorded: no later than the real one.
    due: Time,
}

const EMPTY: Slot = Slot {
    entry: Time::NEVER,
    due: Time::NEVER,
};

/// Up to [`PER_BLOCK`] entries of one tick's bucket, and the next block of the bucket.
#[derive(Debug, Clone, Copy)]
#[repr(align(64))]
struct Block {
    at: [Time; PER_BLOCK],
    slot: [u32; PER_BLOCK],
    len: u32,
    next: u32,
}

const FRESH: Block = Block {
    at: [Time::NEVER; PER_BLOCK],
    slot: [0; PER_BLOCK],
    len: 0,
    next: NIL,
};

/// One tick's entries: a chain of blocks, appended at the tail.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    head: u32,
    tail: u32,
    /// The earliest entry in the bucket.
    min: Time,
}

const EMPTY_BUCKET: Bucket = Bucket {
    head: NIL,
    tail: NIL,
    min: Time::NEVER,
};

#[derive(Debug)]
pub struct Timers {
    slots: Vec<Slot>,
    /// Entries of ticks before `cursor` (due now or within the current tick), any beyond the
    /// wheel's span, and the first [`HEAP_FIRST`] whatever their time: exactly ordered.
    heap: BinaryHeap<Reverse<(Time, u32)>>,
    /// Bucket `tick % WHEEL` holds the entries of `tick`, for ticks in
    /// `cursor..cursor + WHEEL` (made by `grow` once the room can reach the wheel).
    buckets: Vec<Bucket>,
    /// A bit per bucket: set when it holds entries.
    occupied: Vec<u64>,
    /// A bit per word of `occupied`: set when the word is not 0, so the next bucket with
    /// entries is found in a few steps however sparse the wheel is.
    summary: u64,
    /// A bit per slot, for [`Timers::compact`] (reserved with the slots).
    kept: Vec<u64>,
    /// The blocks of every bucket, and free ones chained from `free`. Reserved as slots are
    /// added, so that no entry ever allocates.
    blocks: Vec<Block>,
    free: u32,
    /// The first tick the wheel holds.
    cursor: u64,
    /// Entries in the wheel.
    in_wheel: usize,
    /// The earliest entry in the wheel ([`Time::NEVER`]: none).
    wheel_min: Time,
}

impl Default for Timers {
    fn default() -> Self {
        Timers {
            slots: Vec::new(),
            heap: BinaryHeap::new(),
            buckets: Vec::new(),
            occupied: Vec::new(),
            summary: 0,
            kept: Vec::new(),
            blocks: Vec::new(),
            free: NIL,
            cursor: 0,
            in_wheel: 0,
            wheel_min: Time::NEVER,
        }
    }
}

impl Timers {
    /// The earliest entry: no later than any recorded deadline (it may be a lazy or superseded
    /// one, which then only re-arms or is dropped).
    #[inline]
    pub fn next(&self) -> Option<Time> {
        let heap = self.heap.peek().map_or(Time::NEVER, |Reverse((t, _))| *t);
        let t = heap.min(self.wheel_min);
        (t != Time::NEVER).then_some(t)
    }

    /// Records `slot`'s deadline, and adds an entry for it unless the slot's entry is already
    /// no later. `now` keeps the wheel's range up with the clock.
    #[inline]
    pub fn set(&mut self, slot: u32, due: Time, now: Time) {
        let i = slot as usize;
        if i >= self.slots.len() {
            // Once per slot the slab hands out: a stream's creation, not a packet.
            self.grow(i + 1);
        }
        let s = &mut self.slots[i];
        s.due = due;
        if s.entry > due {
            s.entry = due;
            self.add(due, slot, now);
        }
    }

    /// [`Timers::set`]'s new entry, out of line: a packet that moves its deadline later (the
    /// common case) does not carry this code.
    #[inline(never)]
    fn add(&mut self, due: Time, slot: u32, now: Time) {
        if self.heap.len() + self.in_wheel == self.capacity() {
            self.compact();
        }
        self.follow(now);
        self.insert(due, slot);
    }

    /// Entries the reserved room holds.
    fn capacity(&self) -> usize {
        ROOM_PER_SLOT * self.slots.len()
    }

    /// Room for `slots` slots: their table, and entries enough that neither the heap nor the
    /// blocks ever grow on a packet (every bucket's chain has at most one block not full).
    #[cold]
    fn grow(&mut self, slots: usize) {
        self.slots.resize(slots, EMPTY);
        self.kept.resize(slots.div_ceil(64), 0);
        let room = self.capacity();
        self.heap.reserve(room.saturating_sub(self.heap.len()));
        let blocks = room / PER_BLOCK + room.min(WHEEL as usize) + 1;
        self.blocks
            .reserve(blocks.saturating_sub(self.blocks.len()));
        // The wheel is reached once the first heap holds HEAP_FIRST entries, which needs this
        // much room: its buckets are made with the room, not by the entry that first needs them.
        if room >= HEAP_FIRST && self.buckets.is_empty() {
            self.buckets = vec![EMPTY_BUCKET; WHEEL as usize];
            self.occupied = vec![0; WHEEL as usize / 64];
        }
    }

    /// An entry at `at` for `slot`: in the heap if its tick is before the wheel's or beyond its
    /// span, else in its tick's bucket.
    #[inline]
    fn insert(&mut self, at: Time, slot: u32) {
        let tick = at.0 >> TICK_SHIFT;
        if tick < self.cursor || tick - self.cursor >= WHEEL || self.heap.len() < HEAP_FIRST {
            self.heap.push(Reverse((at, slot)));
            return;
        }
        debug_assert!(!self.buckets.is_empty(), "made by grow with the room");
        let b = (tick % WHEEL) as usize;
        let tail = self.buckets[b].tail;
        let block = if tail != NIL && (self.blocks[tail as usize].len as usize) < PER_BLOCK {
            tail
        } else {
            let new = self.take_block();
            if tail == NIL {
                self.buckets[b].head = new;
                self.occupied[b / 64] |= 1 << (b % 64);
                self.summary |= 1 << (b / 64);
            } else {
                self.blocks[tail as usize].next = new;
            }
            self.buckets[b].tail = new;
            new
        };
        let blk = &mut self.blocks[block as usize];
        let k = blk.len as usize;
        blk.at[k] = at;
        blk.slot[k] = slot;
        blk.len += 1;
        let bucket = &mut self.buckets[b];
        bucket.min = bucket.min.min(at);
        self.wheel_min = self.wheel_min.min(at);
        self.in_wheel += 1;
    }

    fn take_block(&mut self) -> u32 {
        if self.free == NIL {
            // Within the room `grow` reserved: no allocation.
            self.blocks.push(FRESH);
            return (self.blocks.len() - 1) as u32;
        }
        let b = self.free;
        let blk = &mut self.blocks[b as usize];
        self.free = blk.next;
        blk.len = 0;
        blk.next = NIL;
        b
    }

    /// Detaches bucket `b`'s chain, leaving the bucket empty.
    fn detach(&mut self, b: usize) -> u32 {
        let head = self.buckets[b].head;
        self.buckets[b] = EMPTY_BUCKET;
        self.occupied[b / 64] &= !(1 << (b % 64));
        if self.occupied[b / 64] == 0 {
            self.summary &= !(1 << (b / 64));
        }
        head
    }

    /// Empties bucket `b`, handing each entry to `each` (which may insert entries again).
    /// Each block is freed before its entries are handed out, so the chain never needs more
    /// blocks than it had.
    fn empty_bucket(&mut self, b: usize, mut each: impl FnMut(&mut Self, Time, u32)) {
        let mut block = self.detach(b);
        while block != NIL {
            let blk = &mut self.blocks[block as usize];
            let (n, at, slot, next) = (blk.len as usize, blk.at, blk.slot, blk.next);
            blk.next = self.free;
            self.free = block;
            self.in_wheel -= n;
            for k in 0..n {
                each(self, at[k], slot[k]);
            }
            block = next;
        }
    }

    /// The first tick at or after the cursor whose bucket holds entries.
    fn first_occupied(&self) -> Option<u64> {
        if self.in_wheel == 0 {
            return None;
        }
        let start = (self.cursor % WHEEL) as usize;
        let (w0, bit0) = (start / 64, start % 64);
        // In order from `start`: the rest of its word, the later words, then (the wheel's range
        // wraps round) the earlier words and the first bits of `start`'s own word.
        let rest = self.occupied[w0] & (!0u64 << bit0);
        let b = if rest != 0 {
            w0 * 64 + rest.trailing_zeros() as usize
        } else {
            // Words after `w0` (`w0` < 64, so the shift keeps at most bits 1-63).
            let later = self.summary & ((!1u64) << w0);
            let w = if later != 0 {
                later.trailing_zeros()
            } else {
                self.summary.trailing_zeros()
            } as usize;
            w * 64 + self.occupied.get(w)?.trailing_zeros() as usize
        };
        let distance = (b + WHEEL as usize - start) % WHEEL as usize;
        Some(self.cursor + distance as u64)
    }

    /// Moves the wheel's range up to `now`'s tick if no entry in the wheel is before it (then
    /// no bucket has to be emptied): a gateway whose timers rarely fall due still puts the
    /// deadlines ahead in the wheel, not in the heap as beyond its range.
    #[inline]
    fn follow(&mut self, now: Time) {
        let target = (now.0 >> TICK_SHIFT) + 1;
        if target > self.cursor && self.wheel_min.0 >> TICK_SHIFT >= target {
            self.cursor = target;
        }
    }

    /// Moves the wheel past `now`'s tick: the entries of every tick up to it go to the heap
    /// (lazy ones back into the wheel at their recorded deadline, superseded ones nowhere), so
    /// that everything due by `now` is in the heap, in order.
    #[inline]
    fn advance(&mut self, now: Time) {
        // With no entry in the ticks passed, the range just moves on.
        self.follow(now);
        let target = (now.0 >> TICK_SHIFT) + 1;
        if target > self.cursor {
            self.advance_to(target);
        }
    }

    #[cold]
    fn advance_to(&mut self, target: u64) {
        loop {
            match self.first_occupied() {
                Some(tick) if tick < target => {
                    self.cursor = tick + 1;
                    self.empty_bucket((tick % WHEEL) as usize, Self::reach);
                }
                first => {
                    self.cursor = self.cursor.max(target);
                    self.wheel_min = self.bucket_min(first);
                    return;
                }
            }
        }
    }

    /// An entry whose tick the wheel has reached: if [`Timers::due_at`], into the heap, to
    /// fire in order.
    #[inline]
    fn reach(&mut self, at: Time, slot: u32) {
        if self.due_at(at, slot) {
            self.heap.push(Reverse((at, slot)));
        }
    }

    /// Whether an entry taken out (of a bucket or the heap) is its slot's live one and its
    /// recorded deadline is its time. A superseded entry is dropped; a lazy one (the deadline
    /// has moved later) is added again at the recorded deadline.
    #[inline]
    fn due_at(&mut self, at: Time, slot: u32) -> bool {
        let Some(s) = self.slots.get_mut(slot as usize) else {
            return false;
        };
        if s.entry != at {
            return false;
        }
        if s.due > at {
            s.entry = s.due;
            let due = s.due;
            self.insert(due, slot);
            return false;
        }
        true
    }

    /// Drops superseded entries. Called when the room is full: it has room for
    /// [`ROOM_PER_SLOT`] entries a slot and each slot has at most one live entry, so at least
    /// half of them are superseded, and the additions that superseded them pay for the O(n)
    /// pass. Nothing grows on a packet.
    #[cold]
    fn compact(&mut self) {
        let (slots, kept) = (&self.slots, &mut self.kept);
        self.heap
            .retain(|Reverse((at, slot))| keep_once(slots, kept, *at, *slot));
        for w in 0..self.occupied.len() {
            let mut bits = self.occupied[w];
            while bits != 0 {
                let b = w * 64 + bits.trailing_zeros() as usize;
                bits &= bits - 1;
                self.empty_bucket(b, |t, at, slot| {
                    if keep_once(&t.slots, &mut t.kept, at, slot) {
                        t.insert(at, slot);
                    }
                });
            }
        }
        self.kept.fill(0);
        self.wheel_min = self.bucket_min(self.first_occupied());
    }

    /// The earliest entry of the bucket of `tick` ([`Time::NEVER`]: none). Of the first
    /// occupied bucket, that is the wheel's earliest entry.
    fn bucket_min(&self, tick: Option<u64>) -> Time {
        tick.map_or(Time::NEVER, |t| self.buckets[(t % WHEEL) as usize].min)
    }

    /// The slot's stream is gone: its entries are skipped from now on.
    pub fn remove(&mut self, slot: u32) {
        if let Some(s) = self.slots.get_mut(slot as usize) {
            *s = EMPTY;
        }
    }

    /// The next entry due by `now` whose recorded deadline is due too, as `(deadline, slot)`,
    /// in time order. The slot is left without an entry: the caller does the stream's work and
    /// records its next deadline. Superseded entries are dropped, and lazy ones added again at
    /// their recorded deadline, on the way.
    pub fn pop_due(&mut self, now: Time) -> Option<(Time, u32)> {
        self.advance(now);
        while let Some(&Reverse((at, slot))) = self.heap.peek() {
            if at > now {
                return None;
            }
            self.heap.pop();
            if self.due_at(at, slot) {
                self.slots[slot as usize].entry = Time::NEVER;
                return Some((at, slot));
            }
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
        *self = Timers::default();
    }

    /// Entries, live and superseded.
    #[cfg(test)]
    fn entries(&self) -> usize {
        self.heap.len() + self.in_wheel
    }
}

/// For [`Timers::compact`]: whether the entry is its slot's live one, the first time that slot
/// is seen (`kept` marks it). A superseded entry revived by a lazy re-arm landing on its time
/// is live too, and a slot can hold several such twins; keeping one keeps the room's premise
/// of at most one live entry a slot, so compaction always frees half the room.
fn keep_once(slots: &[Slot], kept: &mut [u64], at: Time, slot: u32) -> bool {
    let i = slot as usize;
    let live = slots.get(i).is_some_and(|s| s.entry == at);
    let bit = 1u64 << (i % 64);
    if !live || kept[i / 64] & bit != 0 {
        return false;
    }
    kept[i / 64] |= bit;
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Timers {
        /// [`Timers::set`] with the clock at 0: the tests move the wheel by draining it.
        fn set_at(&mut self, slot: u32, due: Time) {
            self.set(slot, due, Time(0));
        }
    }

    /// Timers whose first heap is full of deadlines beyond the wheel, so the next entries go
    /// into the wheel; returns them and the first free slot.
    fn heap_full(now: u64) -> (Timers, u32) {
        let tick = 1u64 << TICK_SHIFT;
        let mut t = Timers::default();
        for slot in 0..HEAP_FIRST as u32 {
            t.set(slot, Time(now + 3 * WHEEL * tick), Time(now));
        }
        (t, HEAP_FIRST as u32)
    }

    /// Empty timers (the next entries go into the first heap) and [`heap_full`] ones (into
    /// the wheel), each with its first free slot.
    fn heap_then_wheel(now: u64) -> [(Timers, u32); 2] {
        [(Timers::default(), 0), heap_full(now)]
    }

    fn drain(t: &mut Timers, now: u64) -> Vec<(u64, u32)> {
        std::iter::from_fn(|| t.pop_due(Time(now)))
            .map(|(at, slot)| (at.0, slot))
            .collect()
    }

    #[test]
    fn deadlines_fire_in_time_order_and_only_when_due() {
        let mut t = Timers::default();
        t.set_at(2, Time(30));
        t.set_at(0, Time(10));
        t.set_at(1, Time(20));
        assert_eq!(t.next(), Some(Time(10)));
        assert_eq!(drain(&mut t, 5), vec![]);
        assert_eq!(drain(&mut t, 20), vec![(10, 0), (20, 1)]);
        assert_eq!(drain(&mut t, 100), vec![(30, 2)]);
        assert_eq!(t.next(), None);
    }

    #[test]
    fn a_later_deadline_rearms_lazily_and_fires_at_its_own_time() {
        let mut t = Timers::default();
        t.set_at(0, Time(10));
        t.set_at(0, Time(25)); // a packet moved it: no new entry yet
        assert_eq!(t.entries(), 1);
        assert_eq!(t.next(), Some(Time(10)));
        assert_eq!(drain(&mut t, 20), vec![]);
        assert_eq!(t.next(), Some(Time(25)));
        assert_eq!(drain(&mut t, 25), vec![(25, 0)]);
    }

    #[test]
    fn an_earlier_deadline_supersedes_the_entry() {
        let mut t = Timers::default();
        t.set_at(0, Time(50));
        t.set_at(0, Time(15));
        assert_eq!(t.entries(), 2);
        // The old entry is skipped: the slot fires once.
        assert_eq!(drain(&mut t, 100), vec![(15, 0)]);
        assert_eq!(t.entries(), 0);
    }

    #[test]
    fn a_lazy_entry_overtaken_by_others_keeps_time_order() {
        let mut t = Timers::default();
        t.set_at(0, Time(10));
        t.set_at(1, Time(12));
        t.set_at(0, Time(14));
        assert_eq!(drain(&mut t, 100), vec![(12, 1), (14, 0)]);
    }

    #[test]
    fn removed_slots_never_fire_even_when_reused() {
        let mut t = Timers::default();
        t.set_at(3, Time(10));
        t.remove(3);
        assert_eq!(drain(&mut t, 100), vec![]);
        t.set_at(3, Time(40));
        t.remove(3);
        t.set_at(3, Time(60)); // a new stream in the slot
        assert_eq!(drain(&mut t, 100), vec![(60, 3)]);
    }

    #[test]
    fn superseded_entries_are_dropped_instead_of_growing_the_room() {
        let tick = 1u64 << TICK_SHIFT;
        let now = 1_000 * tick;
        for (mut t, first) in heap_then_wheel(now) {
            let (a, b, c) = (first, first + 1, first + 2);
            let base = now + 500 * tick;
            t.set(a, Time(base), Time(now));
            t.set(b, Time(base), Time(now));
            // Set once: its entry must outlive every compaction.
            t.set(c, Time(base + 7), Time(now));
            let capacity = (t.heap.capacity(), t.blocks.capacity());
            // Each deadline moved earlier (a tick at a time) supersedes an entry: far more
            // than the room holds.
            for k in 0..100 {
                t.set(a, Time(base - 100 - k * tick), Time(now));
                t.set(b, Time(base - 100 - k * tick), Time(now));
            }
            assert_eq!((t.heap.capacity(), t.blocks.capacity()), capacity);
            assert!(t.entries() <= t.capacity());
            let last = base - 100 - 99 * tick;
            assert_eq!(
                drain(&mut t, base * 2),
                vec![(last, a), (last, b), (base + 7, c)]
            );
        }
    }

    /// A lazy re-arm that lands on the time of a superseded entry revives it: the slot has two
    /// live entries at one time (harmless when they fire: the second is skipped). Compaction
    /// keeps one, so its premise, at most one live entry a slot, holds.
    #[test]
    fn compaction_keeps_one_of_revived_twins() {
        let tick = 1u64 << TICK_SHIFT;
        let now = 1_000 * tick;
        for (mut t, first) in heap_then_wheel(now) {
            let (a, far, near) = (first, Time(now + 500 * tick), Time(now + tick));
            t.set(a, far, Time(now));
            t.set(a, near, Time(now)); // earlier: a new entry, the far one superseded
            t.set(a, far, Time(now)); // later again: lazy
            // At `near` the lazy entry goes back at `far`, beside the superseded one.
            assert_eq!(drain(&mut t, near.0), vec![]);
            let others = first as usize;
            assert_eq!(t.entries(), others + 2, "twins");
            t.compact();
            assert_eq!(t.entries(), others + 1);
            assert_eq!(drain(&mut t, far.0), vec![(far.0, a)]);
        }
    }

    /// The next bucket is found past the cursor's own word and before the wheel's range wraps
    /// round to its lower indices.
    #[test]
    fn the_next_bucket_is_the_first_after_the_cursor_not_the_lowest_index() {
        let tick = 1u64 << TICK_SHIFT;
        let now = 100 * tick;
        let (mut t, a) = heap_full(now);
        let b = a + 1;
        // Bucket 300 (a word after the cursor's) and bucket 4 (tick 4,100: the range wrapped).
        t.set(a, Time(300 * tick + 5), Time(now));
        t.set(b, Time(4_100 * tick + 7), Time(now));
        assert_eq!(t.heap.len(), HEAP_FIRST);
        assert_eq!(t.in_wheel, 2);
        assert_eq!(drain(&mut t, 150 * tick), vec![]);
        assert_eq!(t.next(), Some(Time(300 * tick + 5)));
        assert_eq!(drain(&mut t, 300 * tick + 5), vec![(300 * tick + 5, a)]);
        assert_eq!(t.next(), Some(Time(4_100 * tick + 7)));
        assert_eq!(drain(&mut t, 5_000 * tick), vec![(4_100 * tick + 7, b)]);
    }

    /// Against a model (each slot's recorded deadline fires once due, in (time, slot) order):
    /// random deadlines within a tick, across ticks, beyond the wheel's span, moved later and
    /// earlier, removed, with the clock stepping a little or jumping far.
    #[test]
    fn the_wheel_fires_as_a_sorted_model_would() {
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let tick = 1u64 << TICK_SHIFT;
        for round in 0..20 {
            let mut t = Timers::default();
            let mut model: std::collections::BTreeMap<u32, u64> = Default::default();
            let mut now = 1_000_000_000 + round * 7;
            for _ in 0..6_000 {
                // Enough slots that most entries pass through the wheel, not the first heap.
                let slot = (next() % (4 * HEAP_FIRST as u64)) as u32;
                match next() % 10 {
                    0..=5 => {
                        let ahead = match next() % 4 {
                            0 => next() % tick,
                            1 => next() % (8 * tick),
                            2 => next() % (WHEEL * tick),
                            _ => next() % (3 * WHEEL * tick),
                        };
                        t.set(slot, Time(now + ahead), Time(now));
                        model.insert(slot, now + ahead);
                    }
                    6 => {
                        t.remove(slot);
                        model.remove(&slot);
                    }
                    _ => {
                        now += match next() % 8 {
                            0 => WHEEL * tick + next() % (WHEEL * tick),
                            1..=3 => next() % (4 * tick),
                            _ => next() % 2_000,
                        };
                        let mut want: Vec<(u64, u32)> = model
                            .iter()
                            .filter(|(_, at)| **at <= now)
                            .map(|(slot, at)| (*at, *slot))
                            .collect();
                        want.sort();
                        for (_, slot) in &want {
                            model.remove(slot);
                        }
                        assert_eq!(drain(&mut t, now), want, "round {round} at {now}");
                    }
                }
                let earliest = model.values().min().copied();
                match (t.next(), earliest) {
                    (Some(n), Some(e)) => assert!(n.0 <= e, "next {} after {e}", n.0),
                    (_, None) => {}
                    (None, Some(e)) => panic!("no entry for a deadline at {e}"),
                }
                assert!(t.entries() <= t.capacity());
            }
        }
    }

    #[test]
    fn a_fired_slot_is_armed_again_by_its_next_deadline() {
        let mut t = Timers::default();
        t.set_at(0, Time(10));
        assert_eq!(drain(&mut t, 10), vec![(10, 0)]);
        t.set_at(0, Time(20));
        assert_eq!(drain(&mut t, 30), vec![(20, 0)]);
        t.set_at(0, Time::NEVER);
        assert_eq!(t.next(), None);
    }
}
