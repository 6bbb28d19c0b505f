//! `loadtest ws`: the gateway with a real PVP WebSocket server as its sink.
//!
//! With `--server` every RTP stream becomes a virtual participant with a WebSocket connection
//! of its own, and all of those connections are tasks of the gateway's control runtime (one
//! tokio worker thread, src/main.rs `run_live`). This mode measures that runtime under many
//! participants: N streams each type a sentence every `--sentence-every-ms` (RFC 4103 pacing,
//! a word group per 300 ms packet, RED 2), and a minimal PVP server in this process counts
//! what arrives and when.
//!
//! The run has two phases. Warm-up: every stream sends sentence 0, spread over
//! N / `--open-per-s` seconds, so every participant joins and opens its connection; the
//! harness waits (with a deadline) until the server holds N connections and has every
//! sentence 0. Window: `--seconds` of sentences 1, 2, ... at the chosen cadence, streams
//! evenly staggered, then a settle that polls until every sentence has arrived (deadline).
//! Latency is from sending the datagram that completes a sentence (the one carrying its `. `,
//! which makes the gateway cut the chunk at once) to its `context.add` reaching the server;
//! the sentence text carries the stream and sentence numbers, parsed back from the envelope.
//!
//! The server is the measuring instrument, so it is kept small (counts and one timestamp per
//! `context.add`, no validation; tests/common/pvp_server.rs is the validating one) and runs
//! on a multi-thread runtime of its own. With `--pin` (2+ cores) the gateway has CPU 0 to
//! itself and the server and the sending thread share the other cores.
//!
//! `--echo` makes the server route like the reference PVP server: every envelope but
//! heartbeats goes back to every open connection, so N participants in one session receive
//! each message N times, and the gateway's control runtime reads N^2 frames for N joins.
//! `--tls` serves `wss://` with a self-signed certificate the gateway trusts via `--ca-file`.

use std::borrow::Cow;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, HashSet, VecDeque};
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Args;
use futures_util::{SinkExt, StreamExt};
use pvp_t140::send::Sender;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;

use super::{
    BUFFER_TIME, Child, Common, Res, T0, Target, cores, counter, load_average, memory_kib,
    pin_current_thread, sender_config, sockets_to, thread_cpu,
};

#[derive(Args, Debug)]
pub struct WsArgs {
    /// Concurrent RTP streams, so virtual participants, so WebSocket connections.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..))]
    streams: u32,
    /// Length of the measured window.
    #[arg(long, default_value_t = 10.0, value_parser = super::positive_seconds)]
    seconds: f64,
    /// Each stream starts a sentence this often (a sentence takes 3 packets, 600 ms to type,
    /// then 2 redundancy-only packets).
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(700..))]
    sentence_every_ms: u64,
    /// The gateway's --heartbeat-s (each connection pings the server this often).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    heartbeat_s: u64,
    /// Warm-up: streams opened (first sentence sent) per second.
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(1..))]
    open_per_s: u64,
    /// RED generations per packet (0: plain text/t140).
    #[arg(long, default_value_t = 2)]
    red: u8,
    /// Seconds the warm-up and the settle may take before the run reports what it has.
    #[arg(long, default_value_t = 60)]
    deadline_s: u64,
    /// Behave like the reference PVP server's router: echo every envelope but heartbeats to
    /// every open connection, so with N participants each one reaches the gateway N times.
    /// Keep N in the hundreds: the echo is N times the traffic for the server too.
    #[arg(long)]
    echo: bool,
    /// `wss://`: the server speaks TLS with a self-signed certificate the gateway trusts
    /// through `--ca-file`, as most deployments would (TLS state is per participant).
    #[arg(long)]
    tls: bool,
    #[command(flatten)]
    common: Common,
}

// ---------------------------------------------------------------------------------------------
// The in-process PVP server.

/// Envelope types counted one by one; anything else counts as `other`.
const KINDS: [&str; 5] = [
    "session.join",
    "context.add",
    "heartbeat.ping",
    "heartbeat.pong",
    "session.leave",
];

/// What the server has seen, shared by its connection tasks (atomics: no task waits on
/// another, except for the short push of an arrival).
#[derive(Default)]
struct Counts {
    accepted: AtomicU64,
    accept_errors: AtomicU64,
    handshake_failed: AtomicU64,
    open: AtomicI64,
    peak_open: AtomicI64,
    closed: AtomicU64,
    kinds: [AtomicU64; KINDS.len()],
    other: AtomicU64,
    unparsed: AtomicU64,
    pongs: AtomicU64,
    /// `--echo`: frames sent to connections as echoes, and echoes a connection fell too far
    /// behind to be sent.
    echoed: AtomicU64,
    echo_lagged: AtomicU64,
    /// Per connection: accept to handshake done, handshake to `session.join`, `session.join`
    /// to the first `context.add` (where the connection's first frames wait).
    opening: Mutex<Vec<[Duration; 3]>>,
    arrivals: Mutex<Arrivals>,
}

