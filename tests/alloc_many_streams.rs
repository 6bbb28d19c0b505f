//! 0 allocations a packet with 1,000 streams typing while the clock turns the timers' wheel: the
//! steady state tests/alloc_steady_state.rs does not reach with 2 streams or one clock reading
//! (review g, session 39).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::net::SocketAddr;

use pvp_t140::{Config, Gateway, Time, rtp};

struct Counting;

thread_local! {
    static ARMED: Cell<bool> = const { Cell::new(false) };
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: forwards to `System` unchanged; counts in const-initialised thread-locals.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if ARMED.try_with(Cell::get).unwrap_or(false) {
            let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
        }
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        if ARMED.try_with(Cell::get).unwrap_or(false) {
            let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
        }
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        if ARMED.try_with(Cell::get).unwrap_or(false) {
            let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
        }
        unsafe { System.realloc(p, l, new) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        unsafe { System.dealloc(p, l) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const PT: u8 = 98;
const STREAMS: usize = 1_000;

fn source(i: usize) -> SocketAddr {
    SocketAddr::from(([10, 7, (i >> 8) as u8, i as u8], 5004))
}

/// Every stream's next packet (3 characters, or a sentence end), round `r`.
fn round(r: u16, text: &[u8]) -> Vec<(SocketAddr, Vec<u8>)> {
    (0..STREAMS)
        .map(|i| {
            let mut p = Vec::new();
            let ssrc = 0x6000_0000 | i as u32;
            rtp::write_packet(&mut p, r == 1, PT, r, u32::from(r) * 300, ssrc, text);
            (source(i), p)
        })
        .collect()
}

fn views(packets: &[(SocketAddr, Vec<u8>)]) -> Vec<(SocketAddr, &[u8])> {
    packets.iter().map(|(s, p)| (*s, &p[..])).collect()
}

/// As the UDP loop runs the core: batches of 32 at one clock reading, the timers when due, the
/// output taken; every stream sends every 300 ms (RFC 4103 5.1), so the clock moves 300 ms a
/// round and the timers' wheel turns.
fn feed(gw: &mut Gateway, now: &mut Time, views: &[(SocketAddr, &[u8])]) -> u64 {
    let step = 300_000 / views.len() as u64;
    let mut envelopes = 0;
    for part in views.chunks(pvp_t140::gateway::WARM_BATCH) {
        *now = now.plus_us(step * part.len() as u64);
        if gw.poll_timeout().is_some_and(|t| t <= *now) {
            gw.handle_timeout(*now);
        }
        gw.handle_batch(*now, part);
        while gw.poll_output().is_some() {
            envelopes += 1;
        }
    }
    envelopes
}

/// `tests/alloc_steady_state.rs` proves 0 allocations a packet with 2 streams (the timers'
/// small heap only: the wheel takes entries past the first 64) and with 4,160 streams at one
/// clock reading (the wheel never turns). Here 1,000 streams type for 80 s of clock, so every
/// lazy entry goes round the wheel: the steady state must allocate nothing there either.
#[test]
fn many_streams_typing_while_the_clock_moves_do_not_allocate() {
    let mut gw = Gateway::new(Config {
        t140_pt: PT,
        max_streams: STREAMS + 1,
        max_chunk_chars: 100_000,
        max_pps_per_source: 0,
        ..Config::default()
    });
    let mut now = Time::from_millis(1_700_000_000_000);
    let mut seq = 0u16;
    // Warm-up, twice: 120 rounds of typing (36 s) then a sentence end, so every buffer has
    // the capacity the measured rounds need.
    for _ in 0..2 {
        for _ in 0..120 {
            seq += 1;
            feed(&mut gw, &mut now, &views(&round(seq, b"abc")));
        }
        seq += 1;
        feed(&mut gw, &mut now, &views(&round(seq, b". ")));
    }
    assert_eq!(gw.live_streams(), STREAMS);
    // 100 rounds (30 s) of typing, under the warm-up's length: nothing is sent.
    let rounds: Vec<_> = (0..100)
        .map(|_| {
            seq += 1;
            round(seq, b"abc")
        })
        .collect();
    let rounds: Vec<Vec<(SocketAddr, &[u8])>> = rounds.iter().map(|r| views(r)).collect();
    let before = gw.stats();
    ALLOCS.with(|c| c.set(0));
    ARMED.with(|a| a.set(true));
    let mut envelopes = 0;
    for r in &rounds {
        envelopes += feed(&mut gw, &mut now, r);
    }
    ARMED.with(|a| a.set(false));
    let allocs = ALLOCS.with(Cell::get);
    let after = gw.stats();
    assert_eq!(after.datagrams - before.datagrams, 100 * STREAMS as u64);
    assert_eq!(after.drops_total(), 0);
    assert_eq!(envelopes, 0);
    assert_eq!(
        allocs,
        0,
        "{} packets of {STREAMS} streams over 30 s made {allocs} allocations",
        100 * STREAMS
    );
}
