//! Prints what a `gateway` fuzz input does: each decoded event and the envelopes it produced,
//! as JSON lines, for analysing a crash or a regression input.
//!
//! `cargo run --manifest-path fuzz/Cargo.toml --example gateway_trace -- INPUT`

use pvp_t140::{Gateway, Time};
use pvp_t140_fuzz::{config, decode, source};

fn main() {
    let path = std::env::args().nth(1).expect("usage: gateway_trace INPUT");
    let data = std::fs::read(&path).expect("read input");
    let (cfg_byte, events) = decode(&data);
    let cfg = config(cfg_byte);
    println!("# config {cfg_byte:#04x}: {cfg:?}");
    let mut gw = Gateway::new(cfg);
    let start = Time::from_millis(1_700_000_000_000);
    let mut now = start;
    let drain = |gw: &mut Gateway| {
        while let Some(e) = gw.poll_output() {
            println!("  {}", e.json());
        }
    };
    for ev in &events {
        now = Time(now.0 + ev.step_us);
        let t = now.0 - start.0;
        if ev.timeout_first || ev.datagram.is_none() {
            println!("t={t}us handle_timeout");
            gw.handle_timeout(now);
            drain(&mut gw);
        }
        if let Some(d) = ev.datagram {
            println!(
                "t={t}us from {} {} bytes: {d:02x?}",
                source(ev.source),
                d.len()
            );
            gw.handle_datagram(now, source(ev.source), d);
            drain(&mut gw);
        }
    }
    println!("t={}us shutdown", now.0 - start.0);
    gw.shutdown(now);
    drain(&mut gw);
    println!("# {:?}", gw.stats());
}