#[derive(Default)]
struct Arrivals {
    /// (stream, sentence, arrival) for every sentence found in a `context.add`.
    all: Vec<(u32, u32, Instant)>,
    /// The (stream, sentence) pairs among them: a sentence resent after a reconnect arrives
    /// twice, and must not stand in for one that never arrived.
    distinct: HashSet<(u32, u32)>,
}

impl Counts {
    fn kind(&self, k: &str) -> u64 {
        KINDS
            .iter()
            .position(|x| *x == k)
            .map_or(0, |i| self.kinds[i].load(Ordering::Relaxed))
    }

    /// Counts one text frame; returns its type (when counted one by one) and the pong to send
    /// for a ping.
    fn on_frame(&self, text: &str, at: Instant) -> (Option<&'static str>, Option<String>) {
        let Ok(env) = serde_json::from_str::<Envelope>(text) else {
            self.unparsed.fetch_add(1, Ordering::Relaxed);
            return (None, None);
        };
        let kind = KINDS.iter().position(|k| *k == env.kind);
        match kind {
            Some(i) => self.kinds[i].fetch_add(1, Ordering::Relaxed),
            None => self.other.fetch_add(1, Ordering::Relaxed),
        };
        let kind = kind.map(|i| KINDS[i]);
        match &*env.kind {
            "context.add" => {
                let content = env.payload.and_then(|p| p.content).unwrap_or_default();
                let found = sentences_in(&content);
                if !found.is_empty() {
                    let mut a = self.arrivals.lock().unwrap_or_else(|e| e.into_inner());
                    for (s, k) in found {
                        a.all.push((s, k, at));
                        a.distinct.insert((s, k));
                    }
                }
                (kind, None)
            }
            "heartbeat.ping" => (kind, Some(pong(&env.session, &env.id))),
            _ => (kind, None),
        }
    }

    /// Sentences numbered `k >= from` that have arrived (each once, however often it came).
    fn arrived_from(&self, from: u32) -> usize {
        let a = self.arrivals.lock().unwrap_or_else(|e| e.into_inner());
        a.distinct.iter().filter(|x| x.1 >= from).count()
    }
}

/// The fields the server looks at; borrowed from the frame where JSON escapes allow.
#[derive(serde::Deserialize)]
struct Envelope<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    #[serde(borrow, default)]
    id: Cow<'a, str>,
    #[serde(borrow, default)]
    session: Cow<'a, str>,
    #[serde(borrow, default)]
    payload: Option<Payload<'a>>,
}

#[derive(serde::Deserialize)]
struct Payload<'a> {
    #[serde(borrow, default)]
    content: Option<Cow<'a, str>>,
}

/// A `heartbeat.pong` answering ping `id` (pvp-spec 8.1; the gateway does not require it),
/// built as the gateway builds its own.
fn pong(session: &str, id: &str) -> String {
    pvp_t140::pvp::Builder::new(session.to_owned(), None, pvp_t140::clock::random_seed())
        .heartbeat(
            pvp_t140::Time::from_system(std::time::SystemTime::now()),
            "system".into(),
            Some(id),
        )
        .into_json()
}

/// Stream `i`'s sentence `k`, as the word groups typed one per packet. The closing `. ` makes
/// the gateway cut the chunk on the packet that carries it.
fn sentence_groups(i: u32, k: u32) -> VecDeque<String> {
    VecDeque::from([
        format!("Stream {i} "),
        format!("sentence {k} "),
        "ends here. ".to_owned(),
    ])
}

/// Every `Stream I sentence K` in a chunk's text (one, unless the gateway merged sentences).
fn sentences_in(content: &str) -> Vec<(u32, u32)> {
    let w: Vec<&str> = content.split_whitespace().collect();
    w.windows(4)
        .filter(|w| w[0].ends_with("Stream") && w[2] == "sentence")
        .filter_map(|w| Some((w[1].parse().ok()?, w[3].parse().ok()?)))
        .collect()
}

struct PvpServer {
    addr: SocketAddr,
    /// With `--tls`: the PEM file of the server's self-signed certificate.
    ca_file: Option<std::path::PathBuf>,
    counts: Arc<Counts>,
    rt: Option<tokio::runtime::Runtime>,
}

impl Drop for PvpServer {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
        if let Some(f) = &self.ca_file {
            let _ = std::fs::remove_file(f);
        }
    }
}

