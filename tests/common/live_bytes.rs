//! A global allocator counting this thread's live heap bytes while armed, for tests that show
//! what a piece of work leaves allocated. A test binary includes it with
//! `#[path = "common/live_bytes.rs"] mod live_bytes;` (it installs the global allocator).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// Counts this thread's live heap bytes while armed (allocated less freed).
struct Counting;

thread_local! {
    static ARMED: Cell<bool> = const { Cell::new(false) };
    static LIVE: Cell<i64> = const { Cell::new(0) };
}

fn note_live(delta: i64) {
    if ARMED.try_with(Cell::get).unwrap_or(false) {
        let _ = LIVE.try_with(|c| c.set(c.get() + delta));
    }
}

// SAFETY: every call is forwarded unchanged to `System`; counting touches only const-initialised
// thread-locals without destructors, which never allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note_live(layout.size() as i64);
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note_live(layout.size() as i64);
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note_live(new_size as i64 - layout.size() as i64);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        note_live(-(layout.size() as i64));
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Net bytes this thread's `f` left allocated.
pub fn retained<R>(f: impl FnOnce() -> R) -> (i64, R) {
    LIVE.with(|c| c.set(0));
    ARMED.with(|a| a.set(true));
    let r = f();
    ARMED.with(|a| a.set(false));
    (LIVE.with(Cell::get), r)
}
