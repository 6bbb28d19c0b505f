//! Drives the sans-IO core with `benches/core.rs`'s traffic for a given number of packets, for
//! counting instructions and cache misses with callgrind, which do not depend on how busy the
//! machine is (criterion's nanoseconds do):
//!
//! ```sh
//! cargo build --release --example core_drive
//! D=target/release/examples/core_drive
//! valgrind --tool=callgrind --callgrind-out-file=/dev/null $D 1 plain 0        # set-up only
//! valgrind --tool=callgrind --callgrind-out-file=/dev/null $D 1 plain 200000   # + 200,000 packets
//! ```
//!
//! Instructions per packet = (second total - first total) / 200,000. Arguments: streams,
//! `plain` or `red`, packets, then optionally the order (`sweep`: streams in slot order, which
//! the hardware prefetcher follows; `shuffled`: a fixed random order, as independent senders
//! arrive) and the feeding (`single`: one packet at a time; `nowarm`: batches of 32;
//! `warm`: batches of 32, each first passed to `Gateway::warm`, as the UDP loop does). Add
//! `--cache-sim=yes` for D1/LL misses (slow with 10,000 streams).
//!
//! In batches, the counts include the harness making each datagram from its template (about
//! 90 instructions a packet with 10,000 shuffled streams). To count the core alone, count only
//! the out-of-line function that hands a made batch to the core (the set-up then counts 0):
//!
//! ```sh
//! valgrind --tool=callgrind --toggle-collect='*handle_filled*' --callgrind-out-file=/dev/null \
//!     $D 10000 plain 200000 shuffled warm
//! ```

#[path = "../benches/support/traffic.rs"]
mod traffic;

const USAGE: &str =
    "usage: core_drive STREAMS plain|red PACKETS [sweep|shuffled [single|nowarm|warm]]";

/// What to drive, from the command line (`pub(crate)`:
/// `tests/fuzz_crash_inputs_and_core_drive_args.rs` includes this file to test [`parse`]).
pub(crate) struct Run {
    pub(crate) streams: usize,
    pub(crate) red: bool,
    pub(crate) packets: usize,
    pub(crate) shuffled: bool,
    /// `None`: one packet at a time; else batches, warmed or not.
    pub(crate) warm: Option<bool>,
}

/// The arguments, or what is wrong with them (review ay: a bad one panicked, and 0 streams
/// divided by zero in the traffic's set-up).
pub(crate) fn parse(args: impl IntoIterator<Item = String>) -> Result<Run, String> {
    let mut args = args.into_iter();
    let streams: usize = match args.next().and_then(|a| a.parse().ok()) {
        Some(n) if n > 0 => n,
        _ => return Err(format!("STREAMS: a number above 0; {USAGE}")),
    };
    let red = match args.next().as_deref() {
        Some("red") => true,
        Some("plain") => false,
        _ => return Err(format!("plain or red; {USAGE}")),
    };
    let packets: usize = args
        .next()
        .and_then(|a| a.parse().ok())
        .ok_or_else(|| format!("PACKETS: a number; {USAGE}"))?;
    let shuffled = match args.next().as_deref() {
        None | Some("sweep") => false,
        Some("shuffled") => true,
        Some(o) => return Err(format!("unknown order {o}; {USAGE}")),
    };
    let warm = match args.next().as_deref() {
        None | Some("single") => None,
        Some("nowarm") => Some(false),
        Some("warm") => Some(true),
        Some(f) => return Err(format!("unknown feeding {f}; {USAGE}")),
    };
    Ok(Run {
        streams,
        red,
        packets,
        shuffled,
        warm,
    })
}

fn main() {
    let Run {
        streams,
        red,
        packets,
        shuffled,
        warm,
    } = match parse(std::env::args().skip(1)) {
        Ok(run) => run,
        Err(e) => {
            eprintln!("core_drive: {e}");
            std::process::exit(2);
        }
    };
    let mut t = if shuffled {
        traffic::Traffic::shuffled(streams, red)
    } else {
        traffic::Traffic::new(streams, red)
    };
    let started = std::time::Instant::now();
    match warm {
        None => {
            for _ in 0..packets {
                t.step();
            }
        }
        Some(warm) => {
            let n = pvp_t140::gateway::WARM_BATCH;
            for _ in 0..packets / n {
                t.step_batch(n, warm);
            }
            // The rest, so that PACKETS packets are fed (review ap: a count not a multiple of
            // the batch fed fewer, and the figure per packet divided by PACKETS).
            if !packets.is_multiple_of(n) {
                t.step_batch(packets % n, warm);
            }
        }
    }
    let ns = started.elapsed().as_nanos() as f64 / packets.max(1) as f64;
    eprintln!(
        "{packets} packets, {ns:.0} ns/packet (wall clock, noisy), {} envelopes",
        t.envelopes
    );
}