impl PvpServer {
    /// Binds 127.0.0.1:0 (backlog 4096: a ramp of connects must not overflow the accept
    /// queue, whose SYN retries would show as one-second latencies) and serves on a runtime
    /// of its own, its threads on CPUs 1.. with `pin`.
    fn start(pin: bool, echo: bool, tls: bool) -> Res<PvpServer> {
        let threads = cores().saturating_sub(1).max(1);
        let pin = pin && cores() >= 2;
        let next = AtomicUsize::new(0);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .thread_name("pvp-server")
            .on_thread_start(move || {
                if pin {
                    let k = next.fetch_add(1, Ordering::Relaxed);
                    pin_current_thread(1 + k % (cores() - 1));
                }
            })
            .enable_all()
            .build()
            .map_err(|e| format!("server runtime: {e}"))?;
        let listener = rt
            .block_on(async {
                let s = tokio::net::TcpSocket::new_v4()?;
                s.set_reuseaddr(true)?;
                s.bind(SocketAddr::from(([127, 0, 0, 1], 0)))?;
                s.listen(4096)
            })
            .map_err(|e| format!("server listen: {e}"))?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        let counts = Arc::new(Counts::default());
        let echo = echo.then(|| tokio::sync::broadcast::channel(ECHO_QUEUE).0);
        let (acceptor, ca_file) = if tls {
            let (a, f) = tls_acceptor()?;
            (Some(a), Some(f))
        } else {
            (None, None)
        };
        rt.spawn(accept_loop(listener, counts.clone(), echo, acceptor));
        Ok(PvpServer {
            addr,
            ca_file,
            counts,
            rt: Some(rt),
        })
    }
}

/// Echoes a connection may fall behind by before it misses some (counted).
const ECHO_QUEUE: usize = 1 << 16;

type Echo = tokio::sync::broadcast::Sender<Arc<str>>;

/// A self-signed certificate for `localhost`, its PEM written where the gateway's
/// `--ca-file` can read it.
fn tls_acceptor() -> Res<(tokio_rustls::TlsAcceptor, std::path::PathBuf)> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()])
        .map_err(|e| format!("certificate: {e}"))?;
    let key = rustls_pki_types::PrivateKeyDer::Pkcs8(cert.signing_key.serialize_der().into());
    let config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(vec![cert.cert.der().clone()], key)
        .map_err(|e| format!("TLS config: {e}"))?;
    let path = std::env::temp_dir().join(format!("loadtest-ws-ca-{}.pem", std::process::id()));
    std::fs::write(&path, cert.cert.pem()).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok((tokio_rustls::TlsAcceptor::from(Arc::new(config)), path))
}

