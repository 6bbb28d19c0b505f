//! Load harness for pvp-t140 (see docs/performance.md for the figures and how to read them).
//!
//! ```sh
//! cargo build --release && cargo build --release --example loadtest
//! # rate: a null receiver, then the real gateway, each offered the same T.140 traffic
//! target/release/examples/loadtest --streams 10000 --pps 50000 --seconds 5
//! target/release/examples/loadtest --streams 10000 --pps 50000 --seconds 4 --step
//! # drain: each receiver stopped (SIGSTOP), 300,000 datagrams queued, then drained on one core:
//! # datagrams per CPU-second, with no sender competing (raises net.core.rmem_max if root)
//! target/release/examples/loadtest --streams 10000 --drain 300000 --receivers null,gateway,null,gateway
//! # scale: 100,000 streams held open, memory per stream, idle CPU
//! target/release/examples/loadtest scale --streams 100000
//! # against t140llm's own receiver (needs `cd interop/t140llm && npm install`)
//! target/release/examples/loadtest t140llm
//! # ws: 1,000 participants over WebSocket to a PVP server in this process (examples/support/ws.rs)
//! target/release/examples/loadtest ws --streams 1000
//! ```
//!
//! Everything goes to 127.0.0.1 only. Receivers run as child processes (the null receiver is
//! this program re-executed with the hidden `null-receiver` subcommand), so their CPU time and
//! peak RSS come from `/proc/PID/{stat,status}` the same way. On a machine with 2 or more
//! cores the receiver is pinned to CPU 0 (`taskset -c 0`) and the sending thread to CPU 1, so
//! the sender cannot starve the receiver; `--pin false` turns that off.
//!
//! Traffic is realistic RFC 4103: every stream is a `pvp_t140::send::Sender` (RED with 2
//! generations by default, BOM first, marker bit on the first packet), fed one word per 300 ms
//! of virtual time from sentences, so the gateway cuts a chunk at every sentence end. Streams
//! have globally unique SSRCs and are spread over `--sockets` source ports (so SO_REUSEPORT
//! workers get a share each). Streams are round-robin: with N streams at P packets/s each
//! stream sends P/N packets/s.
//!
//! The rate mode's headline is gateway / null receiver sustained rate, and CPU per datagram at
//! the highest offered rate at which both took a clean step; the k-th null receiver run pairs
//! with the k-th gateway run, and each ratio is the median over the pairs.
//!
//! Drain mode (`--drain N`) measures capacity rather than a rate: the sender is not the limit
//! and does not compete. Each receiver opens every stream (the same warm-up), is stopped with
//! SIGSTOP, gets N datagrams of the same traffic queued in its socket (SO_RCVBUF sized for N
//! with `--recv-buffer`; any kernel drop while queued makes the figure invalid), and is
//! continued with SIGCONT. Its CPU time (every thread's `/proc/PID/task/*/schedstat`, in ns)
//! from SIGCONT until it goes quiet, plus its CPU above its idle rate in the 3 s tail after
//! (where the gateway's idle flush sends the words each stream left after its last sentence
//! end), gives datagrams per CPU-second; the wall time is until its
//! socket's queue (`rx_queue` of /proc/net/udp) is empty. The headline is gateway / null
//! receiver datagrams per CPU-second, paired in the order the receivers ran. One uncounted
//! null-receiver drain runs first (`--warmup-drains`): the first drain of a run used to be
//! faster (most likely because it was the only one on CPU 0; see `cores`).

use std::collections::{BTreeMap, VecDeque};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::{Args, Parser, Subcommand, ValueEnum};

/// The benches' traffic: only its [`bench_traffic::shuffled_order`] is used here.
#[path = "../benches/support/traffic.rs"]
mod bench_traffic;
/// `loadtest ws`: the gateway against a PVP WebSocket server in this process.
#[path = "support/ws.rs"]
mod ws;
use pvp_t140::send::{Sender, SenderConfig};
use pvp_t140::{Time, rtp};

#[derive(Parser, Debug)]
#[command(name = "loadtest", about = "Load harness for pvp-t140 (loopback only)")]
#[command(args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    cmd: Option<Cmd>,
    #[command(flatten)]
    rate: RateArgs,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// 100k-stream scale run: streams held open, memory per stream, idle CPU, shutdown.
    Scale(ScaleArgs),
    /// pvp-t140's core vs t140llm's T140StreamDemultiplexer over the same datagrams.
    T140llm(T140llmArgs),
    /// Many participants over WebSocket: a PVP server in this process, sentences' latency to
    /// it, the gateway's control runtime CPU and memory per participant.
    Ws(ws::WsArgs),
    /// The null receiver (run as a child by the other modes).
    #[command(hide = true)]
    NullReceiver {
        #[arg(long)]
        listen: SocketAddr,
        #[arg(long, default_value_t = 1)]
        workers: usize,
        #[arg(long, default_value_t = pvp_t140::udp::RECV_BUFFER)]
        recv_buffer: usize,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Target {
    Null,
    Gateway,
}

impl Target {
    fn name(self) -> &'static str {
        match self {
            Target::Null => "null receiver",
            Target::Gateway => "pvp-t140",
        }
    }
}

#[derive(Args, Debug, Clone)]
struct Common {
    /// The gateway binary [default: pvp-t140 next to this example's directory].
    #[arg(long)]
    gateway: Option<PathBuf>,
    /// Receive workers (the gateway's --workers; the null receiver does the same).
    #[arg(long, default_value_t = 1)]
    workers: usize,
    /// Pin the receiver to CPU 0 and the sender to CPU 1 (only with 2+ cores).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pin: bool,
    /// Source sockets (ports) the streams are spread over.
    #[arg(long, default_value_t = 256)]
    sockets: u32,
    /// RUST_LOG of the gateway (its stderr is read and counted, never shown unless it fails).
    #[arg(long, default_value = "info")]
    gateway_log: String,
    /// SO_RCVBUF each receiver asks for, in bytes (the gateway's --recv-buffer; the null
    /// receiver does the same) [default: the gateway's default, 8 MiB; --drain: N * 2048].
    #[arg(long)]
    recv_buffer: Option<u64>,
    /// Order in which the streams first reach the receiver, and so where the gateway keeps
    /// them. `sweep`: socket by socket, so every later batch from a socket visits streams the
    /// gateway keeps side by side, which the hardware prefetcher follows. `shuffled`: a fixed
    /// random order, so a batch visits streams scattered over the gateway's memory, as
    /// independent senders do (docs/performance.md, section 10).
    #[arg(long, value_enum, default_value_t = OpenOrder::Sweep)]
    open_order: OpenOrder,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum OpenOrder {
    Sweep,
    Shuffled,
}

/// As the flag is written (`--open-order sweep`), not as the enum's name.
impl std::fmt::Display for OpenOrder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            OpenOrder::Sweep => "sweep",
            OpenOrder::Shuffled => "shuffled",
        })
    }
}

#[derive(Args, Debug)]
struct RateArgs {
    /// Concurrent RTP streams.
    #[arg(long, default_value_t = 1000)]
    streams: u32,
    /// Offered aggregate packets per second (0: as fast as the sender can).
    #[arg(long, default_value_t = 50_000)]
    pps: u64,
    /// Length of each measured window.
    #[arg(long, default_value_t = 5.0, value_parser = positive_seconds)]
    seconds: f64,
    /// Step the offered rate up from --pps by --step-factor until a receiver drops or the
    /// sender cannot keep up; each receiver's sustained rate is its best clean step.
    #[arg(long)]
    step: bool,
    #[arg(long, default_value_t = 1.25, value_parser = step_factor)]
    step_factor: f64,
    /// Highest rate --step offers.
    #[arg(long, default_value_t = 3_000_000)]
    max_pps: u64,
    /// A step is clean when kernel drops and missing datagrams stay under this fraction.
    #[arg(long, default_value_t = 0.001, value_parser = fraction)]
    tolerance: f64,
    /// RED generations per packet (0: plain text/t140).
    #[arg(long, default_value_t = 2)]
    red: u8,
    /// Drain mode: queue this many datagrams at each receiver while it is stopped, then time
    /// it draining them on one core (replaces the rate windows; --pps only paces the warm-up).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    drain: Option<u64>,
    /// Receivers to run, in order (may repeat: null,gateway,null,gateway).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "null,gateway"
    )]
    receivers: Vec<Target>,
    /// Drain mode: uncounted null-receiver drains run first. The first receiver of a run used
    /// to drain 12-15% faster than the later ones, most likely because it was the only one
    /// pinned to CPU 0 (docs/performance.md, sections 6 and 8). Kept so runs compare with
    /// earlier ones.
    #[arg(long, default_value_t = 1)]
    warmup_drains: u32,
    #[command(flatten)]
    common: Common,
}

#[derive(Args, Debug)]
struct ScaleArgs {
    #[arg(long, default_value_t = 100_000)]
    streams: u32,
    /// What each stream carries: `idle` (one BOM-only packet: never joins), `text` (a sentence
    /// that does not end: the chunker holds it), `flushed` (a finished sentence: joined, sent).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "idle,text,flushed"
    )]
    kinds: Vec<Kind>,
    /// Packets per second while opening the streams.
    #[arg(long, default_value_t = 50_000)]
    pps: u64,
    /// Seconds of silence over which the gateway's idle CPU is measured.
    #[arg(long, default_value_t = 5.0, value_parser = positive_seconds)]
    idle_seconds: f64,
    #[command(flatten)]
    common: Common,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Kind {
    Idle,
    Text,
    Flushed,
}

#[derive(Args, Debug)]
struct T140llmArgs {
    /// t140llm captures (classic pcap, datagrams to --port).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "interop/t140llm/captures/plain.pcap,interop/t140llm/captures/red.pcap,interop/t140llm/captures/multiplex-prefix.pcap"
    )]
    captures: Vec<PathBuf>,
    #[arg(long, default_value_t = 5004)]
    port: u16,
    /// The capture is repeated this many times, each copy's sequence numbers, RTP timestamps
    /// and capture times moved on, so every datagram is new to a receiver that checks order.
    #[arg(long, default_value_t = 40_000, value_parser = clap::value_parser!(u32).range(1..))]
    copies: u32,
    /// Runs of each side (alternating); the best of each is kept.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    runs: u32,
    #[arg(long, default_value = "interop/t140llm/demux.mjs")]
    demux: PathBuf,
    #[arg(long, default_value = "node")]
    node: String,
}

/// A length in seconds: above 0 and finite (`Duration::from_secs_f64` panicked on a negative,
/// NaN or huge one, and a window of 0 s has no rate).
fn positive_seconds(s: &str) -> Result<f64, String> {
    let v: f64 = s.trim().parse().map_err(|e| format!("{e}"))?;
    if v > 0.0 && v <= 1e9 {
        Ok(v)
    } else {
        Err(format!("{s}: not a number of seconds above 0"))
    }
}

/// `--tolerance`: a fraction from 0 to below 1 (a negative one made every step a dropping
/// one, 1 or more made a step that lost everything clean).
fn fraction(s: &str) -> Result<f64, String> {
    let v: f64 = s.trim().parse().map_err(|e| format!("{e}"))?;
    if (0.0..1.0).contains(&v) {
        Ok(v)
    } else {
        Err(format!("{s}: a fraction from 0 to below 1"))
    }
}

/// `--step-factor`: above 1 (at or below 1, stepping offered the same rate forever).
fn step_factor(s: &str) -> Result<f64, String> {
    let v: f64 = s.trim().parse().map_err(|e| format!("{e}"))?;
    if v > 1.0 && v.is_finite() {
        Ok(v)
    } else {
        Err(format!("{s}: the factor must be above 1"))
    }
}

/// The rate `--step` offers after `offered`: at least 1 pps more, as a factor just above 1
/// times a rate can round back to the same rate (1.00001 x 50,000 -> 50,000), which stepped
/// forever.
fn next_offered(offered: u64, factor: f64) -> u64 {
    ((offered as f64 * factor) as u64).max(offered.saturating_add(1))
}

fn main() {
    let cli = Cli::parse();
    // Before any thread pins itself (see `cores`).
    cores();
    // Every mode starts receivers that a SIGTERM or SIGHUP must not leave running.
    install_cleanup_on_signals();
    let r = match cli.cmd {
        Some(Cmd::NullReceiver {
            listen,
            workers,
            recv_buffer,
        }) => null_receiver(listen, workers, recv_buffer),
        Some(Cmd::Scale(a)) => scale(&a),
        Some(Cmd::T140llm(a)) => t140llm(&a),
        Some(Cmd::Ws(a)) => ws::run(&a),
        None => rate(&cli.rate),
    };
    if let Err(e) = r {
        eprintln!("loadtest: {e}");
        std::process::exit(1);
    }
}

type Res<T> = Result<T, String>;

// ---------------------------------------------------------------------------------------------
// The null receiver: the gateway's socket setup and drain loop, datagrams counted and discarded.

fn null_receiver(listen: SocketAddr, workers: usize, recv_buffer: usize) -> Res<()> {
    let counts = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
    let sockets = pvp_t140::udp::bind_group(listen, workers.max(1), recv_buffer)
        .map_err(|e| e.to_string())?;
    let local = sockets[0].local_addr().map_err(|e| e.to_string())?;
    // What the kernel granted (SO_RCVBUF, its doubled figure), for the harness to check.
    let rcvbuf = socket2::SockRef::from(&sockets[0])
        .recv_buffer_size()
        .map_err(|e| e.to_string())?;
    // As the gateway's workers run (`udp::spawn_worker`): a thread each, with a single-threaded
    // runtime that owns the socket.
    for (i, socket) in sockets.into_iter().enumerate() {
        let counts = counts.clone();
        pvp_t140::udp::spawn_loop(format!("null-rx-{i}"), move || async move {
            let socket = tokio::net::UdpSocket::from_std(socket)?;
            // As the gateway's drain_socket reads: a batch per system call, up to 1024
            // datagrams per wake-up.
            let mut reader = pvp_t140::recv::BatchReader::new();
            while socket.readable().await.is_ok() {
                let (mut n, mut bytes) = (0u64, 0u64);
                while n < 1024 && reader.read(&socket, 1024 - n as usize).is_ok() {
                    let batch = reader.datagrams();
                    if batch.is_empty() {
                        break;
                    }
                    n += batch.len() as u64;
                    bytes += batch.iter().map(|d| d.1.len() as u64).sum::<u64>();
                }
                counts[0].fetch_add(n, Ordering::Relaxed);
                counts[1].fetch_add(bytes, Ordering::Relaxed);
                if n == 1024 {
                    // As the gateway's worker does after a full budget.
                    tokio::task::yield_now().await;
                }
            }
            Ok(())
        })
        .map_err(|e| e.to_string())?;
    }
    println!("ready {local} rcvbuf {rcvbuf}");
    let _ = std::io::stdout().flush();
    // Control: a line on stdin asks for the counts; end of stdin ends the process.
    let stdin = std::io::stdin();
    let mut line = String::new();
    while stdin.lock().read_line(&mut line).is_ok_and(|n| n > 0) {
        line.clear();
        println!(
            "{} {}",
            counts[0].load(Ordering::Relaxed),
            counts[1].load(Ordering::Relaxed)
        );
        let _ = std::io::stdout().flush();
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// /proc readings.

fn clk_tck() -> f64 {
    static TCK: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TCK.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
            .unwrap_or(100.0)
    })
}

/// utime + stime of a process (all its threads), in seconds.
fn cpu_seconds(pid: u32) -> f64 {
    stat_cpu(&format!("/proc/{pid}/stat"))
}

/// utime + stime of the calling thread, in seconds.
fn thread_cpu_seconds() -> f64 {
    stat_cpu("/proc/thread-self/stat")
}

fn stat_cpu(path: &str) -> f64 {
    let (user, sys) = stat_user_sys(path);
    user + sys
}

/// (utime, stime) of /proc/.../stat, in seconds: user space against the kernel.
fn stat_user_sys(path: &str) -> (f64, f64) {
    let Ok(s) = std::fs::read_to_string(path) else {
        return (f64::NAN, f64::NAN);
    };
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let rest = s.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) / clk_tck(), ticks(12) / clk_tck())
}

/// (VmRSS, VmHWM) in KiB.
fn memory_kib(pid: u32) -> (u64, u64) {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        s.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// UDP counters of /proc/net/snmp (this network namespace, every socket).
#[derive(Debug, Clone, Copy, Default)]
struct Snmp {
    in_errors: u64,
    rcvbuf_errors: u64,
    sndbuf_errors: u64,
}

fn snmp() -> Snmp {
    let s = std::fs::read_to_string("/proc/net/snmp").unwrap_or_default();
    let lines: Vec<&str> = s.lines().filter(|l| l.starts_with("Udp:")).collect();
    let mut out = Snmp::default();
    if lines.len() >= 2 {
        let names: Vec<&str> = lines[0].split_whitespace().collect();
        let values: Vec<u64> = lines[1]
            .split_whitespace()
            .skip(1)
            .map(|v| v.parse().unwrap_or(0))
            .collect();
        for (n, v) in names.iter().skip(1).zip(values) {
            match *n {
                "InErrors" => out.in_errors = v,
                "RcvbufErrors" => out.rcvbuf_errors = v,
                "SndbufErrors" => out.sndbuf_errors = v,
                _ => {}
            }
        }
    }
    out
}

/// (busy, total, softirq, steal) jiffies of the whole machine, from the first line of /proc/stat (busy leaves
/// out idle and iowait). Every tenant of the machine counts, not just this process tree.
fn machine_jiffies() -> (f64, f64, f64, f64) {
    let s = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let v: Vec<f64> = s
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .skip(1)
        .map(|x| x.parse().unwrap_or(0.0))
        .collect();
    let total: f64 = v.iter().take(8).sum();
    let at = |i: usize| v.get(i).copied().unwrap_or(0.0);
    let idle = at(3) + at(4);
    // busy, total, softirq, steal
    (total - idle, total, at(6), at(7))
}

/// CPU seconds of every visible process but `skip` (this process and the receiver), by pid.
fn process_cpu(skip: &[u32]) -> BTreeMap<u32, (String, f64)> {
    let mut out = BTreeMap::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        if skip.contains(&pid) {
            continue;
        }
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        out.insert(pid, (comm.trim().to_owned(), cpu_seconds(pid)));
    }
    out
}

