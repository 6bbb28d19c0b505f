//! `Gateway::handle_batch` against `Gateway::handle_datagram`: two gateways, one fed the
//! `gateway` target's events one datagram at a time, the other fed the same datagrams as
//! batches (runs between timer wake-ups, up to 40 at once, so a batch spans two warming runs).
//! Both first hold `WARM_FROM` + 4 silent filler streams, so that warming does its work and the
//! batched gateway uses the slots it found; the fuzzed traffic then opens, ends (RTCP BYE,
//! timeouts) and evicts streams inside batches. Every envelope must be the same, byte for byte,
//! and so must the counters.
#![no_main]

use std::net::{Ipv4Addr, SocketAddr};

use libfuzzer_sys::fuzz_target;
use pvp_t140::gateway::WARM_FROM;
use pvp_t140::{Config, Gateway, Time, rtp};
use pvp_t140_fuzz::{MAX_STREAMS, config, decode, source};

const FILLERS: usize = WARM_FROM + 4;
/// Datagrams handed over at once, at most.
const BATCH: usize = 40;

fn filler(i: usize) -> (SocketAddr, Vec<u8>) {
    let source = SocketAddr::from((Ipv4Addr::new(10, 9, (i >> 8) as u8, i as u8), 6000));
    let mut p = Vec::new();
    rtp::write_packet(&mut p, true, 98, 1, 0, 0x5000_0000 | i as u32, b"");
    (source, p)
}

fn same(one: &mut Gateway, batched: &mut Gateway) {
    loop {
        match (one.poll_output(), batched.poll_output()) {
            (None, None) => break,
            (a, b) => assert_eq!(
                a.as_ref().map(|e| e.json()),
                b.as_ref().map(|e| e.json()),
                "one at a time vs batched"
            ),
        }
    }
    assert_eq!(
        format!("{:?}", one.stats()),
        format!("{:?}", batched.stats())
    );
    assert_eq!(one.live_streams(), batched.live_streams());
    assert_eq!(one.poll_timeout(), batched.poll_timeout());
}

fn handle(one: &mut Gateway, batched: &mut Gateway, now: Time, run: &[(SocketAddr, &[u8])]) {
    for &(source, d) in run {
        one.handle_datagram(now, source, d);
    }
    batched.handle_batch(now, run);
    same(one, batched);
}

fuzz_target!(|data: &[u8]| {
    let (cfg_byte, events) = decode(data);
    let cfg = || Config {
        max_streams: FILLERS + MAX_STREAMS,
        ..config(cfg_byte)
    };
    let (mut one, mut batched) = (Gateway::new(cfg()), Gateway::new(cfg()));
    let mut now = Time::from_millis(1_700_000_000_000);
    let fillers: Vec<(SocketAddr, Vec<u8>)> = (0..FILLERS).map(filler).collect();
    let views: Vec<(SocketAddr, &[u8])> = fillers.iter().map(|(s, d)| (*s, &d[..])).collect();
    handle(&mut one, &mut batched, now, &views);
    assert_eq!(one.live_streams(), FILLERS);
    let mut run: Vec<(SocketAddr, &[u8])> = Vec::new();
    for ev in &events {
        now = Time(now.0 + ev.step_us);
        if ev.timeout_first || ev.datagram.is_none() || run.len() == BATCH {
            handle(&mut one, &mut batched, now, &run);
            run.clear();
        }
        if ev.timeout_first || ev.datagram.is_none() {
            one.handle_timeout(now);
            batched.handle_timeout(now);
            same(&mut one, &mut batched);
        }
        if let Some(d) = ev.datagram {
            run.push((source(ev.source), d));
        }
    }
    handle(&mut one, &mut batched, now, &run);
    one.shutdown(now);
    batched.shutdown(now);
    same(&mut one, &mut batched);
});