async fn accept_loop(
    listener: tokio::net::TcpListener,
    c: Arc<Counts>,
    echo: Option<Echo>,
    tls: Option<tokio_rustls::TlsAcceptor>,
) {
    loop {
        match listener.accept().await {
            Ok((tcp, _)) => {
                c.accepted.fetch_add(1, Ordering::Relaxed);
                let _ = tcp.set_nodelay(true);
                let (c, echo) = (c.clone(), echo.clone());
                match &tls {
                    None => {
                        tokio::spawn(serve(tcp, c, echo, Instant::now()));
                    }
                    Some(acceptor) => {
                        let acceptor = acceptor.clone();
                        tokio::spawn(async move {
                            let accepted = Instant::now();
                            match acceptor.accept(tcp).await {
                                Ok(s) => serve(s, c, echo, accepted).await,
                                Err(_) => {
                                    c.handshake_failed.fetch_add(1, Ordering::Relaxed);
                                }
                            }
                        });
                    }
                }
            }
            Err(_) => {
                // EMFILE and the like: count, back off a little, go on.
                c.accept_errors.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

/// One participant's connection: handshake, then count frames until it closes.
async fn serve<S>(tcp: S, c: Arc<Counts>, echo: Option<Echo>, accepted: Instant)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    // tungstenite's default read buffer is 128 KiB, zero-filled before every read: 5,000
    // frames a second of that is CPU the instrument would spend for nothing.
    let config = WebSocketConfig::default().read_buffer_size(8 * 1024);
    let Ok(mut ws) = tokio_tungstenite::accept_async_with_config(tcp, Some(config)).await else {
        c.handshake_failed.fetch_add(1, Ordering::Relaxed);
        return;
    };
    let handshake = Instant::now();
    let open = c.open.fetch_add(1, Ordering::Relaxed) + 1;
    c.peak_open.fetch_max(open, Ordering::Relaxed);
    let mut join = None;
    let mut first_add = false;
    let mut echoes = echo.as_ref().map(Echo::subscribe);
    loop {
        let frame = tokio::select! {
            f = ws.next() => match f {
                Some(Ok(f)) => f,
                _ => break,
            },
            e = next_echo(&mut echoes) => {
                match e {
                    Ok(text) => {
                        if ws.send(Message::text(&*text)).await.is_err() {
                            break;
                        }
                        c.echoed.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                        c.echo_lagged.fetch_add(n, Ordering::Relaxed);
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => echoes = None,
                }
                continue;
            }
        };
        match frame {
            Message::Text(t) => {
                let at = Instant::now();
                let (kind, reply) = c.on_frame(t.as_str(), at);
                if let (Some(tx), Some(k)) = (&echo, kind)
                    && !k.starts_with("heartbeat.")
                {
                    // To every connection, this one included, as the reference router does.
                    let _ = tx.send(Arc::from(t.as_str()));
                }
                match (kind, join) {
                    (Some("session.join"), None) => join = Some(at),
                    (Some("context.add"), Some(j)) if !first_add => {
                        first_add = true;
                        c.opening.lock().unwrap_or_else(|e| e.into_inner()).push([
                            handshake - accepted,
                            j - handshake,
                            at - j,
                        ]);
                    }
                    _ => {}
                }
                if let Some(p) = reply {
                    if ws.send(Message::text(p)).await.is_err() {
                        break;
                    }
                    c.pongs.fetch_add(1, Ordering::Relaxed);
                }
            }
            Message::Close(_) => break,
            _ => {}
        }
    }
    let _ = ws.close(None).await;
    c.open.fetch_sub(1, Ordering::Relaxed);
    c.closed.fetch_add(1, Ordering::Relaxed);
}

/// The next echo for a connection; never, without `--echo`.
async fn next_echo(
    rx: &mut Option<tokio::sync::broadcast::Receiver<Arc<str>>>,
) -> Result<Arc<str>, tokio::sync::broadcast::error::RecvError> {
    match rx {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

// ---------------------------------------------------------------------------------------------
// The senders: real-time T.140, one `send::Sender` per stream.

struct Talker {
    sender: Sender,
    /// Word groups of the sentence being typed, and when the next one is typed.
    groups: VecDeque<String>,
    next_group: Instant,
    /// Number of the sentence being typed, and of the next one.
    k: u32,
    next_k: u32,
    next_sentence: Instant,
    /// The sentence whose last group is typed but not yet sent.
    completing: Option<u32>,
}

/// When each stream starts sentences in a phase: stream `i` at `start + spread * i / n`, then
/// every `every`, none at or after `until`.
struct Plan {
    start: Instant,
    spread: Duration,
    every: Duration,
    until: Instant,
}

/// What a phase sent.
#[derive(Default)]
struct Sent {
    /// (stream, sentence, when the datagram that completes it was sent).
    completions: Vec<(u32, u32, Instant)>,
    packets: u64,
    errors: u64,
    /// How late the sending thread got to a due packet, at worst.
    max_late: Duration,
    secs: f64,
    cpu: f64,
}

struct Streams {
    talkers: Vec<Talker>,
    socks: Vec<UdpSocket>,
    /// Real time of virtual time T0: senders run on real time, as `send` does.
    epoch: Instant,
}

impl Streams {
    fn new(to: SocketAddr, n: u32, sockets: u32, red: u8) -> Res<Streams> {
        let epoch = Instant::now();
        let talkers = (0..n)
            .map(|i| Talker {
                sender: Sender::new(sender_config(i, red), T0),
                groups: VecDeque::new(),
                next_group: epoch,
                k: 0,
                next_k: 0,
                next_sentence: epoch,
                completing: None,
            })
            .collect();
        Ok(Streams {
            talkers,
            socks: sockets_to(to, sockets.min(n))?,
            epoch,
        })
    }

    /// Runs `plan` on a thread of its own (on CPU 1 with `pin`) until every sentence is sent
    /// and every sender idle (RED's trailing packets included).
    fn run(&mut self, plan: &Plan, pin: bool) -> Res<Sent> {
        std::thread::scope(|s| {
            std::thread::Builder::new()
                .name("ws-sender".into())
                .spawn_scoped(s, || {
                    if pin && cores() >= 2 {
                        pin_current_thread(1);
                    }
                    self.drive(plan)
                })
                .map_err(|e| format!("sending thread: {e}"))?
                .join()
                .map_err(|_| "sending thread panicked".to_owned())
        })
    }

    fn drive(&mut self, plan: &Plan) -> Sent {
        let cpu0 = super::thread_cpu_seconds();
        let n = self.talkers.len() as u32;
        let mut out = Sent::default();
        let mut due: BinaryHeap<Reverse<(Instant, u32)>> = BinaryHeap::new();
        for (i, t) in self.talkers.iter_mut().enumerate() {
            t.next_sentence = plan.start + plan.spread.mul_f64(f64::from(i as u32) / f64::from(n));
            due.push(Reverse((t.next_sentence, i as u32)));
        }
        while let Some(&Reverse((at, i))) = due.peek() {
            let now = Instant::now();
            if at > now {
                std::thread::sleep(at - now);
                continue;
            }
            due.pop();
            out.max_late = out.max_late.max(now - at);
            if let Some(next) = self.step(i, now, plan, &mut out) {
                due.push(Reverse((next, i)));
            }
        }
        out.secs = plan.start.elapsed().as_secs_f64();
        out.cpu = super::thread_cpu_seconds() - cpu0;
        out
    }

    /// Stream `i` at `now`: starts a sentence or types its next group if due, sends what its
    /// sender has, and says when it next has something to do.
    fn step(&mut self, i: u32, now: Instant, plan: &Plan, out: &mut Sent) -> Option<Instant> {
        let vt = T0.saturating_add(now - self.epoch);
        let t = &mut self.talkers[i as usize];
        if t.groups.is_empty() && t.next_sentence <= now && t.next_sentence < plan.until {
            t.k = t.next_k;
            t.next_k += 1;
            t.groups = sentence_groups(i, t.k);
            t.next_group = t.next_sentence;
            t.next_sentence += plan.every;
        }
        if t.next_group <= now
            && let Some(g) = t.groups.pop_front()
        {
            t.sender.push_text(vt, &g);
            t.next_group += BUFFER_TIME;
            if t.groups.is_empty() {
                t.completing = Some(t.k);
            }
        }
        let sock = &self.socks[i as usize % self.socks.len()];
        while let Some(p) = t.sender.poll_packet(vt) {
            let sent_at = Instant::now();
            match sock.send(&p) {
                Ok(_) => out.packets += 1,
                Err(_) => out.errors += 1,
            }
            if let Some(k) = t.completing.take() {
                out.completions.push((i, k, sent_at));
            }
        }
        let mut next = if !t.groups.is_empty() {
            Some(t.next_group)
        } else if t.next_sentence < plan.until {
            Some(t.next_sentence)
        } else {
            None
        };
        if let Some(to) = t.sender.poll_timeout() {
            // Never the same instant again: a sender with nothing to send yet is asked later.
            let at = (self.epoch + to.saturating_sub(T0)).max(now + Duration::from_micros(100));
            next = Some(next.map_or(at, |n| n.min(at)));
        }
        next
    }
}

// ---------------------------------------------------------------------------------------------
// The run.

/// Nearest-rank percentile of sorted durations, in ms.
fn pct_ms(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((p / 100.0 * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i].as_secs_f64() * 1e3
}

/// Latencies from completing datagram to arrival, sorted, for the sentences in `sent`; also
/// how many of those sentences arrived more than once.
fn latencies(sent: &[(u32, u32, Instant)], c: &Counts) -> (Vec<Duration>, usize) {
    let when: HashMap<(u32, u32), Instant> = sent.iter().map(|&(i, k, t)| ((i, k), t)).collect();
    let a = c.arrivals.lock().unwrap_or_else(|e| e.into_inner());
    let mut seen: HashSet<(u32, u32)> = HashSet::with_capacity(sent.len());
    let (mut lat, mut dup) = (Vec::with_capacity(sent.len()), 0);
    for &(i, k, at) in &a.all {
        let Some(t) = when.get(&(i, k)) else { continue };
        if !seen.insert((i, k)) {
            dup += 1;
            continue;
        }
        lat.push(at.saturating_duration_since(*t));
    }
    lat.sort_unstable();
    (lat, dup)
}

/// Arrivals that match no sentence sent in any phase.
fn unmatched(phases: &[&[(u32, u32, Instant)]], c: &Counts) -> usize {
    let sent: HashSet<(u32, u32)> = phases
        .iter()
        .flat_map(|p| p.iter().map(|&(i, k, _)| (i, k)))
        .collect();
    let a = c.arrivals.lock().unwrap_or_else(|e| e.into_inner());
    a.all.iter().filter(|x| !sent.contains(&(x.0, x.1))).count()
}

/// Polls `done` every 20 ms until it is true or `limit` has passed; returns the seconds taken
/// and whether it came true.
fn wait_for(limit: Duration, mut done: impl FnMut() -> bool) -> (f64, bool) {
    let start = Instant::now();
    loop {
        if done() {
            return (start.elapsed().as_secs_f64(), true);
        }
        if start.elapsed() >= limit {
            return (start.elapsed().as_secs_f64(), false);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// CPU seconds of each thread name between two [`thread_cpu`] snapshots (threads that came in
/// between count from zero; threads that exited in between are left out, their CPU unread),
/// busiest first.
fn by_thread_name(
    a: &BTreeMap<u32, (String, f64)>,
    b: &BTreeMap<u32, (String, f64)>,
) -> Vec<(String, usize, f64)> {
    let mut m: BTreeMap<String, (usize, f64)> = BTreeMap::new();
    for (tid, (name, cpu)) in b {
        let d = cpu - a.get(tid).map_or(0.0, |x| x.1);
        let e = m.entry(name.clone()).or_default();
        e.0 += 1;
        e.1 += d.max(0.0);
    }
    let mut v: Vec<(String, usize, f64)> = m.into_iter().map(|(k, (n, c))| (k, n, c)).collect();
    v.sort_by(|x, y| y.2.total_cmp(&x.2));
    v
}

/// What a gateway thread of that name is (src/main.rs, src/udp.rs).
fn role(name: &str) -> &'static str {
    if name.starts_with("tokio-r") {
        // tokio names its workers tokio-rt-worker (tokio-runtime-worker before 1.45).
        "control runtime: sink, WebSocket tasks, metrics"
    } else if name.starts_with("tracing-append") {
        "log writer"
    } else if name.starts_with("pvp-rx-") {
        "UDP receive worker"
    } else if name == "pvp-spool" {
        "--spool journal writer"
    } else if name == "pvp-t140" {
        "main (block_on: signals)"
    } else {
        ""
    }
}

/// Opens the process's own file limit for the server's side of N connections, as the gateway
/// opens its own (`pvp_t140::fdlimit`).
fn raise_nofile(n: u64) -> String {
    match pvp_t140::fdlimit::raise(n, 0) {
        Ok(l) if l.now >= n => String::new(),
        Ok(l) => format!("open-file limit {} < {n} needed by this process", l.now),
        Err(e) => format!("open-file limit: {e}"),
    }
}

pub fn run(a: &WsArgs) -> Res<()> {
    let n = a.streams;
    let pin = a.common.pin && cores() >= 2;
    let mut notes = Vec::new();
    let fd_note = raise_nofile(u64::from(n) + u64::from(a.common.sockets) + 256);
    if !fd_note.is_empty() {
        notes.push(fd_note);
    }
    let server = PvpServer::start(pin, a.echo, a.tls)?;
    let c = server.counts.clone();
    println!(
        "ws: {n} streams (participants), one sentence each per {} ms, {} s window, RED {}, gateway --heartbeat-s {}; PVP server {}{}{} in this process; {}; nproc {}, load average {}",
        a.sentence_every_ms,
        a.seconds,
        a.red,
        a.heartbeat_s,
        server.addr,
        if a.tls { " (TLS)" } else { "" },
        if a.echo { " (echoing)" } else { "" },
        if super::receiver_pinned(a.common.pin) {
            "gateway pinned to CPU 0, server and sender to the other CPUs"
        } else if pin {
            "gateway unpinned (no taskset), server and sender off CPU 0"
        } else {
            "unpinned"
        },
        cores(),
        load_average()
    );
    let url = match &server.ca_file {
        Some(_) => format!("wss://localhost:{}", server.addr.port()),
        None => format!("ws://{}", server.addr),
    };
    let mut gw_args: Vec<String> = [
        "--server",
        &url,
        "--session",
        "load",
        "--heartbeat-s",
        &a.heartbeat_s.to_string(),
        "--max-streams",
        &(n + 1024).to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if let Some(ca) = &server.ca_file {
        gw_args.extend(["--ca-file".to_owned(), ca.display().to_string()]);
    }
    let child = Child::spawn(Target::Gateway, &a.common, &gw_args)?;
    let pid = child.pid;
    std::thread::sleep(Duration::from_millis(500));
    let (rss0, _) = memory_kib(pid);
    let mut streams = Streams::new(child.addr, n, a.common.sockets, a.red)?;
    let limit = Duration::from_secs(a.deadline_s);

    // Warm-up: sentence 0 from every stream; every participant joins and connects.
    let ramp = Duration::from_secs_f64(f64::from(n) / a.open_per_s as f64);
    let start = Instant::now();
    let warm = streams.run(
        &Plan {
            start,
            spread: ramp,
            every: Duration::from_secs(86_400),
            until: start + ramp + Duration::from_millis(1),
        },
        pin,
    )?;
    let (_, all_open) = wait_for(limit, || {
        c.open.load(Ordering::Relaxed) >= i64::from(n) && c.arrived_from(0) >= n as usize
    });
    let open_s = start.elapsed().as_secs_f64();
    let (warm_lat, _) = latencies(&warm.completions, &c);
    if !all_open {
        notes.push(format!(
            "warm-up: after {open_s:.1} s only {} connections open, {} of {} first sentences arrived",
            c.open.load(Ordering::Relaxed),
            warm_lat.len(),
            warm.completions.len()
        ));
    }
    // Let the first connections' late frames (and the metrics snapshot) settle.
    std::thread::sleep(Duration::from_millis(1200));
    let (rss1, _) = memory_kib(pid);

    // The measured window.
    let m0 = child.scrape()?;
    let t0 = thread_cpu(pid);
    let own0 = thread_cpu(std::process::id());
    let cpu0 = child.cpu();
    let start = Instant::now();
    let every = Duration::from_millis(a.sentence_every_ms);
    let win = streams.run(
        &Plan {
            start,
            spread: every,
            every,
            until: start + Duration::from_secs_f64(a.seconds),
        },
        pin,
    )?;
    let cpu = child.cpu() - cpu0;
    let t1 = thread_cpu(pid);
    let own1 = thread_cpu(std::process::id());
    let secs = win.secs;
    let sent = win.completions.len();
    let (settle_s, all_arrived) = wait_for(limit, || c.arrived_from(1) >= sent);
    let (lat, dup) = latencies(&win.completions, &c);
    let unmatched = unmatched(&[&warm.completions, &win.completions], &c);
    // After the settle: the gateway publishes its counters once a second.
    std::thread::sleep(Duration::from_millis(1100));
    let m1 = child.scrape()?;
    let (rss2, hwm) = memory_kib(pid);
    let per_participant = |rss: u64| (rss.saturating_sub(rss0)) as f64 * 1024.0 / f64::from(n);

    println!();
    println!(
        "| streams | window s | sentences sent | context.add received | all arrived | settle s | WS open at server | latency p50 ms | p99 ms | max ms | first sentence (join + connect) p50 / p99 / max ms | all connected after s |"
    );
    println!(
        "| ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    );
    println!(
        "| {n} | {secs:.1} | {sent} | {} | {} | {settle_s:.2} | {} | {:.1} | {:.1} | {:.1} | {:.0} / {:.0} / {:.0} | {open_s:.1} |",
        lat.len(),
        if all_arrived { "yes" } else { "NO" },
        c.open.load(Ordering::Relaxed),
        pct_ms(&lat, 50.0),
        pct_ms(&lat, 99.0),
        pct_ms(&lat, 100.0),
        pct_ms(&warm_lat, 50.0),
        pct_ms(&warm_lat, 99.0),
        pct_ms(&warm_lat, 100.0),
    );
    println!();
    let d = |k: &str| counter(&m1, k).saturating_sub(counter(&m0, k));
    let drops: Vec<String> = m1
        .iter()
        .filter(|(k, v)| k.starts_with("pvp_t140_drops_total") && **v > 0.0)
        .map(|(k, v)| format!("{}={v}", k.split('"').nth(1).unwrap_or(k)))
        .collect();
    println!(
        "| gateway CPU % of a core | RSS baseline MiB | RSS with {n} participants MiB | RSS after window MiB | peak RSS MiB | RSS/participant KiB | datagrams (window) | envelopes (window) | chunks sentence / idle (window) | connections (gateway) | failing | reconnects | sink queue | drops (since start) |"
    );
    println!(
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"
    );
    println!(
        "| {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {} | {} | {} / {} | {} | {} | {} | {} | {} |",
        100.0 * cpu / secs,
        rss0 as f64 / 1024.0,
        rss1 as f64 / 1024.0,
        rss2 as f64 / 1024.0,
        hwm as f64 / 1024.0,
        per_participant(rss1.max(rss2)) / 1024.0,
        d("pvp_t140_datagrams_total"),
        d("pvp_t140_envelopes_total"),
        d("pvp_t140_chunks_total{cause=\"sentence\"}"),
        d("pvp_t140_chunks_total{cause=\"idle\"}"),
        counter(&m1, "pvp_t140_connections"),
        counter(&m1, "pvp_t140_connections_failing"),
        counter(&m1, "pvp_t140_reconnects_total"),
        counter(&m1, "pvp_t140_sink_queue_depth"),
        if drops.is_empty() {
            "none".to_owned()
        } else {
            drops.join(", ")
        },
    );
    println!();
    println!("| gateway thread | threads | CPU s (window) | % of a core | role |");
    println!("| --- | ---: | ---: | ---: | --- |");
    for (name, count, s) in by_thread_name(&t0, &t1) {
        println!(
            "| {name} | {count} | {s:.3} | {:.1} | {} |",
            100.0 * s / secs,
            role(&name)
        );
    }
    println!();
    let own = by_thread_name(&own0, &own1);
    let own_of = |p: &str| -> f64 {
        own.iter()
            .filter(|x| x.0.starts_with(p))
            .map(|x| x.2)
            .sum::<f64>()
    };
    let send_lat = {
        let (s, k) = (
            m1.get("pvp_t140_send_latency_seconds_sum").copied(),
            m1.get("pvp_t140_send_latency_seconds_count").copied(),
        );
        match (s, k) {
            (Some(s), Some(k)) if k > 0.0 => format!("{:.3} ms", 1e3 * s / k),
            _ => "n/a".into(),
        }
    };
    println!(
        "server saw: {} connections accepted, {} open now (peak {}), {} handshake failures, {} accept errors; envelopes: session.join {}, context.add {}, heartbeat.ping {} (pongs sent {}), heartbeat.pong {}, session.leave {}, other {}, unparsed {}; arrivals matching no sent sentence {unmatched}, duplicates {dup}",
        c.accepted.load(Ordering::Relaxed),
        c.open.load(Ordering::Relaxed),
        c.peak_open.load(Ordering::Relaxed),
        c.handshake_failed.load(Ordering::Relaxed),
        c.accept_errors.load(Ordering::Relaxed),
        c.kind("session.join"),
        c.kind("context.add"),
        c.kind("heartbeat.ping"),
        c.pongs.load(Ordering::Relaxed),
        c.kind("heartbeat.pong"),
        c.kind("session.leave"),
        c.other.load(Ordering::Relaxed),
        c.unparsed.load(Ordering::Relaxed),
    );
    if a.echo {
        println!(
            "echo (reference-router style): {} frames echoed to the gateway's connections, {} missed by connections that fell behind",
            c.echoed.load(Ordering::Relaxed),
            c.echo_lagged.load(Ordering::Relaxed),
        );
    }
    let opening = {
        let o = c.opening.lock().unwrap_or_else(|e| e.into_inner());
        (0..3)
            .map(|j| {
                let mut v: Vec<Duration> = o.iter().map(|x| x[j]).collect();
                v.sort_unstable();
                format!(
                    "{:.1} / {:.1} / {:.1}",
                    pct_ms(&v, 50.0),
                    pct_ms(&v, 99.0),
                    pct_ms(&v, 100.0)
                )
            })
            .collect::<Vec<_>>()
    };
    println!(
        "connection opening at the server, p50 / p99 / max ms: accept to handshake done {}; handshake to session.join {}; session.join to first context.add {}",
        opening[0], opening[1], opening[2]
    );
    println!(
        "sender: warm-up {} packets over {:.1} s, window {} packets ({:.0}/s), {} send errors, worst lateness {:.1} ms, {:.1}% of a core; server threads {:.1}% of a core; gateway mean sink-to-socket latency {send_lat} (its histogram, since start)",
        warm.packets,
        warm.secs,
        win.packets,
        win.packets as f64 / secs,
        warm.errors + win.errors,
        win.max_late.max(warm.max_late).as_secs_f64() * 1e3,
        100.0 * win.cpu / secs,
        100.0 * own_of("pvp-server") / secs,
    );

    // Shutdown: SIGTERM, every participant should leave.
    let leaves0 = c.kind("session.leave");
    let warns = child.log_warnings.clone();
    let tail = child.log_tail.clone();
    let log_lines = child.log_lines.clone();
    let (exit, exit_ok, shutdown_s) = child.stop();
    if !exit_ok {
        notes.push(format!(
            "the gateway did not stop cleanly ({exit}): these figures are not to be trusted"
        ));
    }
    let (_, left) = wait_for(Duration::from_secs(5), || {
        c.kind("session.leave") >= leaves0 + u64::from(n) && c.open.load(Ordering::Relaxed) == 0
    });
    println!(
        "shutdown: {exit} in {shutdown_s:.2} s; session.leave received {} of {n}{}; connections still open {}; gateway log lines {}",
        c.kind("session.leave") - leaves0,
        if left { "" } else { " (not all)" },
        c.open.load(Ordering::Relaxed),
        log_lines.load(Ordering::Relaxed),
    );
    if let Some(l) = tail
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .rev()
        .find(|l| l.contains("stopped"))
    {
        notes.push(format!("gateway's last line: {l}"));
    }
    for w in warns.lock().unwrap_or_else(|e| e.into_inner()).iter() {
        notes.push(format!("gateway logged: {w}"));
    }
    for note in notes {
        println!("note: {note}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `context.add` as the gateway sends it for stream `i`'s sentence `k`.
    fn add(i: u32, k: u32) -> String {
        format!(
            r#"{{"v":1,"type":"context.add","id":"x","session":"load","payload":{{"content":"Stream {i} sentence {k} ends here."}}}}"#
        )
    }

    /// The settle counts distinct sentences: one that arrived twice (a resend after a
    /// reconnect) does not stand in for one that never arrived, so the settle runs to its
    /// deadline and the table says "all arrived NO" (review, session 32: it ended at once and
    /// said "yes").
    #[test]
    fn a_duplicate_arrival_does_not_stand_in_for_a_missing_sentence() {
        let c = Counts::default();
        let t = Instant::now();
        // Sentences (0, 1) and (1, 1) were sent; (0, 1) arrived twice, (1, 1) never.
        let sent = [(0u32, 1u32, t), (1, 1, t)];
        c.on_frame(&add(0, 1), t);
        c.on_frame(&add(0, 1), t);
        let (lat, dup) = latencies(&sent, &c);
        assert_eq!(
            (lat.len(), dup),
            (1, 1),
            "one distinct sentence arrived, once again"
        );
        assert_eq!(c.arrived_from(1), 1, "only (0, 1) has arrived");
        let (_, all_arrived) = wait_for(Duration::from_millis(60), || {
            c.arrived_from(1) >= sent.len()
        });
        assert!(
            !all_arrived,
            "every sentence reported arrived though (1, 1) never did"
        );
        c.on_frame(&add(1, 1), t);
        assert_eq!(c.arrived_from(1), 2);
    }
}