/// Other visible processes' CPU between two [`process_cpu`] snapshots: (cores, busiest name).
fn others_between(
    a: &BTreeMap<u32, (String, f64)>,
    b: &BTreeMap<u32, (String, f64)>,
    secs: f64,
) -> (f64, String) {
    let mut total = 0.0;
    let mut top = (0.0, String::new());
    for (pid, (name, cpu)) in b {
        let d = cpu - a.get(pid).map_or(0.0, |x| x.1);
        if d.is_finite() && d > 0.0 {
            total += d;
            if d > top.0 {
                top = (d, name.clone());
            }
        }
    }
    (
        total / secs,
        if top.0 / secs >= 0.05 {
            top.1
        } else {
            String::new()
        },
    )
}

/// Datagrams the kernel dropped at the sockets bound to 127.0.0.1:`port` (the `drops` column of
/// /proc/net/udp, summed over SO_REUSEPORT sockets): this receiver's drops only, unlike the
/// namespace-wide /proc/net/snmp counters.
fn socket_drops(port: u16) -> u64 {
    let s = std::fs::read_to_string("/proc/net/udp").unwrap_or_default();
    let want = format!("0100007F:{port:04X}");
    s.lines()
        .skip(1)
        .filter(|l| l.split_whitespace().nth(1) == Some(want.as_str()))
        .filter_map(|l| l.split_whitespace().last()?.parse::<u64>().ok())
        .sum()
}

fn pin_current_thread(cpu: usize) -> bool {
    unsafe extern "C" {
        fn sched_setaffinity(pid: i32, cpusetsize: usize, mask: *const u64) -> i32;
    }
    let mut mask = [0u64; 16];
    mask[cpu / 64] |= 1 << (cpu % 64);
    // SAFETY: a 1024-bit cpu_set_t that outlives the call; pid 0 is the calling thread.
    unsafe { sched_setaffinity(0, std::mem::size_of_val(&mask), mask.as_ptr()) == 0 }
}

/// The machine's cores, counted once at start-up: `available_parallelism` follows the calling
/// thread's affinity, so asked after the sender pinned itself to CPU 1 it said 1, and every
/// receiver after the first was spawned unpinned on the sender's CPU (each child inherits the
/// affinity of the thread that spawns it).
fn cores() -> usize {
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

// ---------------------------------------------------------------------------------------------
// Receivers as child processes.

fn free_udp_pair() -> Res<u16> {
    for _ in 0..100 {
        let a = UdpSocket::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
        let port = a.local_addr().map_err(|e| e.to_string())?.port();
        if port < u16::MAX && UdpSocket::bind(("127.0.0.1", port + 1)).is_ok() {
            return Ok(port);
        }
    }
    Err("no free UDP port pair on 127.0.0.1".into())
}

fn free_tcp() -> Res<u16> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    Ok(l.local_addr().map_err(|e| e.to_string())?.port())
}

fn gateway_path(given: &Option<PathBuf>) -> Res<PathBuf> {
    let p = match given {
        Some(p) => p.clone(),
        None => {
            let exe = std::env::current_exe().map_err(|e| e.to_string())?;
            // target/release/examples/loadtest -> target/release/pvp-t140
            exe.parent()
                .and_then(Path::parent)
                .map(|d| d.join("pvp-t140"))
                .ok_or("cannot locate the gateway binary; pass --gateway")?
        }
    };
    if !p.exists() {
        // The profile this harness was built with: target/debug/pvp-t140 is `cargo build`'s.
        let release = p
            .parent()
            .and_then(Path::file_name)
            .is_none_or(|d| d != "debug");
        return Err(format!(
            "{} not found: run `cargo build{}` first or pass --gateway",
            p.display(),
            if release { " --release" } else { "" }
        ));
    }
    Ok(p)
}

struct Child {
    target: Target,
    child: std::process::Child,
    pid: u32,
    addr: SocketAddr,
    metrics: Option<SocketAddr>,
    ctl: Option<(
        std::process::ChildStdin,
        BufReader<std::process::ChildStdout>,
    )>,
    log_lines: Arc<AtomicU64>,
    log_tail: Arc<Mutex<VecDeque<String>>>,
    log_warnings: Arc<Mutex<Vec<String>>>,
    /// SO_RCVBUF the null receiver's socket got (it reports it when ready).
    rcvbuf: Option<u64>,
}

/// A receiver an error path leaves behind is killed rather than left running (after
/// [`Child::stop`] it has been reaped and this does nothing).
impl Drop for Child {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        unregister_child(self.pid);
    }
}

/// Whether a receiver started with `pin` is pinned to CPU 0: with 2 cores or more, by
/// `taskset` (the sending thread pins itself, without it). Said as it is: without `taskset`
/// the header said "pin true" of an unpinned receiver (review ay, session 46).
fn receiver_pinned(pin: bool) -> bool {
    pin && cores() >= 2 && Path::new("/usr/bin/taskset").exists()
}

fn pinned(cmd: &str, pin: bool) -> Command {
    if receiver_pinned(pin) {
        let mut c = Command::new("taskset");
        c.args(["-c", "0", cmd]);
        c
    } else {
        Command::new(cmd)
    }
}

impl Child {
    fn spawn(target: Target, common: &Common, gateway_args: &[String]) -> Res<Child> {
        let port = free_udp_pair()?;
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().expect("literal");
        let (mut cmd, metrics) = match target {
            Target::Null => {
                let exe = std::env::current_exe().map_err(|e| e.to_string())?;
                let mut c = pinned(&exe.to_string_lossy(), common.pin);
                c.args(["null-receiver", "--listen", &addr.to_string()]);
                c.args(["--workers", &common.workers.to_string()]);
                if let Some(b) = common.recv_buffer {
                    c.args(["--recv-buffer", &b.to_string()]);
                }
                c.stdin(Stdio::piped()).stdout(Stdio::piped());
                (c, None)
            }
            Target::Gateway => {
                let path = gateway_path(&common.gateway)?;
                let m: SocketAddr = format!("127.0.0.1:{}", free_tcp()?)
                    .parse()
                    .expect("literal");
                let mut c = pinned(&path.to_string_lossy(), common.pin);
                c.args(["--listen", &addr.to_string(), "--metrics", &m.to_string()]);
                c.args(["--workers", &common.workers.to_string()]);
                c.args(["--max-pps-per-source", "0"]);
                if let Some(b) = common.recv_buffer {
                    c.args(["--recv-buffer", &b.to_string()]);
                }
                c.args(gateway_args);
                c.env("RUST_LOG", &common.gateway_log);
                c.stdin(Stdio::null()).stdout(Stdio::null());
                (c, Some(m))
            }
        };
        cmd.stderr(Stdio::piped());
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("spawn {}: {e}", target.name()))?;
        let pid = child.id();
        let log_lines = Arc::new(AtomicU64::new(0));
        let log_tail = Arc::new(Mutex::new(VecDeque::new()));
        let log_warnings = Arc::new(Mutex::new(Vec::new()));
        let stderr = child.stderr.take().expect("piped");
        {
            let (lines, tail, warns) = (log_lines.clone(), log_tail.clone(), log_warnings.clone());
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    lines.fetch_add(1, Ordering::Relaxed);
                    if line.contains(" WARN ") || line.contains(" ERROR ") {
                        let mut w = warns.lock().expect("lock");
                        if w.len() < 20 {
                            w.push(line.clone());
                        }
                    }
                    let mut t = tail.lock().expect("lock");
                    if t.len() == 10 {
                        t.pop_front();
                    }
                    t.push_back(line);
                }
            });
        }
        let mut rcvbuf = None;
        let ctl = match target {
            Target::Null => {
                let stdin = child.stdin.take().expect("piped");
                let mut out = BufReader::new(child.stdout.take().expect("piped"));
                let mut line = String::new();
                out.read_line(&mut line)
                    .map_err(|e| format!("null receiver: {e}"))?;
                if !line.starts_with("ready") {
                    return Err(format!("null receiver did not start: {line:?}"));
                }
                // "ready ADDR rcvbuf BYTES"
                rcvbuf = line.split_whitespace().nth(3).and_then(|v| v.parse().ok());
                Some((stdin, out))
            }
            Target::Gateway => None,
        };
        register_child(pid);
        let mut c = Child {
            target,
            child,
            pid,
            addr,
            metrics,
            ctl,
            log_lines,
            log_tail,
            log_warnings,
            rcvbuf,
        };
        if target == Target::Gateway {
            let deadline = Instant::now() + Duration::from_secs(15);
            while c.scrape().is_err() {
                if Instant::now() > deadline {
                    return Err(format!(
                        "gateway did not serve /metrics: {:?}",
                        c.log_tail.lock().expect("lock")
                    ));
                }
                if let Ok(Some(st)) = c.child.try_wait() {
                    return Err(format!(
                        "gateway exited ({st}): {:?}",
                        c.log_tail.lock().expect("lock")
                    ));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Ok(c)
    }

    /// Prometheus text of the gateway's /metrics, as name{labels} -> value.
    fn scrape(&self) -> Res<BTreeMap<String, f64>> {
        let addr = self.metrics.ok_or("no metrics")?;
        let mut s =
            TcpStream::connect_timeout(&addr, Duration::from_secs(2)).map_err(|e| e.to_string())?;
        s.set_read_timeout(Some(Duration::from_secs(5)))
            .map_err(|e| e.to_string())?;
        write!(
            s,
            "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
        )
        .map_err(|e| e.to_string())?;
        let mut body = String::new();
        s.read_to_string(&mut body).map_err(|e| e.to_string())?;
        let mut m = BTreeMap::new();
        for line in body.lines() {
            if line.starts_with("pvp_t140_")
                && let Some((k, v)) = line.rsplit_once(' ')
                && let Ok(v) = v.parse::<f64>()
            {
                m.insert(k.to_owned(), v);
            }
        }
        if m.is_empty() {
            return Err("empty /metrics".into());
        }
        Ok(m)
    }

    /// Datagrams the receiver has taken from its socket so far (the gateway publishes its
    /// counters once a second, so its figure can be up to a second old); `None` when the count
    /// could not be read (a failed scrape is no count of 0).
    fn delivered(&mut self) -> Option<u64> {
        match &mut self.ctl {
            Some((stdin, out)) => {
                let _ = writeln!(stdin, "c");
                let _ = stdin.flush();
                let mut line = String::new();
                let _ = out.read_line(&mut line);
                line.split_whitespace().next()?.parse().ok()
            }
            None => self
                .scrape()
                .ok()
                .map(|m| counter(&m, "pvp_t140_datagrams_total")),
        }
    }

    /// The counters a drain is measured by, read up to 3 times 200 ms apart: the gateway's
    /// /metrics, or the null receiver's count as `pvp_t140_datagrams_total`; `None` if never
    /// read (a failed read is no count of 0: the drain is then invalid).
    fn drain_counters(&mut self) -> Option<BTreeMap<String, f64>> {
        for i in 0..3 {
            if i > 0 {
                std::thread::sleep(Duration::from_millis(200));
            }
            let m = match self.target {
                Target::Null => self
                    .delivered()
                    .map(|n| BTreeMap::from([("pvp_t140_datagrams_total".to_owned(), n as f64)])),
                Target::Gateway => self.scrape().ok(),
            };
            if m.is_some() {
                return m;
            }
        }
        None
    }

    /// Waits until the receiver has counted `expected` datagrams, or its count has not moved
    /// for a while (then some were lost); returns the count (0 if it could never be read).
    /// Counts only grow: a read that fails or lags behind an earlier one is passed over.
    fn settle(&mut self, expected: u64) -> u64 {
        let quiet = match self.target {
            Target::Null => Duration::from_millis(500),
            Target::Gateway => Duration::from_millis(2500),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut last = self.delivered().unwrap_or(0);
        let mut since = Instant::now();
        while last < expected && since.elapsed() < quiet && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
            if let Some(now) = self.delivered()
                && now > last
            {
                last = now;
                since = Instant::now();
            }
        }
        last
    }

    fn cpu(&self) -> f64 {
        cpu_seconds(self.pid)
    }

    fn memory(&self) -> (u64, u64) {
        memory_kib(self.pid)
    }

    /// SIGTERM (the gateway flushes every stream and exits), SIGKILL after 30 s. Returns how
    /// it ended, whether that was a clean exit (status 0), and how long stopping took.
    fn stop(mut self) -> (String, bool, f64) {
        let started = Instant::now();
        if let Some((stdin, _)) = self.ctl.take() {
            // The null receiver ends when its stdin closes.
            drop(stdin);
            for _ in 0..100 {
                if let Ok(Some(st)) = self.child.try_wait() {
                    return (
                        st.to_string(),
                        st.success(),
                        started.elapsed().as_secs_f64(),
                    );
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let _ = Command::new("kill")
            .args(["-TERM", &self.pid.to_string()])
            .status();
        let deadline = started + Duration::from_secs(30);
        loop {
            match self.child.try_wait() {
                Ok(Some(st)) => {
                    // Let the stderr reader catch the last lines.
                    std::thread::sleep(Duration::from_millis(100));
                    return (
                        st.to_string(),
                        st.success(),
                        started.elapsed().as_secs_f64(),
                    );
                }
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                _ => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    return (
                        "killed after 30 s".into(),
                        false,
                        started.elapsed().as_secs_f64(),
                    );
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Traffic.

/// Words of sentences: each stream types one word per packet; every sentence end cuts a chunk.
const TEXT: &str = "The quick brown fox jumps over the lazy dog. Real-time text arrives one \
word at a time, as people type or speak. Captions must never lose a sentence! Is the gateway \
keeping up with every speaker? It should, at a few packets per second each. ";

const BUFFER_TIME: Duration = Duration::from_millis(300);

struct Talker {
    sender: Sender,
    vt: Time,
    word: usize,
}

/// Datagrams handed to the kernel per `sendmmsg` call (all from one source socket).
const BATCH: usize = 32;

/// N streams over M connected source sockets: stream `i` sends from socket `i % M`. Sending
/// goes socket by socket, a batch of that socket's streams each (each types its next word), so
/// one `sendmmsg` carries the batch; every stream still sends in order and at the same rate.
struct Traffic {
    talkers: Vec<Talker>,
    socks: Vec<UdpSocket>,
    words: Vec<String>,
    /// Next socket in turn, and per socket the next of its streams.
    sock_turn: usize,
    next_of: Vec<usize>,
    sent: u64,
    bytes: u64,
    errors: u64,
    batch: Vec<Vec<u8>>,
}

const T0: Time = Time::from_millis(1_700_000_000_000);

fn ssrc_of(i: u32) -> u32 {
    0x5000_0000u32.wrapping_add(i.wrapping_mul(2_654_435_761))
}

fn sockets_to(to: SocketAddr, n: u32) -> Res<Vec<UdpSocket>> {
    assert!(to.ip().is_loopback(), "loopback only");
    (0..n.max(1))
        .map(|_| {
            let s = UdpSocket::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
            s.connect(to).map_err(|e| e.to_string())?;
            Ok(s)
        })
        .collect()
}

/// Sends `packets` on a connected socket with one `sendmmsg` (Linux); returns how many went.
#[cfg(all(target_os = "linux", target_pointer_width = "64"))]
fn send_many(sock: &UdpSocket, packets: &[Vec<u8>]) -> std::io::Result<usize> {
    use std::os::fd::AsRawFd;
    #[repr(C)]
    struct IoVec {
        base: *const u8,
        len: usize,
    }
    #[repr(C)]
    struct MsgHdr {
        name: *mut u8,
        namelen: u32,
        iov: *mut IoVec,
        iovlen: usize,
        control: *mut u8,
        controllen: usize,
        flags: i32,
    }
    #[repr(C)]
    struct MMsgHdr {
        hdr: MsgHdr,
        len: u32,
    }
    unsafe extern "C" {
        fn sendmmsg(fd: i32, msgvec: *mut MMsgHdr, vlen: u32, flags: i32) -> i32;
    }
    let mut iov: Vec<IoVec> = packets
        .iter()
        .map(|p| IoVec {
            base: p.as_ptr(),
            len: p.len(),
        })
        .collect();
    let mut msgs: Vec<MMsgHdr> = iov
        .iter_mut()
        .map(|v| MMsgHdr {
            hdr: MsgHdr {
                name: std::ptr::null_mut(),
                namelen: 0,
                iov: v,
                iovlen: 1,
                control: std::ptr::null_mut(),
                controllen: 0,
                flags: 0,
            },
            len: 0,
        })
        .collect();
    let mut done = 0;
    while done < msgs.len() {
        // SAFETY: `msgs[done..]` are valid mmsghdr structs (Linux x86_64/aarch64 layout) whose
        // iovecs point into `packets`, all alive for the call; the socket is connected, so
        // msg_name is null.
        let n = unsafe {
            sendmmsg(
                sock.as_raw_fd(),
                msgs[done..].as_mut_ptr(),
                (msgs.len() - done) as u32,
                0,
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if done == 0 {
                return Err(e);
            }
            break;
        }
        done += n as usize;
    }
    Ok(done)
}

#[cfg(not(all(target_os = "linux", target_pointer_width = "64")))]
fn send_many(sock: &UdpSocket, packets: &[Vec<u8>]) -> std::io::Result<usize> {
    for p in packets {
        sock.send(p)?;
    }
    Ok(packets.len())
}

/// Stream `i`'s sender: its SSRC, and sequence numbers and timestamps that start apart.
fn sender_config(i: u32, red: u8) -> SenderConfig {
    SenderConfig {
        ssrc: ssrc_of(i),
        redundancy: red,
        initial_seq: (i as u16).wrapping_mul(31),
        initial_ts: i.wrapping_mul(7919),
        // The harness sets its own pace; the receiver is the gateway, which takes any rate.
        cps: None,
        ..SenderConfig::default()
    }
}

impl Traffic {
    fn new(to: SocketAddr, streams: u32, sockets: u32, red: u8) -> Res<Traffic> {
        let talkers = (0..streams)
            .map(|i| Talker {
                sender: Sender::new(sender_config(i, red), T0),
                vt: T0,
                word: i as usize,
            })
            .collect();
        let socks = sockets_to(to, sockets.min(streams))?;
        Ok(Traffic {
            talkers,
            next_of: vec![0; socks.len()],
            socks,
            words: TEXT.split_inclusive(' ').map(str::to_owned).collect(),
            sock_turn: 0,
            sent: 0,
            bytes: 0,
            errors: 0,
            batch: Vec::with_capacity(BATCH),
        })
    }

    /// Streams that send from socket `s`.
    fn count(&self, s: usize) -> usize {
        (self.talkers.len() - s).div_ceil(self.socks.len())
    }

    /// The next socket in turn sends up to `max` packets (at most [`BATCH`]), one for each of
    /// its next streams; returns how many it tried.
    fn send_batch(&mut self, max: u64) -> u64 {
        let s = self.sock_turn;
        self.sock_turn = (s + 1) % self.socks.len();
        self.send_from(s, max)
    }

    fn send_from(&mut self, s: usize, max: u64) -> u64 {
        let m = self.socks.len();
        let count = self.count(s);
        self.batch.clear();
        for _ in 0..(max as usize).clamp(1, BATCH).min(count) {
            let j = self.next_of[s];
            self.next_of[s] = (j + 1) % count;
            // Streams s, s + m, s + 2m, ...
            self.type_next(s + j * m);
        }
        self.send_batch_on(s)
    }

    /// Stream `i`'s next packet, alone (its socket is `i % sockets`).
    fn send_one(&mut self, i: usize) -> u64 {
        self.batch.clear();
        self.type_next(i);
        self.send_batch_on(i % self.socks.len())
    }

    /// Stream `i` types its next word: its packets join the batch.
    fn type_next(&mut self, i: usize) {
        let t = &mut self.talkers[i];
        t.vt = t.vt.saturating_add(BUFFER_TIME);
        t.sender
            .push_text(t.vt, &self.words[t.word % self.words.len()]);
        t.word += 1;
        while let Some(p) = t.sender.poll_packet(t.vt) {
            self.batch.push(p);
        }
    }

    /// Sends the batch on socket `s`; returns how many packets it held.
    fn send_batch_on(&mut self, s: usize) -> u64 {
        match send_many(&self.socks[s], &self.batch) {
            Ok(n) => {
                self.sent += n as u64;
                self.bytes += self.batch[..n].iter().map(|p| p.len() as u64).sum::<u64>();
                self.errors += (self.batch.len() - n) as u64;
            }
            Err(_) => self.errors += self.batch.len() as u64,
        }
        self.batch.len() as u64
    }

    /// One packet from every stream (opens them all), at about `pps`, socket by socket or in a
    /// fixed random order.
    fn open_all(&mut self, pps: u64, order: OpenOrder) {
        let start = Instant::now();
        let pace = |done: u64| {
            while done as f64 > start.elapsed().as_secs_f64() * pps as f64 {
                std::thread::sleep(Duration::from_micros(200));
            }
        };
        if order == OpenOrder::Shuffled {
            for (done, i) in bench_traffic::shuffled_order(self.talkers.len())
                .into_iter()
                .enumerate()
            {
                self.send_one(i as usize);
                pace(done as u64);
            }
            return;
        }
        let mut done = 0u64;
        for s in 0..self.socks.len() {
            let mut left = self.count(s) as u64;
            while left > 0 {
                let k = self.send_from(s, left);
                left -= k;
                done += k;
                pace(done);
            }
        }
    }
}

/// Calls `send(max)` (which sends up to `max` packets and returns how many it sent; 0 when it
/// has nothing left) to keep to `pps` (0: flat out) for `secs`, then stops hard. Paced in
/// small bursts. Returns the packets sent and the seconds it took.
fn blast(mut send: impl FnMut(u64) -> u64, pps: u64, secs: f64, pin: bool) -> (u64, f64, f64) {
    if pin && cores() >= 2 {
        pin_current_thread(1);
    }
    let cpu0 = thread_cpu_seconds();
    let dur = Duration::from_secs_f64(secs);
    let start = Instant::now();
    let mut sent = 0u64;
    loop {
        let el = start.elapsed();
        if el >= dur {
            break;
        }
        let due = if pps == 0 {
            sent + BATCH as u64
        } else {
            (el.as_secs_f64() * pps as f64) as u64
        };
        if sent >= due {
            std::thread::sleep(Duration::from_micros(100));
            continue;
        }
        let k = send(due - sent);
        if k == 0 {
            break;
        }
        sent += k;
    }
    if std::env::var_os("LOADTEST_DEBUG").is_some() {
        let st = std::fs::read_to_string("/proc/thread-self/status").unwrap_or_default();
        let sched = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap_or_default();
        eprintln!(
            "  sender thread: schedstat (run ns, wait ns, slices) {}; {}",
            sched.trim(),
            st.lines()
                .filter(|l| l.contains("ctxt"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    (
        sent,
        start.elapsed().as_secs_f64(),
        thread_cpu_seconds() - cpu0,
    )
}

// ---------------------------------------------------------------------------------------------
// Rate mode.

#[derive(Debug, Clone, Default)]
struct Step {
    offered: u64,
    sent: u64,
    secs: f64,
    delivered: u64,
    /// Drops at the receiver's own socket(s) (/proc/net/udp).
    socket_drops: u64,
    kernel_rcvbuf: u64,
    kernel_in_errors: u64,
    send_errors: u64,
    cpu: f64,
    sender_cpu: f64,
    /// CPU (in cores) used on the machine during the window by anything but the receiver and
    /// this process: other tenants of a shared machine.
    foreign: f64,
    /// CPU (in cores) of the other processes visible here, and the busiest one's name.
    visible: f64,
    busiest: String,
    /// Softirq and hypervisor steal time on the machine during the window, in cores.
    softirq: f64,
    steal: f64,
    gw_drops: Vec<(String, u64)>,
    /// The gateway's counters could not be read before or after the window: its drops are
    /// unknown, not none.
    drops_unknown: bool,
    envelopes: u64,
}

impl Step {
    fn sent_pps(&self) -> f64 {
        self.sent as f64 / self.secs
    }
    fn delivered_pps(&self) -> f64 {
        self.delivered as f64 / self.secs
    }
    fn sender_bound(&self) -> bool {
        self.offered > 0 && self.sent_pps() < SAME_RATE * self.offered as f64
    }
    /// Kernel drops, datagrams never counted, and datagrams the gateway counted but dropped
    /// itself (with the envelopes it could not hand to its sink, [`step_drops`]) each within
    /// `tol` of those sent.
    fn clean(&self, tol: f64) -> bool {
        let lost = self.sent.saturating_sub(self.delivered)
            + self.gw_drops.iter().map(|(_, n)| n).sum::<u64>();
        !self.drops_unknown
            && (self.socket_drops as f64) <= tol * self.sent as f64
            && (lost as f64) <= tol * self.sent as f64
    }
}

struct Report {
    target: Target,
    steps: Vec<Step>,
    hwm_kib: u64,
    rss_kib: u64,
    warm_cpu: f64,
    exit: String,
    /// The receiver stopped with status 0 (see [`Drain::exit_ok`]).
    exit_ok: bool,
    shutdown_s: f64,
    log_lines: u64,
    warnings: Vec<String>,
}

/// A counter from a scrape of the gateway's /metrics (0 when absent).
fn counter(m: &BTreeMap<String, f64>, name: &str) -> u64 {
    m.get(name).copied().unwrap_or(0.0) as u64
}

/// The gateway's drops between two scrapes, by reason (only reasons that moved).
fn gw_drops(m0: &BTreeMap<String, f64>, m1: &BTreeMap<String, f64>) -> Vec<(String, u64)> {
    m1.iter()
        .filter(|(k, _)| k.starts_with("pvp_t140_drops_total"))
        .map(|(k, _)| {
            let reason = k.split('"').nth(1).unwrap_or(k.as_str()).to_owned();
            (reason, counter(m1, k) - counter(m0, k))
        })
        .filter(|(_, v)| *v > 0)
        .collect()
}

/// What the gateway lost in a rate step, by reason: its drops ([`gw_drops`]), and the envelopes
/// its receive workers could not hand to the sink, whose queue was full
/// (`pvp_t140_sink_queue_refused_total`): text lost, and work not done, so no clean step
/// (review ay: a step that lost envelopes there counted as clean; the drain mode's check).
fn step_drops(m0: &BTreeMap<String, f64>, m1: &BTreeMap<String, f64>) -> Vec<(String, u64)> {
    let mut drops = gw_drops(m0, m1);
    let refused = "pvp_t140_sink_queue_refused_total";
    let n = counter(m1, refused).saturating_sub(counter(m0, refused));
    if n > 0 {
        drops.push(("sink_queue_refused".to_owned(), n));
    }
    drops
}

fn run_rate(target: Target, a: &RateArgs) -> Res<Report> {
    let max_streams = (a.streams + 1024).to_string();
    let mut child = Child::spawn(target, &a.common, &["--max-streams".into(), max_streams])?;
    let mut traffic = Traffic::new(child.addr, a.streams, a.common.sockets, a.red)?;
    // Warm-up: every stream sends its first packet (opens the stream), gently.
    let warm_cpu0 = child.cpu();
    if a.common.pin && cores() >= 2 {
        pin_current_thread(1);
    }
    traffic.open_all(
        if a.pps == 0 {
            20_000
        } else {
            a.pps.min(20_000)
        },
        a.common.open_order,
    );
    let mut base = child.settle(traffic.sent);
    let warm_cpu = child.cpu() - warm_cpu0;
    eprintln!(
        "  {}: {} streams open ({} of {} warm-up datagrams delivered)",
        target.name(),
        a.streams,
        base,
        traffic.sent
    );
    let mut steps = Vec::new();
    let mut offered = a.pps;
    loop {
        let k0 = snmp();
        let sd0 = socket_drops(child.addr.port());
        let cpu0 = child.cpu();
        let m0 = child.scrape().ok();
        let own0 = cpu_seconds(std::process::id());
        let mach0 = machine_jiffies();
        let skip = [std::process::id(), child.pid];
        let procs0 = process_cpu(&skip);
        let (sent0, err0) = (traffic.sent, traffic.errors);
        let (_, secs, sender_cpu) = blast(
            |max| traffic.send_batch(max),
            offered,
            a.seconds,
            a.common.pin,
        );
        let cpu = child.cpu() - cpu0;
        let own = cpu_seconds(std::process::id()) - own0;
        let mach1 = machine_jiffies();
        let (visible, busiest) = others_between(&procs0, &process_cpu(&skip), secs);
        let cores_of = |d: f64| d / (mach1.1 - mach0.1).max(1.0) * cores() as f64;
        let foreign = (cores_of(mach1.0 - mach0.0) - (cpu + own) / secs).max(0.0);
        let softirq = cores_of(mach1.2 - mach0.2);
        let steal = cores_of(mach1.3 - mach0.3);
        if std::env::var_os("LOADTEST_DEBUG").is_some() {
            eprintln!(
                "  machine: busy {:.2} cores, receiver {:.2}, loadtest {:.2}, window {secs:.2} s",
                cores_of(mach1.0 - mach0.0),
                cpu / secs,
                own / secs
            );
        }
        let sent = traffic.sent - sent0;
        let got = child.settle(base + sent);
        let k1 = snmp();
        let sd1 = socket_drops(child.addr.port());
        let m1 = child.scrape().ok();
        let (gw_drops, envelopes) = match (&m0, &m1) {
            (Some(m0), Some(m1)) => {
                let e = "pvp_t140_envelopes_total";
                (step_drops(m0, m1), counter(m1, e) - counter(m0, e))
            }
            _ => (Vec::new(), 0),
        };
        let step = Step {
            offered,
            sent,
            secs,
            // 0, not an underflow, when this settle could read no count.
            delivered: got.saturating_sub(base),
            socket_drops: sd1 - sd0,
            kernel_rcvbuf: k1.rcvbuf_errors - k0.rcvbuf_errors,
            kernel_in_errors: k1.in_errors - k0.in_errors,
            send_errors: traffic.errors - err0,
            cpu,
            sender_cpu,
            foreign,
            visible,
            busiest,
            softirq,
            steal,
            gw_drops,
            drops_unknown: target == Target::Gateway && (m0.is_none() || m1.is_none()),
            envelopes,
        };
        base = base.max(got);
        eprintln!(
            "  {}: offered {:>9} sent {:>9.0}/s delivered {:>9.0}/s kernel drops {:>7} cpu {:>5.1}% sender cpu {:>5.1}% others {:.2} (visible {:.2} {}) softirq {:.2} steal {:.2} cores {}",
            target.name(),
            if offered == 0 {
                "max".to_string()
            } else {
                offered.to_string()
            },
            step.sent_pps(),
            step.delivered_pps(),
            step.socket_drops,
            100.0 * step.cpu / step.secs,
            100.0 * step.sender_cpu / step.secs,
            step.foreign,
            step.visible,
            step.busiest,
            step.softirq,
            step.steal,
            if step.clean(a.tolerance) {
                "clean"
            } else {
                "DROPS"
            }
        );
        let stop = !a.step
            || !step.clean(a.tolerance)
            || step.sender_bound()
            || offered == 0
            || next_offered(offered, a.step_factor) > a.max_pps;
        steps.push(step);
        if stop {
            break;
        }
        offered = next_offered(offered, a.step_factor);
    }
    let (rss, hwm) = child.memory();
    let log_lines = child.log_lines.load(Ordering::Relaxed);
    let warns = child.log_warnings.clone();
    let (exit, exit_ok, shutdown_s) = child.stop();
    let warnings = warns.lock().expect("lock").clone();
    Ok(Report {
        target,
        steps,
        hwm_kib: hwm,
        rss_kib: rss,
        warm_cpu,
        exit,
        exit_ok,
        shutdown_s,
        log_lines,
        warnings,
    })
}

/// Why a receiver's sustained rate is only a lower bound: its last step was clean.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LowerBound {
    /// The sender could not keep up with the rate offered (or offered all it could, --pps 0).
    Sender,
    /// The sender kept up: one paced window (no --step), or stepping stopped at --max-pps.
    Offered,
}

/// The best clean step's delivered rate, and why that figure is only a lower bound, if it is
/// (docs/performance.md, section 1: the receiver did not drop at the last rate offered).
fn sustained(r: &Report, tol: f64) -> (f64, Option<LowerBound>) {
    let best = r
        .steps
        .iter()
        .filter(|s| s.clean(tol))
        .map(Step::delivered_pps)
        .fold(0.0, f64::max);
    let bound = match r.steps.last() {
        Some(s) if s.clean(tol) && (s.sender_bound() || s.offered == 0) => Some(LowerBound::Sender),
        Some(s) if s.clean(tol) => Some(LowerBound::Offered),
        _ => None,
    };
    (best, bound)
}

fn rate(a: &RateArgs) -> Res<()> {
    if a.streams == 0 {
        return Err("--streams must be at least 1".into());
    }
    // Before any receiver runs: a missing gateway binary (`cargo run --example loadtest` does
    // not build it) was found only after the null receiver's whole run (review ay).
    if a.receivers.contains(&Target::Gateway) {
        gateway_path(&a.common.gateway)?;
    }
    if let Some(n) = a.drain {
        return drain(a, n);
    }
    println!(
        "loadtest: {} streams (opened {}), {} pps{}, {} s windows, RED {}, workers {}, {} source ports, pin {}",
        a.streams,
        a.common.open_order,
        if a.pps == 0 {
            "max".to_string()
        } else {
            a.pps.to_string()
        },
        if a.step { " stepping" } else { "" },
        a.seconds,
        a.red,
        a.common.workers,
        a.common.sockets.min(a.streams),
        receiver_pinned(a.common.pin)
    );
    println!(
        "machine: nproc {}, load average {}, net.core.rmem_max {} B",
        cores(),
        load_average(),
        std::fs::read_to_string("/proc/sys/net/core/rmem_max")
            .unwrap_or_default()
            .trim()
    );
    let mut reports = Vec::new();
    for t in &a.receivers {
        reports.push(run_rate(*t, a)?);
    }
    println!();
    println!(
        "| receiver | offered pps | sent pps | delivered pps | kernel drops (socket) | gateway drops | envelopes | CPU % of a core | CPU µs/datagram | sender CPU % | other processes (cores) | clean |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | --- |");
    for r in &reports {
        for s in &r.steps {
            let drops: Vec<String> = s.gw_drops.iter().map(|(k, v)| format!("{k}={v}")).collect();
            println!(
                "| {} | {} | {:.0} | {:.0} | {} | {} | {} | {:.0} | {:.2} | {:.0} | {} | {} |",
                r.target.name(),
                if s.offered == 0 {
                    "max".to_string()
                } else {
                    s.offered.to_string()
                },
                s.sent_pps(),
                s.delivered_pps(),
                s.socket_drops,
                if r.target == Target::Null {
                    "n/a".to_string()
                } else if s.drops_unknown {
                    "? (/metrics not read)".to_string()
                } else if drops.is_empty() {
                    "0".to_string()
                } else {
                    drops.join(" ")
                },
                if r.target == Target::Null {
                    "n/a".to_string()
                } else {
                    s.envelopes.to_string()
                },
                100.0 * s.cpu / s.secs,
                1e6 * s.cpu / s.delivered.max(1) as f64,
                100.0 * s.sender_cpu / s.secs,
                if s.busiest.is_empty() {
                    format!("{:.2}", s.visible)
                } else {
                    format!("{:.2} ({})", s.visible, s.busiest)
                },
                if s.clean(a.tolerance) { "yes" } else { "no" },
            );
            if s.send_errors > 0 || s.kernel_in_errors != s.socket_drops {
                println!(
                    "|  (send errors {}; namespace-wide UDP InErrors {} RcvbufErrors {}) | | | | | | | | | | | |",
                    s.send_errors, s.kernel_in_errors, s.kernel_rcvbuf
                );
            }
        }
    }
    println!();
    for r in &reports {
        let (best, bound) = sustained(r, a.tolerance);
        let last = r.steps.last();
        let micros = last.map_or(0.0, |s| 1e6 * s.cpu / s.delivered.max(1) as f64);
        println!(
            "{}: sustained {:.0} pps{}; {:.2} µs CPU/datagram at the last step; peak RSS (VmHWM) {:.1} MiB, RSS {:.1} MiB; warm-up CPU {:.2} s; stderr lines {}; stop (SIGTERM; the null receiver: stdin closed) -> {} in {:.2} s",
            r.target.name(),
            best,
            match bound {
                Some(LowerBound::Sender) => " (no drops, the sender was the limit: a lower bound)",
                Some(LowerBound::Offered) =>
                    " (no drops at the highest rate offered: a lower bound)",
                None => "",
            },
            micros,
            r.hwm_kib as f64 / 1024.0,
            r.rss_kib as f64 / 1024.0,
            r.warm_cpu,
            r.log_lines,
            r.exit,
            r.shutdown_s
        );
        for w in &r.warnings {
            println!("  warning logged: {w}");
        }
    }
    for (i, r) in reports.iter().enumerate().filter(|(_, r)| !r.exit_ok) {
        println!(
            "!!! #{} {} did not stop cleanly ({}): its figures are not to be trusted",
            i + 1,
            r.target.name(),
            r.exit
        );
    }
    let pairs = rate_pairs(&reports, a.tolerance);
    let offered = |o: u64| {
        if o == 0 {
            "max".to_string()
        } else {
            o.to_string()
        }
    };
    for p in &pairs {
        let ((ns, nb), (gs, gb)) = (p.null_sustained, p.gateway_sustained);
        println!(
            "pair #{} null / #{} gateway: sustained gateway / null = {:.0} / {:.0} = {:.2}{}; {}",
            p.null + 1,
            p.gateway + 1,
            gs,
            ns,
            p.sustained_ratio().unwrap_or(f64::NAN),
            bound_note(nb, gb),
            match p.cpu {
                Some(c) => format!(
                    "CPU per datagram gateway / null at {} pps offered (the highest both took cleanly and were sent alike) = {:.2} / {:.2} µs = {}",
                    offered(c.offered),
                    1e6 * c.gateway,
                    1e6 * c.null,
                    p.cpu_ratio()
                        .map_or(no_cpu_ratio(std::slice::from_ref(p)).into(), |r| format!(
                            "{r:.2}"
                        ))
                ),
                None => "CPU per datagram: no offered rate both took cleanly and were sent alike"
                    .to_string(),
            }
        );
    }
    if !pairs.is_empty() {
        let (sustained, cpu) = rate_headline(&pairs);
        let notes: Vec<&str> = pairs
            .iter()
            .map(|p| bound_note(p.null_sustained.1, p.gateway_sustained.1))
            .collect();
        println!(
            "headline: gateway sustained / null receiver sustained = {:.2}{}; CPU per datagram gateway / null at the same offered rate = {} (median of {} pair{})",
            sustained.unwrap_or(f64::NAN),
            if notes.iter().all(|n| *n == notes[0]) {
                notes[0]
            } else {
                " (lower bounds differ between pairs: see each pair)"
            },
            cpu.map_or(no_cpu_ratio(&pairs).into(), |c| { format!("{c:.2}") }),
            pairs.len(),
            if pairs.len() == 1 { "" } else { "s" }
        );
    }
    Ok(())
}

/// What the lower bounds of a null receiver's and a gateway's sustained rates make of their
/// ratio.
fn bound_note(null: Option<LowerBound>, gateway: Option<LowerBound>) -> &'static str {
    match (null, gateway) {
        (Some(LowerBound::Sender), Some(LowerBound::Sender)) => {
            " (both lower bounds: the sender was the limit)"
        }
        (Some(_), Some(_)) => " (both lower bounds: no drops at the highest rate offered)",
        (Some(_), None) => " (null figure is a lower bound: ratio is an upper bound)",
        (None, Some(_)) => " (gateway figure is a lower bound)",
        (None, None) => "",
    }
}

/// Why pairs give no CPU-per-datagram ratio: no offered rate both took cleanly and were sent
/// alike, or there was one but the null receiver's CPU time there was under one tick of
/// /proc/PID/stat (10 ms), 0 µs a datagram (review ay: reported as no such rate, and NaN).
fn no_cpu_ratio(pairs: &[RatePair]) -> &'static str {
    if pairs.iter().any(|p| p.cpu.is_some()) {
        "n/a (at the same offered rate the null receiver's CPU time was under one tick of /proc/PID/stat: use a longer --seconds)"
    } else {
        "n/a (no offered rate both took cleanly and were sent alike)"
    }
}

/// Receiver CPU seconds per delivered datagram of two receivers at the same offered rate.
#[derive(Clone, Copy, Debug, PartialEq)]
struct SameRate {
    offered: u64,
    null: f64,
    gateway: f64,
}

/// Sent rates within this fraction of each other are the same rate (as [`Step::sender_bound`]'s
/// 97% of the offered rate).
const SAME_RATE: f64 = 0.97;

/// One null receiver / gateway pair of the rate mode's headline.
#[derive(Debug, PartialEq)]
struct RatePair {
    /// Where the two runs are in `--receivers`.
    null: usize,
    gateway: usize,
    null_sustained: (f64, Option<LowerBound>),
    gateway_sustained: (f64, Option<LowerBound>),
    /// `None` when no offered rate was clean for both.
    cpu: Option<SameRate>,
}

impl RatePair {
    fn sustained_ratio(&self) -> Option<f64> {
        (self.null_sustained.0 > 0.0).then(|| self.gateway_sustained.0 / self.null_sustained.0)
    }
    fn cpu_ratio(&self) -> Option<f64> {
        self.cpu
            .filter(|c| c.null > 0.0)
            .map(|c| c.gateway / c.null)
    }
}

/// CPU per datagram of both receivers at the highest offered rate at which both had a clean
/// step: compared at the same offered rate (docs/performance.md, section 1), not at each one's
/// last step, since with `--step` the gateway may stop stepping before the null receiver does.
/// The same offered rate must also be the same rate sent: the sender can fall short of it for
/// one receiver and not the other, and `--pps 0` offers each all it can; two steps whose sent
/// rates differ by more than [`SAME_RATE`] are not compared (CPU per datagram falls as the
/// rate rises).
fn cpu_at_same_rate(null: &Report, gateway: &Report, tol: f64) -> Option<SameRate> {
    let per_datagram = |s: &Step| s.cpu / s.delivered.max(1) as f64;
    let same_sent = |n: &Step, g: &Step| {
        let (a, b) = (n.sent_pps(), g.sent_pps());
        (a - b).abs() <= (1.0 - SAME_RATE) * a.max(b)
    };
    null.steps
        .iter()
        .filter(|n| n.clean(tol))
        .filter_map(|n| {
            let g = gateway
                .steps
                .iter()
                .find(|g| g.offered == n.offered && g.clean(tol) && same_sent(n, g))?;
            Some(SameRate {
                offered: n.offered,
                null: per_datagram(n),
                gateway: per_datagram(g),
            })
        })
        .max_by_key(|c| c.offered)
}

/// The k-th null receiver run paired with the k-th gateway run, as in the drain mode, so runs
/// repeated with `--receivers null,gateway,null,gateway` all count.
fn rate_pairs(reports: &[Report], tol: f64) -> Vec<RatePair> {
    let of = |t: Target| {
        reports
            .iter()
            .enumerate()
            .filter(move |(_, r)| r.target == t)
    };
    of(Target::Null)
        .zip(of(Target::Gateway))
        .map(|((i, n), (j, g))| RatePair {
            null: i,
            gateway: j,
            null_sustained: sustained(n, tol),
            gateway_sustained: sustained(g, tol),
            cpu: cpu_at_same_rate(n, g, tol),
        })
        .collect()
}

/// The headline's ratios, gateway / null: sustained rates, and CPU per datagram at the same
/// offered rate; each the median over the pairs that have one.
fn rate_headline(pairs: &[RatePair]) -> (Option<f64>, Option<f64>) {
    (
        median(pairs.iter().filter_map(RatePair::sustained_ratio).collect()),
        median(pairs.iter().filter_map(RatePair::cpu_ratio).collect()),
    )
}

// ---------------------------------------------------------------------------------------------
// Drain mode.

/// SO_RCVBUF asked for per queued datagram: a small datagram costs about 768-1280 bytes of
/// truesize in a receive queue, and the kernel doubles the request besides.
const DRAIN_BYTES_PER_DATAGRAM: u64 = 2048;

/// Truesize assumed per queued datagram when checking a granted buffer before sending.
const DRAIN_TRUESIZE: u64 = 1280;

/// The kernel's largest SO_RCVBUF request (it doubles it into an int).
const MAX_RCVBUF_REQUEST: u64 = i32::MAX as u64 / 2;

/// Signal numbers of Linux on x86, ARM and RISC-V (MIPS, SPARC and Alpha differ).
const SIGHUP: i32 = 1;
const SIGINT: i32 = 2;
const SIGTERM: i32 = 15;
const SIGCONT: i32 = 18;
const SIGSTOP: i32 = 19;

mod sys {
    unsafe extern "C" {
        pub fn kill(pid: i32, sig: i32) -> i32;
        pub fn signal(signum: i32, handler: usize) -> usize;
        pub fn raise(sig: i32) -> i32;
        pub fn pwrite(fd: i32, buf: *const u8, count: usize, offset: i64) -> isize;
        pub fn geteuid() -> u32;
    }
}

/// What a fatal signal (Ctrl-C) must undo: a receiver left stopped (0: none), and
/// net.core.rmem_max raised for the run (its open file, -1: none, and the old value).
static STOPPED_PID: AtomicI32 = AtomicI32::new(0);

/// The receivers this process has running (0: a free slot), ended by a fatal signal: a
/// harness killed with SIGTERM or SIGHUP left its gateway running (review ap), since `Drop`
/// does not run when a signal ends the process.
static CHILD_PIDS: [AtomicI32; 8] = [const { AtomicI32::new(0) }; 8];

/// Notes a running receiver for [`on_fatal_signal`] to end (the first 8 at once only).
fn register_child(pid: u32) {
    for slot in &CHILD_PIDS {
        if slot
            .compare_exchange(0, pid as i32, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            return;
        }
    }
}

/// Forgets a receiver that has been reaped.
fn unregister_child(pid: u32) {
    for slot in &CHILD_PIDS {
        let _ = slot.compare_exchange(pid as i32, 0, Ordering::SeqCst, Ordering::SeqCst);
    }
}

/// The receivers [`on_fatal_signal`] would end.
#[cfg(test)]
fn registered_children() -> Vec<i32> {
    CHILD_PIDS
        .iter()
        .map(|s| s.load(Ordering::SeqCst))
        .filter(|&p| p > 0)
        .collect()
}
static RMEM_FD: AtomicI32 = AtomicI32::new(-1);
static RMEM_OLD: AtomicU64 = AtomicU64::new(0);

/// Ends every running receiver (continuing a stopped one) and restores net.core.rmem_max,
/// then dies of the signal as it would have. Only async-signal-safe calls.
extern "C" fn on_fatal_signal(sig: i32) {
    let pid = STOPPED_PID.swap(0, Ordering::SeqCst);
    let fd = RMEM_FD.swap(-1, Ordering::SeqCst);
    // SAFETY: plain system calls on a pid, an fd this process owns, and a stack buffer.
    unsafe {
        if pid > 0 {
            sys::kill(pid, SIGTERM);
            sys::kill(pid, SIGCONT);
        }
        for slot in &CHILD_PIDS {
            let child = slot.swap(0, Ordering::SeqCst);
            if child > 0 {
                sys::kill(child, SIGTERM);
                sys::kill(child, SIGCONT);
            }
        }
        if fd >= 0 {
            let mut buf = [0u8; 24];
            let mut i = buf.len() - 1;
            buf[i] = b'\n';
            let mut v = RMEM_OLD.load(Ordering::SeqCst);
            loop {
                i -= 1;
                buf[i] = b'0' + (v % 10) as u8;
                v /= 10;
                if v == 0 {
                    break;
                }
            }
            sys::pwrite(fd, buf[i..].as_ptr(), buf.len() - i, 0);
        }
        sys::signal(sig, 0);
        sys::raise(sig);
    }
}

fn install_cleanup_on_signals() {
    for sig in [SIGHUP, SIGINT, SIGTERM] {
        // SAFETY: the handler only makes async-signal-safe calls.
        unsafe {
            // A signal ignored at start (`nohup`) stays ignored (SIG_IGN is 1).
            if sys::signal(sig, on_fatal_signal as extern "C" fn(i32) as usize) == 1 {
                sys::signal(sig, 1);
            }
        }
    }
}

fn read_rmem_max() -> Option<u64> {
    std::fs::read_to_string("/proc/sys/net/core/rmem_max")
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// net.core.rmem_max raised for the run; put back when dropped (errors included) or on a
/// fatal signal.
struct RmemMax {
    old: u64,
    raised: Option<std::fs::File>,
}

impl RmemMax {
    /// Makes sure net.core.rmem_max lets a socket have `want` bytes of SO_RCVBUF: raises it for
    /// the run when root, else says how. Returns the guard and the value in force.
    fn ensure(want: u64) -> (RmemMax, u64) {
        let Some(old) = read_rmem_max() else {
            eprintln!("loadtest: cannot read /proc/sys/net/core/rmem_max; SO_RCVBUF may be capped");
            return (
                RmemMax {
                    old: 0,
                    raised: None,
                },
                0,
            );
        };
        if old >= want {
            return (RmemMax { old, raised: None }, old);
        }
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { sys::geteuid() } == 0;
        let opened = if root {
            std::fs::OpenOptions::new()
                .write(true)
                .open("/proc/sys/net/core/rmem_max")
        } else {
            Err(std::io::ErrorKind::PermissionDenied.into())
        };
        let written = opened.and_then(|f| {
            use std::os::unix::fs::FileExt;
            RMEM_OLD.store(old, Ordering::SeqCst);
            RMEM_FD.store(std::os::fd::AsRawFd::as_raw_fd(&f), Ordering::SeqCst);
            match f.write_all_at(format!("{want}\n").as_bytes(), 0) {
                Ok(()) => Ok(f),
                Err(e) => {
                    RMEM_FD.store(-1, Ordering::SeqCst);
                    Err(e)
                }
            }
        });
        match written {
            Ok(f) if read_rmem_max() == Some(want) => {
                eprintln!(
                    "loadtest: raised net.core.rmem_max {old} -> {want} for this run (restored at the end; if this process is killed: sysctl -w net.core.rmem_max={old})"
                );
                (
                    RmemMax {
                        old,
                        raised: Some(f),
                    },
                    want,
                )
            }
            r => {
                let why = match r {
                    Ok(_) => "the new value did not take".to_string(),
                    Err(e) => e.to_string(),
                };
                eprintln!(
                    "loadtest: !!! net.core.rmem_max is {old} B, but {want} B of SO_RCVBUF are wanted; could not raise it ({why}). Run as root:\n    sysctl -w net.core.rmem_max={want}\n  (or pass a smaller --drain); expect kernel drops while queued"
                );
                RMEM_FD.store(-1, Ordering::SeqCst);
                (RmemMax { old, raised: None }, old)
            }
        }
    }
}

impl Drop for RmemMax {
    fn drop(&mut self) {
        if let Some(f) = self.raised.take() {
            use std::os::unix::fs::FileExt;
            RMEM_FD.store(-1, Ordering::SeqCst);
            match f.write_all_at(format!("{}\n", self.old).as_bytes(), 0) {
                Ok(()) => eprintln!("loadtest: net.core.rmem_max restored to {}", self.old),
                Err(e) => eprintln!(
                    "loadtest: !!! could not restore net.core.rmem_max ({e}): sysctl -w net.core.rmem_max={}",
                    self.old
                ),
            }
        }
    }
}

/// A receiver stopped with SIGSTOP; continued (SIGCONT) when dropped.
struct Stopped(u32);

impl Stopped {
    fn new(pid: u32) -> Res<Stopped> {
        STOPPED_PID.store(pid as i32, Ordering::SeqCst);
        let s = Stopped(pid);
        // SAFETY: a signal to our own child.
        if unsafe { sys::kill(pid as i32, SIGSTOP) } != 0 {
            return Err(format!(
                "SIGSTOP {pid}: {}",
                std::io::Error::last_os_error()
            ));
        }
        // Every thread must be in the group stop before traffic is queued.
        let deadline = Instant::now() + Duration::from_secs(5);
        while !all_threads_stopped(pid) {
            if Instant::now() > deadline {
                return Err(format!("receiver {pid} did not stop"));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(s)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        // SAFETY: a signal to our own child.
        unsafe {
            sys::kill(self.0 as i32, SIGCONT);
        }
        STOPPED_PID.store(0, Ordering::SeqCst);
    }
}

/// Every thread of `pid` is stopped (state T).
fn all_threads_stopped(pid: u32) -> bool {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    dir.flatten().all(|t| {
        std::fs::read_to_string(t.path().join("stat")).is_ok_and(|s| {
            s.rsplit_once(')')
                .and_then(|(_, r)| r.split_whitespace().next())
                .is_some_and(|st| st == "T" || st == "t")
        })
    })
}

/// Run time of every live thread of a process, in seconds, from
/// `/proc/PID/task/*/schedstat` (nanoseconds, where /proc/PID/stat counts 10 ms ticks).
fn sched_cpu_seconds(pid: u32) -> f64 {
    schedstat_sum(pid, 0).map_or(f64::NAN, |ns| ns as f64 / 1e9)
}

/// Times a process's threads were put on a CPU (the third field of every thread's
/// `schedstat`): each wake-up of a thread is one, and on one core each costs a switch away from
/// the thread that was running.
fn sched_switches(pid: u32) -> u64 {
    schedstat_sum(pid, 2).unwrap_or(0)
}

/// Field `field` of every live thread's `/proc/PID/task/TID/schedstat`, summed (0: run time in
/// ns, 1: wait time in ns, 2: times put on a CPU); `None` when the process is gone.
fn schedstat_sum(pid: u32, field: usize) -> Option<u64> {
    let dir = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    Some(
        dir.flatten()
            .filter_map(|t| {
                std::fs::read_to_string(t.path().join("schedstat"))
                    .ok()?
                    .split_whitespace()
                    .nth(field)?
                    .parse::<u64>()
                    .ok()
            })
            .sum(),
    )
}

/// Run time of each live thread of a process in seconds, by thread id, with its name.
fn thread_cpu(pid: u32) -> BTreeMap<u32, (String, f64)> {
    let mut out = BTreeMap::new();
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for t in dir.flatten() {
        let Some(tid) = t.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        let ns = std::fs::read_to_string(t.path().join("schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap_or(0);
        out.insert(tid, (comm.trim().to_owned(), ns as f64 / 1e9));
    }
    out
}

/// Bytes waiting in the sockets bound to 127.0.0.1:`port` (`rx_queue` of /proc/net/udp, the
/// truesize of the queued datagrams), summed over SO_REUSEPORT sockets.
fn socket_rx_queue(port: u16) -> u64 {
    let s = std::fs::read_to_string("/proc/net/udp").unwrap_or_default();
    let want = format!("0100007F:{port:04X}");
    s.lines()
        .skip(1)
        .filter(|l| l.split_whitespace().nth(1) == Some(want.as_str()))
        .filter_map(|l| {
            let q = l.split_whitespace().nth(4)?;
            u64::from_str_radix(q.split_once(':')?.1, 16).ok()
        })
        .sum()
}

/// The receive buffer the kernel granted the sockets bound to 127.0.0.1:`port` (sk_rcvbuf,
/// the doubled figure getsockopt(SO_RCVBUF) reports), from `ss -m`; the smallest if several.
fn socket_rcvbuf(port: u16) -> Option<u64> {
    let out = Command::new("ss")
        .args(["-Huamn", "sport", "=", &format!(":{port}")])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.split("skmem:(")
        .skip(1)
        .filter_map(|m| {
            m.split([',', ')'])
                .find_map(|f| f.strip_prefix("rb"))?
                .parse::<u64>()
                .ok()
        })
        .min()
}

#[derive(Debug)]
struct Drain {
    target: Target,
    queued: u64,
    send_errors: u64,
    send_secs: f64,
    /// Kernel drops at the receiver's socket while it was stopped (the figure is then invalid),
    /// and after it was continued.
    drops_queued: u64,
    drops_after: u64,
    /// Bytes queued when continued, and the receive buffer granted.
    rx_queue: u64,
    rcvbuf: Option<u64>,
    /// CPU seconds from SIGCONT until the receiver went quiet: every thread's schedstat (ns),
    /// and /proc/PID/stat (10 ms ticks) as a check.
    cpu: f64,
    cpu_ticks: f64,
    /// Seconds from SIGCONT until the socket's queue was empty, and until the CPU went quiet.
    wall: f64,
    busy_wall: f64,
    /// Receiver CPU (cores) while idle before the stop, and CPU seconds in the tail window
    /// after the drain (the gateway's idle flushes of the drained text).
    idle: f64,
    tail_cpu: f64,
    tail_secs: f64,
    /// `None` when the receiver's counters could not be read before or after the drain (the
    /// figure is then invalid: a failed read is no count of 0).
    delivered: Option<u64>,
    envelopes: Option<u64>,
    gw_drops: Vec<(String, u64)>,
    /// Envelopes the gateway's receive workers could not hand to the sink (its queue was
    /// full) during the drain ([`sink_queue_refused`]).
    sink_queue_full: Option<u64>,
    hwm_kib: u64,
    rss_kib: u64,
    exit: String,
    /// The receiver stopped with status 0: a gateway that failed at its stop (an error, a
    /// panic, killed after 30 s) failed its run, whatever its counters said.
    exit_ok: bool,
    log_lines: u64,
    warnings: Vec<String>,
}

impl Drain {
    /// Every datagram queued was read and handled: none dropped by the kernel, none by the
    /// gateway (`pvp_t140_drops_total`), no envelope refused at its sink's queue, and the
    /// receiver stopped cleanly (review ap: a gateway that exited with an error or was killed
    /// at its stop still counted in the headline). A gateway that dropped work drained cheaper
    /// datagrams than the null receiver did.
    fn valid(&self) -> bool {
        self.queued > 0
            && self.drops_queued == 0
            && self.drops_after == 0
            && self.delivered.is_some_and(|d| d >= self.queued)
            && self.gw_drops.is_empty()
            && self.sink_queue_full.is_none_or(|f| f == 0)
            && self.cpu > 0.0
            && self.exit_ok
    }
    /// The CPU the drained datagrams cost: the drain's, and the tail's above the receiver's
    /// idle rate. The gateway's idle flush sends each stream's words after its last sentence
    /// end 2 s after they came, in the tail ([`TAIL`]): work for the drained datagrams done
    /// after the drain's window (review ah: the headline left it out).
    fn work_cpu(&self) -> f64 {
        self.cpu + (self.tail_cpu - self.idle * self.tail_secs).max(0.0)
    }
    fn per_cpu_second(&self) -> f64 {
        self.queued as f64 / self.work_cpu()
    }
}

/// Datagrams delivered, envelopes (the gateway's) and the gateway's drops between the counters
/// read before and after a drain; nothing when either read failed, since counting a failed
/// read as 0 would count the warm-up as drained.
fn drain_counts(
    target: Target,
    m0: Option<&BTreeMap<String, f64>>,
    m1: Option<&BTreeMap<String, f64>>,
) -> (Option<u64>, Option<u64>, Vec<(String, u64)>) {
    let (Some(m0), Some(m1)) = (m0, m1) else {
        return (None, None, Vec::new());
    };
    let delta = |k| counter(m1, k).saturating_sub(counter(m0, k));
    match target {
        Target::Null => (Some(delta("pvp_t140_datagrams_total")), None, Vec::new()),
        Target::Gateway => (
            Some(delta("pvp_t140_datagrams_total")),
            Some(delta("pvp_t140_envelopes_total")),
            gw_drops(m0, m1),
        ),
    }
}

/// Envelopes the gateway's receive workers could not hand to its sink (the queue was full)
/// between the counters read before and after a drain (`pvp_t140_sink_queue_refused_total`);
/// else, from a gateway without that metric, what its `stopped` line says at its stop;
/// `None` if neither was read. Review ay: only the `stopped` line was read, which
/// `--gateway-log warn` leaves out, and an overflow then passed as none.
fn sink_queue_refused(
    m0: Option<&BTreeMap<String, f64>>,
    m1: Option<&BTreeMap<String, f64>>,
    log_tail: &VecDeque<String>,
) -> Option<u64> {
    const REFUSED: &str = "pvp_t140_sink_queue_refused_total";
    if let (Some(m0), Some(m1)) = (m0, m1)
        && m1.contains_key(REFUSED)
    {
        return Some(counter(m1, REFUSED).saturating_sub(counter(m0, REFUSED)));
    }
    log_tail.iter().find_map(|l| {
        let v = l.split("sink_queue_full=").nth(1)?;
        v.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
    })
}

/// Seconds of tail after a drain: longer than the gateway's idle flush (2 s) and a metrics
/// publish (1 s).
const TAIL: Duration = Duration::from_secs(3);

fn run_drain(target: Target, a: &RateArgs, common: &Common, n: u64) -> Res<Drain> {
    let max_streams = (a.streams + 1024).to_string();
    let mut child = Child::spawn(target, common, &["--max-streams".into(), max_streams])?;
    let mut traffic = Traffic::new(child.addr, a.streams, common.sockets, a.red)?;
    if common.pin && cores() >= 2 {
        pin_current_thread(1);
    }
    // The rate mode's warm-up: every stream sends its first packet (opens the stream), gently.
    traffic.open_all(
        if a.pps == 0 {
            20_000
        } else {
            a.pps.min(20_000)
        },
        common.open_order,
    );
    let base = child.settle(traffic.sent);
    // The warm-up's text is flushed 2 s after it arrived (the gateway's idle flush): that
    // happens now, not inside the measurement. Then the receiver's idle CPU, for reference.
    std::thread::sleep(Duration::from_millis(match target {
        Target::Null => 200,
        Target::Gateway => 2500,
    }));
    let idle0 = sched_cpu_seconds(child.pid);
    std::thread::sleep(Duration::from_secs(1));
    let idle = sched_cpu_seconds(child.pid) - idle0;
    let m0 = child.drain_counters();
    let port = child.addr.port();
    let rcvbuf = socket_rcvbuf(port).or(child.rcvbuf);
    eprintln!(
        "  {}: {} streams open ({} of {} warm-up datagrams delivered); idle CPU {:.1}%; SO_RCVBUF granted {}",
        target.name(),
        a.streams,
        base,
        traffic.sent,
        100.0 * idle,
        rcvbuf.map_or("unknown".into(), |b| format!("{b} B"))
    );
    if let Some(b) = rcvbuf
        && b < n * DRAIN_TRUESIZE
    {
        eprintln!(
            "  !!! {}: a {b} B receive buffer holds about {} datagrams, fewer than --drain {n}: expect drops while queued",
            target.name(),
            b / DRAIN_TRUESIZE
        );
    }
    let d0 = socket_drops(port);
    let stopped = Stopped::new(child.pid)?;
    let (sent0, err0) = (traffic.sent, traffic.errors);
    let mut tried = 0u64;
    let (_, send_secs, _) = blast(
        |max| {
            let left = n - tried;
            if left == 0 {
                return 0;
            }
            let k = traffic.send_batch(max.min(left));
            tried += k;
            k
        },
        0,
        600.0,
        common.pin,
    );
    // Loopback delivers in the sender's softirq; let the last of it land.
    std::thread::sleep(Duration::from_millis(20));
    let queued = traffic.sent - sent0;
    let send_errors = traffic.errors - err0;
    let drops_queued = socket_drops(port) - d0;
    let rx_queue = socket_rx_queue(port);
    if drops_queued > 0 {
        eprintln!(
            "  !!! {}: the kernel DROPPED {drops_queued} of {queued} datagrams while they were queued (receive buffer {}, {rx_queue} B queued): this run is INVALID. Use a smaller --drain or a larger --recv-buffer / net.core.rmem_max",
            target.name(),
            rcvbuf.map_or("unknown".into(), |b| format!("{b} B"))
        );
    }
    let debug = std::env::var_os("LOADTEST_DEBUG").is_some();
    let threads0 = if debug {
        thread_cpu(child.pid)
    } else {
        BTreeMap::new()
    };
    let cpu0 = sched_cpu_seconds(child.pid);
    let switches0 = sched_switches(child.pid);
    let ticks0 = child.cpu();
    let split0 = stat_user_sys(&format!("/proc/{}/stat", child.pid));
    let t0 = Instant::now();
    drop(stopped);
    // The receiver drains on CPU 0 alone; this thread, on CPU 1, watches the kernel's queue and
    // the receiver's CPU time, never asks the receiver anything until it is done.
    let deadline = t0 + Duration::from_secs(300);
    while socket_rx_queue(port) > 0 {
        if Instant::now() > deadline {
            return Err(format!("{}: did not drain in 300 s", target.name()));
        }
        if let Ok(Some(st)) = child.child.try_wait() {
            return Err(format!("{} exited while draining: {st}", target.name()));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let wall = t0.elapsed().as_secs_f64();
    let at_empty = sched_cpu_seconds(child.pid) - cpu0;
    // Quiet: 200 ms in which the CPU time grew by less than 1% of a core (or 3x the idle rate)
    // in every 20 ms sample. The CPU figure ends at the last busy sample.
    let threshold = (0.01f64).max(3.0 * idle) * 0.02;
    let (mut cpu1, mut ticks1) = (sched_cpu_seconds(child.pid), child.cpu());
    let mut busy_at = t0.elapsed().as_secs_f64();
    let mut last = cpu1;
    let mut quiet_since = Instant::now();
    while quiet_since.elapsed() < Duration::from_millis(200) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
        let c = sched_cpu_seconds(child.pid);
        if c - last > threshold {
            cpu1 = c;
            ticks1 = child.cpu();
            busy_at = t0.elapsed().as_secs_f64();
            quiet_since = Instant::now();
        }
        last = c;
    }
    if debug {
        let threads1 = thread_cpu(child.pid);
        let busy: Vec<String> = threads1
            .iter()
            .filter_map(|(tid, (name, c))| {
                let d = c - threads0.get(tid).map_or(0.0, |x| x.1);
                (d >= 0.0005).then(|| format!("{name}[{tid}] {d:.3}"))
            })
            .collect();
        let split1 = stat_user_sys(&format!("/proc/{}/stat", child.pid));
        eprintln!(
            "  {}: CPU {at_empty:.3} s when the queue was empty, {:.3} s when quiet (user {:.2} s, kernel {:.2} s); threads put on a CPU {} times; by thread: {}",
            target.name(),
            cpu1 - cpu0,
            split1.0 - split0.0,
            split1.1 - split0.1,
            sched_switches(child.pid) - switches0,
            busy.join(", ")
        );
    }
    let tail0 = Instant::now();
    let tail_c0 = sched_cpu_seconds(child.pid);
    std::thread::sleep(TAIL);
    let tail_cpu = sched_cpu_seconds(child.pid) - tail_c0;
    let tail_secs = tail0.elapsed().as_secs_f64();
    let drops_after = socket_drops(port) - d0 - drops_queued;
    let m1 = child.drain_counters();
    let (delivered, envelopes, gw_drops) = drain_counts(target, m0.as_ref(), m1.as_ref());
    if delivered.is_none() {
        eprintln!(
            "  !!! {}: its counters could not be read {} the drain: this run is INVALID",
            target.name(),
            if m0.is_none() { "before" } else { "after" }
        );
    }
    let (rss, hwm) = child.memory();
    let log_lines = child.log_lines.load(Ordering::Relaxed);
    let warns = child.log_warnings.clone();
    let tail = child.log_tail.clone();
    let (exit, exit_ok, _) = child.stop();
    let warnings = warns.lock().expect("lock").clone();
    let sink_queue_full = match target {
        Target::Null => None,
        Target::Gateway => {
            sink_queue_refused(m0.as_ref(), m1.as_ref(), &tail.lock().expect("lock"))
        }
    };
    let d = Drain {
        target,
        queued,
        send_errors,
        send_secs,
        drops_queued,
        drops_after,
        rx_queue,
        rcvbuf,
        cpu: cpu1 - cpu0,
        cpu_ticks: ticks1 - ticks0,
        wall,
        busy_wall: busy_at,
        idle,
        tail_cpu,
        tail_secs,
        delivered,
        envelopes,
        gw_drops,
        sink_queue_full,
        hwm_kib: hwm,
        rss_kib: rss,
        exit,
        exit_ok,
        log_lines,
        warnings,
    };
    eprintln!(
        "  {}: {} queued in {:.2} s ({:.0} B each in the queue), drained in {:.3} s wall, {:.3} s CPU (+ {:.3} s in the tail over idle): {:.0} datagrams/CPU-s{}",
        target.name(),
        d.queued,
        d.send_secs,
        d.rx_queue as f64 / d.queued.max(1) as f64,
        d.wall,
        d.cpu,
        d.work_cpu() - d.cpu,
        d.per_cpu_second(),
        if d.valid() { "" } else { " (INVALID)" }
    );
    Ok(d)
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    Some(if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    })
}

fn drain(a: &RateArgs, n: u64) -> Res<()> {
    let want = match a.common.recv_buffer {
        Some(b) => b,
        None => (n * DRAIN_BYTES_PER_DATAGRAM)
            .max(pvp_t140::udp::RECV_BUFFER as u64)
            .min(MAX_RCVBUF_REQUEST),
    };
    let mut common = a.common.clone();
    common.recv_buffer = Some(want);
    println!(
        "loadtest drain: {n} datagrams queued per receiver while it is stopped, then drained alone on {}; {} streams (opened {}), RED {}, workers {}, {} source ports",
        if receiver_pinned(a.common.pin) {
            "CPU 0"
        } else {
            "an unpinned core"
        },
        a.streams,
        a.common.open_order,
        a.red,
        a.common.workers,
        a.common.sockets.min(a.streams),
    );
    // Dropped last, after every receiver has stopped: restores net.core.rmem_max.
    let (_rmem, rmem_max) = RmemMax::ensure(want);
    println!(
        "machine: nproc {}, load average {}, net.core.rmem_max {rmem_max} B for the run (was {}), SO_RCVBUF requested {want} B (the kernel grants 2x, capped at 2x rmem_max)",
        cores(),
        load_average(),
        _rmem.old,
    );
    for i in 0..a.warmup_drains {
        let d = run_drain(Target::Null, a, &common, n)?;
        println!(
            "  warm-up drain {} (not counted): {:.2} µs CPU per datagram",
            i + 1,
            1e6 / d.per_cpu_second()
        );
    }
    let mut runs = Vec::new();
    for t in &a.receivers {
        runs.push(run_drain(*t, a, &common, n)?);
    }
    println!();
    println!(
        "| # | receiver | queued | kernel drops (queued / after) | queue B/datagram | SO_RCVBUF | drain CPU s | datagrams per CPU-second (drain and tail over idle) | CPU µs/datagram | CPU s (stat ticks) | wall s (queue empty) | wall s (CPU quiet) | delivered | envelopes | gateway drops | sink queue full | tail CPU s | idle CPU % | peak RSS MiB | valid |"
    );
    println!(
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | --- |"
    );
    for (i, d) in runs.iter().enumerate() {
        let drops: Vec<String> = d.gw_drops.iter().map(|(k, v)| format!("{k}={v}")).collect();
        println!(
            "| {} | {} | {} | {} / {} | {:.0} | {} | {:.3} | {:.0} | {:.2} | {:.2} | {:.3} | {:.3} | {} | {} | {} | {} | {:.2} | {:.1} | {:.1} | {} |",
            i + 1,
            d.target.name(),
            d.queued,
            d.drops_queued,
            d.drops_after,
            d.rx_queue as f64 / d.queued.max(1) as f64,
            d.rcvbuf.map_or("?".into(), |b| b.to_string()),
            d.cpu,
            d.per_cpu_second(),
            1e6 * d.work_cpu() / d.queued.max(1) as f64,
            d.cpu_ticks,
            d.wall,
            d.busy_wall,
            d.delivered.map_or("?".into(), |n| n.to_string()),
            match (d.target, d.envelopes) {
                (_, Some(e)) => e.to_string(),
                (Target::Null, None) => "n/a".to_string(),
                (Target::Gateway, None) => "?".to_string(),
            },
            match d.target {
                Target::Null => "n/a".to_string(),
                Target::Gateway if drops.is_empty() => "0".to_string(),
                Target::Gateway => drops.join(" "),
            },
            match (d.target, d.sink_queue_full) {
                (Target::Null, _) => "n/a".to_string(),
                (Target::Gateway, Some(f)) => f.to_string(),
                (Target::Gateway, None) => "?".to_string(),
            },
            d.tail_cpu,
            100.0 * d.idle,
            d.hwm_kib as f64 / 1024.0,
            if d.valid() { "yes" } else { "NO" },
        );
    }
    println!();
    for (i, d) in runs.iter().enumerate() {
        if d.send_errors > 0 {
            println!("#{}: {} send errors", i + 1, d.send_errors);
        }
        match d.delivered {
            Some(n) if n < d.queued => println!(
                "#{}: delivered {} of {} queued (+ {} dropped)",
                i + 1,
                n,
                d.queued,
                d.drops_queued + d.drops_after
            ),
            Some(_) => {}
            None => println!(
                "#{}: the receiver's counters could not be read before or after the drain: INVALID",
                i + 1
            ),
        }
        println!(
            "#{}: {}: queued in {:.2} s ({:.0} pps); tail {:.1} s after the drain {:.3} s CPU; RSS {:.1} MiB; stderr lines {}; stop -> {}",
            i + 1,
            d.target.name(),
            d.send_secs,
            d.queued as f64 / d.send_secs,
            d.tail_secs,
            d.tail_cpu,
            d.rss_kib as f64 / 1024.0,
            d.log_lines,
            d.exit
        );
        for w in &d.warnings {
            println!("  warning logged: {w}");
        }
    }
    if runs
        .iter()
        .any(|d| d.sink_queue_full.is_some_and(|f| f > 0))
    {
        println!(
            "!!! the gateway's sink queue ({} envelopes) overflowed during a drain: envelopes were dropped before the sink, so the sink's share of the work is missing from those runs' CPU: they are INVALID",
            pvp_t140::udp::SINK_QUEUE
        );
    }
    if runs.iter().any(|d| !d.gw_drops.is_empty()) {
        println!(
            "!!! the gateway dropped datagrams itself (gateway drops): those runs did less work a datagram and are INVALID"
        );
    }
    if runs.iter().any(|d| !d.exit_ok) {
        println!(
            "!!! a receiver did not stop cleanly (see its `stop ->` above): those runs are INVALID"
        );
    }
    if runs.iter().any(|d| d.drops_queued > 0) {
        println!(
            "!!! kernel drops while queued: those runs are INVALID (smaller --drain, or a larger --recv-buffer and net.core.rmem_max)"
        );
    }
    // The k-th null receiver run pairs with the k-th gateway run.
    let of = |t: Target| runs.iter().enumerate().filter(move |(_, d)| d.target == t);
    let mut ratios = Vec::new();
    for ((i, n), (j, g)) in of(Target::Null).zip(of(Target::Gateway)) {
        let ok = n.valid() && g.valid();
        let r = g.per_cpu_second() / n.per_cpu_second();
        println!(
            "pair #{} null / #{} gateway: {:.0} / {:.0} datagrams per CPU-second: gateway / null = {:.2}{}",
            i + 1,
            j + 1,
            n.per_cpu_second(),
            g.per_cpu_second(),
            r,
            if ok { "" } else { " (INVALID: not counted)" }
        );
        if ok {
            ratios.push(r);
        }
    }
    match median(ratios.clone()) {
        Some(m) => println!(
            "headline (drain {n}): gateway datagrams/CPU-s ÷ null receiver datagrams/CPU-s = {m:.2} (median of {} pair{})",
            ratios.len(),
            if ratios.len() == 1 { "" } else { "s" }
        ),
        None => println!("headline (drain {n}): no valid null/gateway pair"),
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Scale mode.

/// The datagrams a `send::Sender` (RED 2) makes for `text`, until idle.
fn sender_packets(i: u32, text: &str) -> Vec<Vec<u8>> {
    let cfg = SenderConfig {
        ssrc: ssrc_of(i),
        initial_seq: (i as u16).wrapping_mul(31),
        initial_ts: i.wrapping_mul(7919),
        cps: None,
        ..SenderConfig::default()
    };
    let mut s = Sender::new(cfg, T0);
    s.push_text(T0, text);
    s.packets_until_idle(T0)
}

fn scale_packets(kind: Kind, i: u32) -> Vec<Vec<u8>> {
    match kind {
        Kind::Idle => {
            let mut p = Vec::new();
            rtp::write_packet(&mut p, true, 98, 1, 0, ssrc_of(i), "\u{feff}".as_bytes());
            vec![p]
        }
        Kind::Text => sender_packets(i, &format!("Hello from stream {i}, still talking and")),
        Kind::Flushed => sender_packets(i, &format!("Hello from stream {i}. ")),
    }
}

fn scale(a: &ScaleArgs) -> Res<()> {
    println!(
        "scale: {} streams per kind, opened at {} pps, {} source ports; nproc {}, load average {}",
        a.streams,
        a.pps,
        a.common.sockets.min(a.streams),
        cores(),
        load_average()
    );
    println!();
    println!(
        "| kind | streams live | datagrams | kernel drops | RSS before | RSS after | RSS/stream | peak RSS | CPU to open | idle CPU % | envelopes | SIGTERM exit | shutdown s |"
    );
    println!(
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |"
    );
    let mut notes = Vec::new();
    for &kind in &a.kinds {
        let n = a.streams;
        let args: Vec<String> = [
            "--max-streams",
            &n.to_string(),
            "--stream-timeout-s",
            "600",
            "--idle-flush-ms",
            "600000",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let mut child = Child::spawn(Target::Gateway, &a.common, &args)?;
        std::thread::sleep(Duration::from_millis(1500));
        let (rss0, _) = child.memory();
        let per: Vec<Vec<Vec<u8>>> = (0..n).map(|i| scale_packets(kind, i)).collect();
        let total: u64 = per.iter().map(|p| p.len() as u64).sum();
        let socks = sockets_to(child.addr, a.common.sockets.min(n))?;
        let rounds = per.iter().map(Vec::len).max().unwrap_or(0);
        let k0 = socket_drops(child.addr.port());
        let cpu0 = child.cpu();
        let mut queue = (0..rounds).flat_map(|r| (0..n).map(move |i| (r, i)));
        let mut sent = 0u64;
        let mut errors = 0u64;
        // A bound only: the closure stops the sending when every packet is out.
        let secs = 3.0 * total as f64 / a.pps.max(1) as f64 + 10.0;
        let (_, took, _) = blast(
            |max| {
                let mut k = 0;
                while k < max.min(BATCH as u64) {
                    let Some((r, i)) = queue.next() else { break };
                    if let Some(p) = per[i as usize].get(r) {
                        match socks[i as usize % socks.len()].send(p) {
                            Ok(_) => sent += 1,
                            Err(_) => errors += 1,
                        }
                        k += 1;
                    }
                }
                k
            },
            a.pps,
            secs,
            a.common.pin,
        );
        let got = child.settle(total);
        std::thread::sleep(Duration::from_millis(1500));
        let cpu_open = child.cpu() - cpu0;
        let k1 = socket_drops(child.addr.port());
        let m = child.scrape()?;
        let live = counter(&m, "pvp_t140_streams_live");
        let envelopes = counter(&m, "pvp_t140_envelopes_total");
        let (rss1, _) = child.memory();
        // Silence: what the gateway spends holding the streams (timers, metrics publishing).
        let c0 = child.cpu();
        std::thread::sleep(Duration::from_secs_f64(a.idle_seconds));
        let idle = (child.cpu() - c0) / a.idle_seconds;
        let (rss2, hwm) = child.memory();
        // Read after the stop: shutdown may log (e.g. a full sink queue).
        let warns = child.log_warnings.clone();
        let (exit, exit_ok, shutdown_s) = child.stop();
        let name = format!("{kind:?}").to_lowercase();
        if !exit_ok {
            notes.push(format!(
                "{name}: the gateway did not stop cleanly ({exit}): this row is not to be trusted"
            ));
        }
        println!(
            "| {name} | {live} | {got}/{total} | {} | {:.1} MiB | {:.1} MiB | {:.0} B | {:.1} MiB | {:.2} s | {:.2} | {envelopes} | {exit} | {shutdown_s:.2} |",
            k1 - k0,
            rss0 as f64 / 1024.0,
            rss2 as f64 / 1024.0,
            // Saturating: with few streams the RSS can end below where it started.
            rss1.max(rss2).saturating_sub(rss0) as f64 * 1024.0 / f64::from(n),
            hwm as f64 / 1024.0,
            cpu_open,
            100.0 * idle,
        );
        if errors > 0 || took > secs + 1.0 {
            notes.push(format!(
                "{name}: {errors} send errors, sending took {took:.1} s"
            ));
        }
        for w in warns.lock().expect("lock").iter() {
            notes.push(format!("{name}: gateway logged: {w}"));
        }
    }
    for n in notes {
        println!("note: {n}");
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// t140llm mode.

struct Dgram {
    time: Time,
    source: SocketAddr,
    destination: SocketAddr,
    payload: Vec<u8>,
}

fn read_capture(path: &Path, port: u16) -> Res<Vec<Dgram>> {
    let mut out = Vec::new();
    pvp_t140::capture::read_udp(path, |d| {
        if d.destination.port() == port {
            out.push(Dgram {
                time: d.time,
                source: d.source,
                destination: d.destination,
                payload: d.payload,
            });
        }
    })
    .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(out)
}

/// `copies` of the capture back to back, each copy's RTP sequence numbers, timestamps and
/// capture times moved past the previous copy's.
///
/// The distance a copy is moved is the widest span of any one SSRC, each measured in serial
/// order (RFC 3550 section 3; RFC 1982) from that SSRC's own lowest number to its highest: a
/// capture of several streams with their own bases, or one whose first datagram is not its
/// lowest (reordered), still makes every copy new to a receiver that checks order (review ap:
/// the span was measured from the first datagram's number only, so a second SSRC's copies, or
/// every copy of a reordered capture, came back as old or duplicate, cheap to drop, and
/// flattered the core's rate).
fn expand(d: &[Dgram], copies: u32) -> Vec<Dgram> {
    let rtp: Vec<&Dgram> = d
        .iter()
        .filter(|x| x.payload.len() >= 12 && !rtp::looks_like_rtcp(&x.payload))
        .collect();
    let seq = |x: &Dgram| u16::from_be_bytes([x.payload[2], x.payload[3]]);
    let ts = |x: &Dgram| u32::from_be_bytes(x.payload[4..8].try_into().expect("4 bytes"));
    let ssrc = |x: &Dgram| u32::from_be_bytes(x.payload[8..12].try_into().expect("4 bytes"));
    // Per SSRC: its first datagram, and the lowest and highest signed distance from it.
    let mut spans: BTreeMap<u32, (u16, u32, i16, i16, i32, i32)> = BTreeMap::new();
    for x in &rtp {
        let e = spans.entry(ssrc(x)).or_insert((seq(x), ts(x), 0, 0, 0, 0));
        let ds = seq(x).wrapping_sub(e.0) as i16;
        let dt = ts(x).wrapping_sub(e.1) as i32;
        e.2 = e.2.min(ds);
        e.3 = e.3.max(ds);
        e.4 = e.4.min(dt);
        e.5 = e.5.max(dt);
    }
    let span_seq = spans
        .values()
        .map(|e| (i32::from(e.3) - i32::from(e.2)) as u16)
        .max()
        .unwrap_or(0)
        .wrapping_add(1);
    let span_ts = spans
        .values()
        .map(|e| (i64::from(e.5) - i64::from(e.4)) as u32)
        .max()
        .unwrap_or(0)
        .wrapping_add(1000);
    let t_first = d.first().map_or(T0, |x| x.time);
    let t_last = d.last().map_or(T0, |x| x.time);
    // Three seconds between copies: every copy's text is flushed (idle) before the next.
    let span_t = t_last.saturating_sub(t_first) + Duration::from_secs(3);
    let mut out = Vec::with_capacity(d.len() * copies as usize);
    for k in 0..copies {
        for x in d {
            let mut p = x.payload.clone();
            if p.len() >= 12 && !rtp::looks_like_rtcp(&p) {
                let s = seq(x).wrapping_add(span_seq.wrapping_mul(k as u16));
                let t = ts(x).wrapping_add(span_ts.wrapping_mul(k));
                p[2..4].copy_from_slice(&s.to_be_bytes());
                p[4..8].copy_from_slice(&t.to_be_bytes());
            }
            out.push(Dgram {
                time: x.time.saturating_add(span_t * k),
                source: x.source,
                destination: x.destination,
                payload: p,
            });
        }
    }
    out
}

/// Classic pcap, raw IPv4 link type (101), the format demux.mjs reads.
fn write_pcap(path: &Path, d: &[Dgram]) -> Res<()> {
    let mut w = std::io::BufWriter::new(std::fs::File::create(path).map_err(|e| e.to_string())?);
    let mut put = |b: &[u8]| w.write_all(b).map_err(|e| e.to_string());
    put(&0xa1b2_c3d4u32.to_le_bytes())?;
    put(&2u16.to_le_bytes())?;
    put(&4u16.to_le_bytes())?;
    put(&0i32.to_le_bytes())?;
    put(&0u32.to_le_bytes())?;
    put(&65_535u32.to_le_bytes())?;
    put(&101u32.to_le_bytes())?;
    for x in d {
        let (SocketAddr::V4(src), SocketAddr::V4(dst)) = (x.source, x.destination) else {
            return Err("IPv6 capture: not supported here".into());
        };
        let len = 20 + 8 + x.payload.len();
        put(&((x.time.0 / 1_000_000) as u32).to_le_bytes())?;
        put(&((x.time.0 % 1_000_000) as u32).to_le_bytes())?;
        put(&(len as u32).to_le_bytes())?;
        put(&(len as u32).to_le_bytes())?;
        let mut ip = [0u8; 20];
        ip[0] = 0x45;
        ip[2..4].copy_from_slice(&(len as u16).to_be_bytes());
        ip[8] = 64;
        ip[9] = 17;
        ip[12..16].copy_from_slice(&src.ip().octets());
        ip[16..20].copy_from_slice(&dst.ip().octets());
        put(&ip)?;
        put(&src.port().to_be_bytes())?;
        put(&dst.port().to_be_bytes())?;
        put(&((8 + x.payload.len()) as u16).to_be_bytes())?;
        put(&[0, 0])?;
        put(&x.payload)?;
    }
    w.flush().map_err(|e| e.to_string())
}

/// The stdout sink's buffer (`sink::stdout`: a 64 KiB `BufWriter`).
const NDJSON_BUFFER: usize = 64 << 10;

/// What the stdout sink does with each envelope: its JSON line and a newline appended to a
/// buffer that goes out (here to `io::sink`) and is reused once it holds 64 KiB. `json()` only
/// lends the string the core built, so its length alone would be no work at all.
fn ndjson_line(buf: &mut Vec<u8>, json: &str) {
    buf.extend_from_slice(json.as_bytes());
    buf.push(b'\n');
    if buf.len() >= NDJSON_BUFFER {
        ndjson_out(buf);
    }
}

/// Writes the buffer out to `io::sink` and empties it.
fn ndjson_out(buf: &mut Vec<u8>) {
    let _ = std::io::sink().write_all(std::hint::black_box(&buf[..]));
    buf.clear();
}

/// Datagrams per second of pvp-t140's core, envelopes made, and with `json` the NDJSON bytes
/// written as the stdout sink writes them (`ndjson_line`).
fn time_core(d: &[Dgram], json: bool) -> (f64, u64, u64) {
    let cfg = pvp_t140::Config {
        compat: pvp_t140::Compat::T140llm,
        t140_pt: 96,
        red_pt: 98,
        ..pvp_t140::Config::default()
    };
    let mut gw = pvp_t140::Gateway::new(cfg);
    let mut envelopes = 0u64;
    let mut bytes = 0u64;
    let mut buf = Vec::with_capacity(2 * NDJSON_BUFFER);
    let mut take = |gw: &mut pvp_t140::Gateway| {
        while let Some(e) = gw.poll_output() {
            envelopes += 1;
            if json {
                bytes += e.json().len() as u64 + 1;
                ndjson_line(&mut buf, e.json());
            }
            std::hint::black_box(e);
        }
    };
    let started = Instant::now();
    for x in d {
        gw.handle_datagram(x.time, x.source, &x.payload);
        take(&mut gw);
    }
    // The end of the capture: what the streams still hold is flushed (and they leave), as at
    // the gateway's stop; t140llm's demux ends its streams at the end of the file too.
    if let Some(last) = d.last() {
        gw.shutdown(last.time);
        take(&mut gw);
    }
    ndjson_out(&mut buf);
    let secs = started.elapsed().as_secs_f64();
    (d.len() as f64 / secs, envelopes, bytes)
}

/// The same work t140llm's demux does, done by pvp-t140's parts: RTP header parse and T.140
/// (UTF-8) decode of the payload into a growing string, one decoder per SSRC; no RED, no
/// sequence checks, no chunking or envelopes.
fn time_parse_only(d: &[Dgram]) -> f64 {
    use pvp_t140::t140::{DecodeStats, Decoder};
    let mut decoders: std::collections::HashMap<u32, (Decoder, String)> = Default::default();
    let mut counts = DecodeStats::default();
    let started = Instant::now();
    for x in d {
        if let Ok(p) = rtp::RtpPacket::parse(&x.payload) {
            let (dec, text) = decoders.entry(p.ssrc).or_default();
            dec.feed(p.payload, text, &mut counts);
            if text.len() > 1 << 20 {
                text.clear();
            }
        }
    }
    std::hint::black_box((&decoders, counts));
    d.len() as f64 / started.elapsed().as_secs_f64()
}

/// How long one run of t140llm's demux may take: its default capture runs in seconds; one
/// that hangs (a node stuck on a bad install) must not hang the harness.
const NODE_LIMIT: Duration = Duration::from_secs(600);

fn time_node(a: &T140llmArgs, pcap: &Path) -> Res<(f64, String)> {
    let mut child = Command::new(&a.node)
        .arg(&a.demux)
        .arg(pcap)
        .args(["--port", &a.port.to_string(), "--quiet"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{}: {e}", a.node))?;
    let mut stderr = child.stderr.take().expect("piped");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut stderr, &mut s);
        s
    });
    let deadline = Instant::now() + NODE_LIMIT;
    let status = loop {
        match child.try_wait() {
            Ok(Some(st)) => break st,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "demux.mjs did not end within {NODE_LIMIT:?}; killed"
                ));
            }
            Err(e) => return Err(format!("waiting for demux.mjs: {e}")),
        }
    };
    let err = reader.join().unwrap_or_default();
    if !status.success() {
        return Err(format!(
            "demux.mjs failed ({status}): {err} (run `cd interop/t140llm && npm install`)"
        ));
    }
    let line = err.lines().last().unwrap_or("").to_owned();
    let rate = line
        .split("= ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|v| v.parse::<f64>().ok())
        .ok_or_else(|| format!("unexpected demux.mjs output: {err}"))?;
    Ok((rate, line))
}

fn t140llm(a: &T140llmArgs) -> Res<()> {
    let node_version = Command::new(&a.node)
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_else(|_| "node not found".into());
    println!(
        "t140llm: {} copies per capture, best of {} alternating runs each; node {node_version}; nproc {}, load average {}",
        a.copies,
        a.runs,
        cores(),
        load_average()
    );
    println!();
    println!(
        "| capture | datagrams | t140llm demux dgram/s | pvp-t140 core dgram/s | ratio | pvp-t140 + NDJSON dgram/s | ratio | envelopes | pvp-t140 parse+decode only dgram/s | ratio |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    let dir = std::env::temp_dir().join(format!("pvp-t140-loadtest-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    for cap in &a.captures {
        let base = read_capture(cap, a.port)?;
        if base.is_empty() {
            println!("| {} | 0 | | | | | | | | |", cap.display());
            continue;
        }
        let big = expand(&base, a.copies);
        let pcap = dir.join(cap.file_name().unwrap_or_default());
        write_pcap(&pcap, &big)?;
        // pvp-t140 reads the very file node reads.
        let same = read_capture(&pcap, a.port)?;
        assert_eq!(same.len(), big.len(), "capture round trip");
        drop(big);
        let (mut node, mut core, mut core_json, mut parse) = (0.0f64, 0.0f64, 0.0f64, 0.0f64);
        let mut envelopes = 0;
        for _ in 0..a.runs {
            node = node.max(time_node(a, &pcap)?.0);
            let (r, e, _) = time_core(&same, false);
            core = core.max(r);
            envelopes = e;
            core_json = core_json.max(time_core(&same, true).0);
            parse = parse.max(time_parse_only(&same));
        }
        println!(
            "| {} | {} | {:.0} | {:.0} | {:.1}x | {:.0} | {:.1}x | {} | {:.0} | {:.1}x |",
            cap.file_name().unwrap_or_default().to_string_lossy(),
            same.len(),
            node,
            core,
            core / node,
            core_json,
            core_json / node,
            envelopes,
            parse,
            parse / node
        );
        let _ = std::fs::remove_file(&pcap);
    }
    let _ = std::fs::remove_dir(&dir);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(steps: Vec<Step>) -> Report {
        report_of(Target::Gateway, steps)
    }

    fn report_of(target: Target, steps: Vec<Step>) -> Report {
        Report {
            target,
            steps,
            hwm_kib: 0,
            rss_kib: 0,
            warm_cpu: 0.0,
            exit: String::new(),
            exit_ok: true,
            shutdown_s: 0.0,
            log_lines: 0,
            warnings: Vec::new(),
        }
    }

    /// A clean last step is a lower bound, said to be the sender's only when the sender fell
    /// short of the rate offered: a paced window (no --step) the sender kept up with is "no
    /// drops at the highest rate offered" (review, session 32: it was reported as "the sender
    /// was the limit"); a step the sender fell short of is the sender's; a dropping one is no
    /// bound.
    #[test]
    fn a_paced_clean_window_is_not_reported_as_limited_by_the_sender() {
        let step = Step {
            offered: 100_000,
            sent: 399_990,
            secs: 4.0,
            delivered: 399_990,
            ..Step::default()
        };
        assert!(step.clean(0.001));
        assert!(
            !step.sender_bound(),
            "the sender kept up with the offered rate"
        );
        let (best, bound) = sustained(&report(vec![step.clone()]), 0.001);
        assert_eq!(best, 99_997.5);
        assert_eq!(bound, Some(LowerBound::Offered));

        let short = Step {
            offered: 200_000,
            sent: 600_000,
            delivered: 600_000,
            ..step.clone()
        };
        assert!(short.sender_bound());
        let (best, bound) = sustained(&report(vec![step.clone(), short]), 0.001);
        assert_eq!((best, bound), (150_000.0, Some(LowerBound::Sender)));

        let dropping = Step {
            offered: 125_000,
            sent: 500_000,
            delivered: 450_000,
            ..step.clone()
        };
        let (best, bound) = sustained(&report(vec![step, dropping]), 0.001);
        assert_eq!((best, bound), (99_997.5, None));
    }

    /// A 4 s window at `offered` pps, every datagram delivered (clean) or a tenth lost, at
    /// `micros` µs of receiver CPU per datagram.
    fn window(offered: u64, clean: bool, micros: f64) -> Step {
        let sent = offered * 4;
        let delivered = if clean { sent } else { sent - sent / 10 };
        Step {
            offered,
            sent,
            secs: 4.0,
            delivered,
            cpu: micros * 1e-6 * delivered as f64,
            ..Step::default()
        }
    }

    /// The rate mode's CPU per datagram gateway / null is taken at the highest offered rate
    /// both receivers took cleanly, not at each one's last step (with --step the gateway stops
    /// at its first step with drops while the null receiver steps on), and with --receivers
    /// null,gateway,null,gateway every pair counts, the k-th null with the k-th gateway, the
    /// headline being the median over pairs (review, session 34: it divided the last steps,
    /// at different offered rates, of the first pair only).
    #[test]
    fn cpu_per_datagram_is_compared_at_the_same_offered_rate_in_every_pair() {
        let null = |m: f64| {
            report_of(
                Target::Null,
                vec![
                    window(100_000, true, m),
                    window(125_000, true, m),
                    window(156_250, true, 2.0 * m),
                ],
            )
        };
        let gateway = |m: f64| {
            report_of(
                Target::Gateway,
                vec![window(100_000, true, m), window(125_000, false, 9.0)],
            )
        };
        let one = rate_pairs(&[null(2.0), gateway(3.0)], 0.001);
        assert_eq!(one.len(), 1);
        let c = one[0].cpu.expect("a rate both took cleanly");
        assert_eq!(c.offered, 100_000, "the gateway dropped at 125,000");
        assert!((one[0].cpu_ratio().unwrap() - 1.5).abs() < 1e-9);

        let reports = [null(2.0), gateway(3.0), null(1.0), gateway(2.0), null(1.0)];
        let pairs = rate_pairs(&reports, 0.001);
        let at: Vec<(usize, usize)> = pairs.iter().map(|p| (p.null, p.gateway)).collect();
        assert_eq!(at, [(0, 1), (2, 3)], "the odd null run pairs with none");
        let (sustained, cpu) = rate_headline(&pairs);
        assert!((cpu.unwrap() - 1.75).abs() < 1e-9, "median of 1.5 and 2.0");
        assert!((sustained.unwrap() - 100_000.0 / 156_250.0).abs() < 1e-9);

        // No offered rate clean for both: no CPU figure, rather than one from different rates.
        let gw_late = report_of(Target::Gateway, vec![window(200_000, true, 3.0)]);
        let pairs = rate_pairs(&[null(2.0), gw_late], 0.001);
        assert_eq!(pairs[0].cpu, None);
        assert_eq!(rate_headline(&pairs).1, None);
    }

    /// The same offered rate is no same rate when the sender fell short of it for one receiver
    /// and not the other, or offered all it could (`--pps 0`) to each: CPU per datagram falls
    /// as the rate rises (more datagrams a wake-up), so two receivers taken at different real
    /// rates are not compared like with like. Section 1 of docs/performance.md has both cases:
    /// at 152,587 offered the null receiver was sent 152,586 a second, the gateway 131,020;
    /// flat out, 278,185 and 107,122 (review g: both were reported "at the same offered rate").
    #[test]
    fn cpu_per_datagram_is_not_compared_at_different_real_rates() {
        let short = |offered: u64, sent_pps: u64, micros: f64| Step {
            sent: sent_pps * 4,
            delivered: sent_pps * 4,
            cpu: micros * 1e-6 * (sent_pps * 4) as f64,
            ..window(offered, true, micros)
        };
        // Flat out: the sender gave the null receiver 278k a second, the gateway 107k.
        let null = report_of(Target::Null, vec![short(0, 278_185, 2.75)]);
        let gateway = report_of(Target::Gateway, vec![short(0, 107_122, 5.14)]);
        assert_eq!(rate_pairs(&[null, gateway], 0.001)[0].cpu, None);
        // Stepped: both clean at 152,587 offered, but the gateway was sent only 131,020 a
        // second; the highest rate both were really sent is the step below.
        let null = report_of(
            Target::Null,
            vec![window(122_070, true, 3.3), short(152_587, 152_586, 3.26)],
        );
        let gateway = report_of(
            Target::Gateway,
            vec![window(122_070, true, 4.22), short(152_587, 131_020, 4.08)],
        );
        let c = rate_pairs(&[null, gateway], 0.001)[0]
            .cpu
            .expect("a common rate");
        assert_eq!(c.offered, 122_070);
        // Flat out at rates within the sender's 3%: compared.
        let null = report_of(Target::Null, vec![short(0, 205_262, 2.34)]);
        let gateway = report_of(Target::Gateway, vec![short(0, 201_000, 4.0)]);
        assert!(rate_pairs(&[null, gateway], 0.001)[0].cpu.is_some());
    }

    fn drain_of(target: Target, delivered: Option<u64>) -> Drain {
        Drain {
            target,
            queued: 1000,
            send_errors: 0,
            send_secs: 0.1,
            drops_queued: 0,
            drops_after: 0,
            rx_queue: 0,
            rcvbuf: None,
            cpu: 0.01,
            cpu_ticks: 0.01,
            wall: 0.01,
            busy_wall: 0.01,
            idle: 0.0,
            tail_cpu: 0.0,
            tail_secs: 3.0,
            delivered,
            envelopes: None,
            gw_drops: Vec::new(),
            sink_queue_full: None,
            hwm_kib: 0,
            rss_kib: 0,
            exit: String::new(),
            exit_ok: true,
            log_lines: 0,
            warnings: Vec::new(),
        }
    }

    /// The text each stream had left when the drain ended (the words after its last sentence
    /// end: about a quarter of the drained text's chunks, with 30 words a stream of TEXT's
    /// 8-word sentences) is flushed by the gateway's idle flush, 2 s later: in the tail, after
    /// the figure's window closed. That work is the drained datagrams' as much as the chunks
    /// cut in the window, and the null receiver owes none: the tail's CPU above the receiver's
    /// idle counts in the drain's (review ah: it was measured and left out of the headline).
    #[test]
    fn the_idle_flushes_of_the_drained_text_count_in_the_drain() {
        let close = |a: f64, b: f64| (a - b).abs() < 1e-6 * b;
        let mut g = drain_of(Target::Gateway, Some(1000));
        (g.cpu, g.idle, g.tail_secs) = (0.010, 0.001, 3.0);
        // 0.003 s of idle over the 3 s tail, 0.004 s of flushes.
        g.tail_cpu = 0.007;
        assert!(close(g.work_cpu(), 0.014), "{}", g.work_cpu());
        assert!(close(g.per_cpu_second(), 1000.0 / 0.014));
        // A null receiver's tail is its idle: nothing added; a tail quieter than the idle
        // measured before takes nothing away.
        let mut n = drain_of(Target::Null, Some(1000));
        (n.cpu, n.idle, n.tail_secs, n.tail_cpu) = (0.010, 0.001, 3.0, 0.003);
        assert!(close(n.per_cpu_second(), 1000.0 / 0.010));
        n.tail_cpu = 0.0;
        assert!(close(n.per_cpu_second(), 1000.0 / 0.010));
    }

    /// A drain whose counters could not be read before (or after) it is invalid: a failed
    /// read counted as zero counters put the warm-up's datagrams and envelopes into the
    /// drain's, and its figure passed as valid (review, session 34).
    #[test]
    fn a_failed_counter_read_makes_the_drain_invalid() {
        let at = |datagrams: f64, envelopes: f64| {
            BTreeMap::from([
                ("pvp_t140_datagrams_total".to_owned(), datagrams),
                ("pvp_t140_envelopes_total".to_owned(), envelopes),
                (
                    "pvp_t140_drops_total{reason=\"malformed\"}".to_owned(),
                    datagrams / 1000.0,
                ),
            ])
        };
        let (m0, m1) = (at(10_000.0, 20.0), at(11_000.0, 26.0));
        let (delivered, envelopes, drops) = drain_counts(Target::Gateway, Some(&m0), Some(&m1));
        assert_eq!((delivered, envelopes), (Some(1000), Some(6)));
        assert_eq!(drops, [("malformed".to_owned(), 1)]);
        assert!(drain_of(Target::Gateway, delivered).valid());

        for (before, after) in [(None, Some(&m1)), (Some(&m0), None), (None, None)] {
            let (delivered, envelopes, drops) = drain_counts(Target::Gateway, before, after);
            assert_eq!((delivered, envelopes), (None, None), "no count of 0");
            assert!(drops.is_empty());
            assert!(!drain_of(Target::Gateway, delivered).valid());
            let (delivered, _, _) = drain_counts(Target::Null, before, after);
            assert!(!drain_of(Target::Null, delivered).valid());
        }
    }

    /// A datagram the gateway itself dropped (a reason of `pvp_t140_drops_total`), or an
    /// envelope its sink queue refused, is work the gateway did not do: a drain with either
    /// compared the gateway's CPU for less work with the null receiver's for all of it, and was
    /// counted as valid; a rate step with either was clean (review g). The null receiver has
    /// no such counters.
    #[test]
    fn a_gateway_that_dropped_work_is_no_valid_drain_and_no_clean_step() {
        let mut d = drain_of(Target::Gateway, Some(1000));
        assert!(d.valid());
        d.gw_drops = vec![("red_block_overrun".to_owned(), 900)];
        assert!(!d.valid(), "the gateway dropped 900 of 1000 datagrams");
        let mut d = drain_of(Target::Gateway, Some(1000));
        d.sink_queue_full = Some(40);
        assert!(!d.valid(), "40 envelopes refused at the sink's queue");
        d.sink_queue_full = Some(0);
        assert!(d.valid());
        // review ap: a gateway that failed at its stop counted in the headline.
        d.exit_ok = false;
        assert!(!d.valid(), "the gateway exited with an error or was killed");

        let mut step = window(100_000, true, 3.0);
        assert!(step.clean(0.001));
        step.gw_drops = vec![("stale".to_owned(), 4_000)];
        assert!(!step.clean(0.001), "1% dropped by the gateway");
        step.gw_drops = vec![("stale".to_owned(), 40)];
        assert!(step.clean(0.001), "within the tolerance");
    }

    /// A receiver is noted for the fatal-signal handler while it runs and forgotten once
    /// reaped (review ap: only a drain's stopped receiver was, so a SIGTERM to the harness in
    /// the rate, scale or ws mode left the gateway running).
    #[test]
    fn running_receivers_are_noted_for_the_fatal_signal_handler() {
        let child = Command::new("sleep").arg("30").spawn().expect("sleep");
        let pid = child.id();
        // As `Child::spawn` does once the receiver is started.
        register_child(pid);
        assert!(registered_children().contains(&(pid as i32)));
        let c = Child {
            target: Target::Null,
            child,
            pid,
            addr: "127.0.0.1:9".parse().expect("addr"),
            metrics: None,
            ctl: None,
            log_lines: Default::default(),
            log_tail: Default::default(),
            log_warnings: Default::default(),
            rcvbuf: None,
        };
        drop(c);
        assert!(
            !registered_children().contains(&(pid as i32)),
            "forgotten once reaped"
        );
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "killed and reaped"
        );
    }

    fn rtp_dgram(ssrc: u32, seq: u16, ts: u32, ms: u64) -> Dgram {
        let mut payload = vec![0x80, 96];
        payload.extend_from_slice(&seq.to_be_bytes());
        payload.extend_from_slice(&ts.to_be_bytes());
        payload.extend_from_slice(&ssrc.to_be_bytes());
        payload.push(b'a');
        Dgram {
            time: T0.saturating_add(Duration::from_millis(ms)),
            source: "127.0.0.1:5000".parse().expect("addr"),
            destination: "127.0.0.1:5004".parse().expect("addr"),
            payload,
        }
    }

    /// Every copy `expand` makes is new to a receiver that checks order: each SSRC's numbers
    /// and timestamps in copy k+1 are all after (in serial order) its numbers in copy k, with
    /// two streams of their own bases and with a capture whose first datagram is not its
    /// lowest (review ap: copies of the second stream went backwards by 535, and every copy
    /// of the reordered capture had the same numbers: duplicates the core drops cheaply).
    #[test]
    fn every_copy_of_a_capture_is_new_to_each_of_its_streams() {
        let two_streams = vec![
            rtp_dgram(1, 0, 0, 0),
            rtp_dgram(2, 40_000, 9_000, 1),
            rtp_dgram(1, 1, 300, 300),
            rtp_dgram(2, 40_001, 9_300, 301),
            rtp_dgram(2, 40_002, 9_600, 600),
        ];
        let reordered = vec![
            rtp_dgram(7, 65_535, 1_000, 0),
            rtp_dgram(7, 65_534, 700, 1),
            rtp_dgram(7, 0, 1_300, 300),
        ];
        for capture in [two_streams, reordered] {
            let out = expand(&capture, 3);
            assert_eq!(out.len(), 3 * capture.len());
            let mut per_ssrc: BTreeMap<u32, Vec<Vec<(u16, u32)>>> = BTreeMap::new();
            for (k, copy) in out.chunks(capture.len()).enumerate() {
                for x in copy {
                    let p = &x.payload;
                    let ssrc = u32::from_be_bytes(p[8..12].try_into().expect("4"));
                    let seq = u16::from_be_bytes([p[2], p[3]]);
                    let ts = u32::from_be_bytes(p[4..8].try_into().expect("4"));
                    let copies = per_ssrc.entry(ssrc).or_default();
                    copies.resize(copies.len().max(k + 1), Vec::new());
                    copies[k].push((seq, ts));
                }
            }
            for (ssrc, copies) in per_ssrc {
                for k in 1..copies.len() {
                    for &(s0, t0) in &copies[k - 1] {
                        for &(s1, t1) in &copies[k] {
                            let ds = s1.wrapping_sub(s0);
                            let dt = t1.wrapping_sub(t0);
                            assert!(
                                ds != 0 && ds < 0x8000,
                                "SSRC {ssrc}: copy {k} has seq {s1}, not after copy {}'s {s0}",
                                k - 1
                            );
                            assert!(
                                dt != 0 && dt < 0x8000_0000,
                                "SSRC {ssrc}: copy {k} has timestamp {t1}, not after {t0}"
                            );
                        }
                    }
                }
            }
        }
    }

    /// The t140llm mode's "+ NDJSON" pass does per envelope what the stdout sink does: its
    /// JSON line and a newline copied into a buffer written out every 64 KiB (review, session
    /// 34: it only added up `json().len()`, the length of a string the core had already built).
    #[test]
    fn the_ndjson_pass_writes_each_envelope_as_a_line() {
        let mut buf = Vec::new();
        ndjson_line(&mut buf, r#"{"type":"context.add"}"#);
        ndjson_line(&mut buf, r#"{"type":"session.leave"}"#);
        assert_eq!(
            buf,
            b"{\"type\":\"context.add\"}\n{\"type\":\"session.leave\"}\n"
        );
        let line = "x".repeat(1000);
        let mut written = buf.len();
        while written < NDJSON_BUFFER {
            ndjson_line(&mut buf, &line);
            written += line.len() + 1;
            let held = if written < NDJSON_BUFFER { written } else { 0 };
            assert_eq!(buf.len(), held);
        }
        assert!(buf.is_empty(), "written out and reused at 64 KiB");
        ndjson_line(&mut buf, "{}");
        assert_eq!(buf, b"{}\n");
    }

    /// Found by review ay (session 46). `--seconds=-1` (and `ws --seconds`, `scale
    /// --idle-seconds`) panicked in `Duration::from_secs_f64`, and `--step --step-factor 1`
    /// (or a factor so near 1 that the next rate rounded back to the same one, 1.00001 x
    /// 50,000) offered the same rate forever while the receiver kept up. Now refused when
    /// parsed, and every step offers at least 1 pps more.
    #[test]
    fn bad_window_lengths_and_step_factors_are_refused_and_stepping_always_moves_on() {
        let parse = |args: &[&str]| {
            Cli::try_parse_from(std::iter::once("loadtest").chain(args.iter().copied()))
        };
        for bad in [
            &["--seconds=-1"][..],
            &["--seconds", "0"],
            &["--seconds", "NaN"],
            &["--seconds", "1e300"],
            &["--step", "--step-factor", "1"],
            &["--step", "--step-factor", "0.5"],
            &["--step", "--step-factor", "inf"],
            &["ws", "--seconds=-2"],
            &["scale", "--idle-seconds=-1"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?} was accepted");
        }
        let ok = parse(&["--seconds", "0.5", "--step", "--step-factor", "1.00001"]).unwrap();
        assert_eq!(ok.rate.seconds, 0.5);
        assert!(parse(&["ws", "--seconds", "2.5"]).is_ok());
        assert_eq!(next_offered(50_000, 1.25), 62_500);
        assert_eq!(next_offered(50_000, 1.00001), 50_001);
        assert_eq!(next_offered(u64::MAX, 1.5), u64::MAX);
    }

    /// Found by review ay (session 46). At a rate where the null receiver used less than one
    /// /proc/PID/stat tick (10 ms) of CPU in its window, its CPU per datagram read 0: the pair
    /// printed a ratio of NaN and the headline said "no offered rate both took cleanly and were
    /// sent alike", though one had. Now each says the null receiver's CPU was under a tick.
    #[test]
    fn a_null_receiver_under_one_cpu_tick_is_not_reported_as_no_common_rate() {
        let pair = |null: f64| RatePair {
            null: 0,
            gateway: 1,
            null_sustained: (1_000.0, None),
            gateway_sustained: (1_000.0, None),
            cpu: Some(SameRate {
                offered: 1_000,
                null,
                gateway: 50e-6,
            }),
        };
        let under_a_tick = [pair(0.0)];
        assert_eq!(under_a_tick[0].cpu_ratio(), None);
        assert_eq!(rate_headline(&under_a_tick).1, None);
        assert!(no_cpu_ratio(&under_a_tick).contains("under one tick"));
        let none = [RatePair {
            cpu: None,
            ..pair(0.0)
        }];
        assert!(no_cpu_ratio(&none).contains("no offered rate"));
        let both = [pair(25e-6)];
        assert_eq!(rate_headline(&both).1, Some(2.0));
    }

    /// Found by review ay (session 46). The gateway binary was looked for only when its turn
    /// came: `cargo run --release --example loadtest -- --step` (the README's command, which
    /// does not build the gateway) ran the null receiver's whole stepped run, minutes, and then
    /// failed. Now a missing binary is refused before any receiver starts.
    #[test]
    fn a_missing_gateway_binary_is_refused_before_any_receiver_runs() {
        let missing = "/nonexistent/review-ay/pvp-t140";
        for mode in [&[][..], &["--drain", "10"]] {
            let cli = Cli::try_parse_from(
                [
                    "loadtest",
                    "--streams",
                    "1",
                    "--seconds",
                    "0.1",
                    "--gateway",
                    missing,
                ]
                .into_iter()
                .chain(mode.iter().copied()),
            )
            .unwrap();
            let err = rate(&cli.rate).unwrap_err();
            assert!(
                err.starts_with(missing) && err.contains("not found"),
                "{mode:?}: {err}"
            );
        }
    }

    /// Found by review ay (session 46). `--tolerance` took any number: a negative one made
    /// every step "DROPS" (a sustained rate of 0 for a receiver that lost nothing), and 1 or
    /// more made a step that lost every datagram "clean". Now refused when parsed.
    #[test]
    fn a_tolerance_outside_0_to_1_is_refused() {
        let parse = |t: &str| Cli::try_parse_from(["loadtest", "--tolerance", t]);
        for bad in ["-0.1", "1", "2", "NaN"] {
            assert!(parse(bad).is_err(), "--tolerance {bad} was accepted");
        }
        assert_eq!(parse("0").unwrap().rate.tolerance, 0.0);
        assert_eq!(parse("0.01").unwrap().rate.tolerance, 0.01);
        let lost_all = Step {
            offered: 1_000,
            sent: 4_000,
            secs: 4.0,
            delivered: 0,
            ..Step::default()
        };
        assert!(!lost_all.clean(parse("0.999").unwrap().rate.tolerance));
    }

    /// Found by review ay (session 46). `loadtest t140llm --runs 0` timed nothing and printed
    /// rates of 0 and a ratio of NaN as the best of 0 runs; `--copies 0` timed an empty
    /// capture. Both refused when parsed.
    #[test]
    fn t140llm_runs_and_copies_of_0_are_refused() {
        let parse = |args: &[&str]| {
            Cli::try_parse_from(
                ["loadtest", "t140llm"]
                    .into_iter()
                    .chain(args.iter().copied()),
            )
        };
        assert!(parse(&["--runs", "0"]).is_err());
        assert!(parse(&["--copies", "0"]).is_err());
        assert!(parse(&["--runs", "1", "--copies", "1"]).is_ok());
    }

    /// Found by review ay (session 46). A drain's check that the gateway's sink queue never
    /// overflowed (envelopes dropped before the sink, so its work missing from the CPU figure)
    /// read only the `sink_queue_full=` of the gateway's `stopped` line, an info line that
    /// `--gateway-log warn` leaves out: the overflow then counted as none and the run as valid.
    /// The gateway counts the same refusals on /metrics, which the drain reads anyway.
    #[test]
    fn a_sink_queue_overflow_is_seen_on_metrics_whatever_the_log_level() {
        let key = "pvp_t140_sink_queue_refused_total".to_owned();
        let m0 = BTreeMap::from([(key.clone(), 2.0)]);
        let m1 = BTreeMap::from([(key, 7.0)]);
        let no_stopped_line = VecDeque::from(["WARN something else".to_owned()]);
        let refused = sink_queue_refused(Some(&m0), Some(&m1), &no_stopped_line);
        assert_eq!(refused, Some(5));
        let d = Drain {
            sink_queue_full: refused,
            ..drain_of(Target::Gateway, Some(1000))
        };
        assert!(!d.valid(), "an overflow of the sink queue passed as none");
        // A gateway without the metric: its `stopped` line, else unknown.
        let stopped = VecDeque::from(["INFO stopped sent=3 sink_queue_full=4 x=1".to_owned()]);
        let empty = BTreeMap::new();
        assert_eq!(
            sink_queue_refused(Some(&empty), Some(&empty), &stopped),
            Some(4)
        );
        assert_eq!(sink_queue_refused(None, None, &no_stopped_line), None);
    }

    /// Found by review ay (session 46). A rate step counted only the gateway's datagram drops:
    /// one in which its sink queue was full and it dropped envelopes (text lost, the sink's
    /// work not done) was "clean", and could be the gateway's sustained rate.
    #[test]
    fn a_rate_step_that_dropped_envelopes_at_the_sink_queue_is_not_clean() {
        let m0 = BTreeMap::from([
            ("pvp_t140_sink_queue_refused_total".to_owned(), 10.0),
            (
                "pvp_t140_drops_total{reason=\"stale_or_duplicate\"}".to_owned(),
                1.0,
            ),
        ]);
        let m1 = BTreeMap::from([
            ("pvp_t140_sink_queue_refused_total".to_owned(), 5_010.0),
            (
                "pvp_t140_drops_total{reason=\"stale_or_duplicate\"}".to_owned(),
                1.0,
            ),
        ]);
        let drops = step_drops(&m0, &m1);
        assert_eq!(drops, vec![("sink_queue_refused".to_owned(), 5_000)]);
        let step = Step {
            offered: 50_000,
            sent: 200_000,
            secs: 4.0,
            delivered: 200_000,
            gw_drops: drops,
            ..Step::default()
        };
        assert!(!step.clean(0.001));
        assert!(step_drops(&m1, &m1).is_empty());
    }

    /// Found by review ay (session 46). A rate step whose scrape of the gateway's /metrics
    /// failed, before or after the window, had no gateway drops (an empty list) and could be
    /// clean: a failed read counted as none dropped, where the drain mode makes it invalid.
    #[test]
    fn a_rate_step_whose_gateway_counters_were_not_read_is_not_clean() {
        let step = Step {
            offered: 1_000,
            sent: 4_000,
            secs: 4.0,
            delivered: 4_000,
            ..Step::default()
        };
        assert!(step.clean(0.001));
        let unread = Step {
            drops_unknown: true,
            ..step
        };
        assert!(!unread.clean(0.001));
    }
}
