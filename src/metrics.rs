//! `--metrics ADDR`: Prometheus text exposition (prometheus-client) and `/healthz` (IO shell).
//!
//! The sans-IO cores keep plain counters; each receive worker publishes a snapshot once a second
//! over a watch channel, and a scrape sums the latest snapshots. Nothing on the packet path
//! touches a lock or an atomic for metrics. Sink-side metrics (queue depth, reconnects, send
//! latency) are prometheus-client atomics, updated where envelopes are sent.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::task::Poll;
use std::time::{Duration, Instant};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tokio::sync::watch;

use crate::chunker::FlushCause;
use crate::gateway::{DropReason, Stats};

/// Sink-side metrics, shared with the sink and its connections.
#[derive(Debug, Clone)]
pub struct SinkMetrics {
    /// Envelopes waiting between the receive workers and the sink.
    pub queue_depth: QueueDepth,
    /// WebSocket (re)connections made after a failure or a drop.
    pub reconnects: Counter,
    /// Open PVP connections.
    pub connections: Gauge,
    /// Participant connections currently failing to connect (in backoff).
    pub failing: Gauge,
    /// Seconds from an envelope entering the sink to its frame being written.
    pub send_latency: Histogram,
    /// Participants the server refused (UNAUTHORIZED, SESSION_NOT_FOUND).
    pub refused: Counter,
    /// Gated chunks rejected or timed out (`--gate-transcripts`).
    pub gates_refused: Counter,
    /// Transcript chunks held for approval, each asked once in a `gate.request` (pvp-spec
    /// 14.1; a request asked again after a reconnect is not counted again).
    pub gate_requests: Counter,
    /// Gated chunks approved and released to the server.
    pub gates_approved: Counter,
    /// `--spool` journal writes that failed (disk full, I/O error).
    pub spool_write_errors: Counter,
    /// `--spool` journal lines the start skipped: records cut short (a kill, a full disk),
    /// lines that are no record, envelopes that cannot be sent ([`crate::sink::spool::Spool::skipped`]).
    pub spool_records_skipped: Counter,
    /// Frames from the PVP server not acted on: unparseable (an `error` whose payload is not
    /// pvp-spec 17's too), binary, or of a protocol version other than 1 (pvp-spec 4.2).
    pub server_frames_rejected: Counter,
    /// Text envelopes the PVP server refused as RATE_LIMITED after they were written, sent
    /// again after the pause.
    pub rate_limited_resent: Counter,
    /// Text envelopes written into a connection that was then lost (left for silence, a
    /// failed write, a reset, a close) before a pong showed the server had read them: sent
    /// again after the rejoin.
    pub unread_resent: Counter,
    /// PARTICIPANT_NOT_FOUND errors (pvp-spec 17) that made a connection join the session
    /// again: the server had forgotten the participant.
    pub rejoined_not_found: Counter,
    /// Text envelopes (`context.*`) an `error` from the PVP server named as refused
    /// (pvp-spec 17) with a code that does not pause the participant (CONTEXT_TOO_LARGE,
    /// INVALID_MESSAGE, INVALID_STATE, INTERNAL_ERROR, ..., and UNAUTHORIZED or
    /// SESSION_NOT_FOUND, which also stop it, with the text written behind a join they
    /// refuse): not taken, and counted as dropped; and those
    /// refused as RATE_LIMITED that are no longer held to be sent again, or whose refusal came
    /// after the participant's leave (with `--spool`, the next start sends those); and the
    /// largest text unread when the server closed a connection as too big (1009).
    pub server_refused_items: Counter,
    /// PVP sessions the server ended (pvp-spec 6.5 `session.end`), each counted once whatever
    /// the number of its participants' connections that read it.
    pub sessions_ended: Counter,
    /// Envelopes for a session the server had ended: not sent (the server takes nothing more,
    /// pvp-spec 6.5), and counted as dropped.
    pub session_ended_items: Counter,
    /// Envelopes the receive workers could not hand to the sink: its queue was full (a PVP
    /// server or a stdout slower than the speakers), or the sink was gone.
    pub sink_queue_refused: Counter,
    /// Envelopes a PVP participant's own connection queue refused: full (a server down or
    /// slower than the participant speaks), or its connection ended (the server refused the
    /// participant: what it held then is given up too). Counted as dropped at the stop; shown
    /// here while it happens.
    pub participant_queue_refused: Counter,
    /// 1 once stdout has failed (its reader went away): every envelope is dropped from then on.
    pub stdout_failed: Gauge,
    /// Whether the stdout writer is in a write, and since when: `/healthz` tells a stdout
    /// nobody reads (or a full disk) from one that takes lines.
    pub stdout_busy: StdoutBusy,
    /// Participants joined, as the sink's [`crate::presence::Presence`] lets their joins out:
    /// one a participant id, however many speakers a mapping rule gives it.
    pub participants: Counter,
}

impl Default for SinkMetrics {
    fn default() -> Self {
        SinkMetrics {
            queue_depth: QueueDepth::default(),
            reconnects: Counter::default(),
            connections: Gauge::default(),
            failing: Gauge::default(),
            send_latency: Histogram::new(exponential_buckets(0.0001, 4.0, 10)),
            refused: Counter::default(),
            gates_refused: Counter::default(),
            gate_requests: Counter::default(),
            gates_approved: Counter::default(),
            spool_write_errors: Counter::default(),
            spool_records_skipped: Counter::default(),
            server_frames_rejected: Counter::default(),
            rate_limited_resent: Counter::default(),
            unread_resent: Counter::default(),
            rejoined_not_found: Counter::default(),
            server_refused_items: Counter::default(),
            sessions_ended: Counter::default(),
            session_ended_items: Counter::default(),
            sink_queue_refused: Counter::default(),
            participant_queue_refused: Counter::default(),
            stdout_failed: Gauge::default(),
            participants: Counter::default(),
            stdout_busy: StdoutBusy::default(),
        }
    }
}

/// [`SinkMetrics::stdout_busy`]: when the stdout writer entered the write it is still in, if it
/// is in one. A reader that stopped reading (a stuck pipeline) holds the writer in a write for
/// good, as a full disk under a redirected stdout does (the writer waits for room): lines
/// queue, then are refused, and `/healthz` says so once [`STDOUT_STALL`] has passed. Two
/// relaxed atomic stores a write of the writer's 64 KiB buffer, not a line.
#[derive(Debug, Clone, Default)]
pub struct StdoutBusy(Arc<AtomicU64>);

/// A write to stdout taking longer than this is a stdout that takes no lines (`/healthz`).
pub const STDOUT_STALL: Duration = Duration::from_secs(10);

/// The instants [`StdoutBusy`] stores are milliseconds from this one (from its first use).
fn busy_origin() -> Instant {
    static ORIGIN: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *ORIGIN.get_or_init(Instant::now)
}

impl StdoutBusy {
    /// The writer enters a write.
    pub fn enter(&self) {
        let since = Instant::now().saturating_duration_since(busy_origin());
        // 0 is "not in a write".
        let ms = u64::try_from(since.as_millis()).unwrap_or(u64::MAX - 1) + 1;
        self.0.store(ms, Ordering::Relaxed);
    }

    /// The write returned.
    pub fn leave(&self) {
        self.0.store(0, Ordering::Relaxed);
    }

    /// How long the writer has been in its write at `now`, if it is in one.
    pub fn stalled_for(&self, now: Instant) -> Option<Duration> {
        let ms = self.0.load(Ordering::Relaxed).checked_sub(1)?;
        let since = busy_origin() + Duration::from_millis(ms);
        Some(now.saturating_duration_since(since))
    }
}

/// [`SinkMetrics::queue_depth`]: the hand-off queue's own count
/// ([`crate::handoff::Receiver::queued`]), read when it is shown. A depth the sink set when it
/// took a batch went stale exactly when it mattered: a stdout writer stuck in a write takes
/// none while the queue fills behind it.
#[derive(Debug, Clone, Default)]
pub struct QueueDepth(Arc<std::sync::Mutex<Arc<AtomicUsize>>>);

impl QueueDepth {
    /// Shows the count of the queue a sink starts taking from.
    pub fn follow(&self, queued: Arc<AtomicUsize>) {
        *self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = queued;
    }

    /// Envelopes waiting now.
    pub fn get(&self) -> i64 {
        let queued = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        i64::try_from(queued.load(Ordering::Acquire)).unwrap_or(i64::MAX)
    }
}

impl EncodeMetric for QueueDepth {
    fn encode(&self, mut encoder: prometheus_client::encoding::MetricEncoder) -> std::fmt::Result {
        encoder.encode_gauge(&self.get())
    }

    fn metric_type(&self) -> prometheus_client::metrics::MetricType {
        prometheus_client::metrics::MetricType::Gauge
    }
}

/// Sums the workers' latest counters on every scrape.
#[derive(Debug)]
struct CoreCollector {
    workers: Vec<watch::Receiver<Stats>>,
}

fn counter(enc: &mut DescriptorEncoder, name: &str, help: &str, v: u64) -> std::fmt::Result {
    let c = ConstCounter::new(v);
    c.encode(enc.encode_descriptor(name, help, None, c.metric_type())?)
}

impl Collector for CoreCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> std::fmt::Result {
        let mut s = Stats::default();
        for w in &self.workers {
            s.merge(&w.borrow());
        }
        counter(
            &mut enc,
            "pvp_t140_datagrams",
            "UDP datagrams received.",
            s.datagrams,
        )?;
        counter(
            &mut enc,
            "pvp_t140_bytes",
            "UDP payload bytes received.",
            s.bytes,
        )?;
        counter(
            &mut enc,
            "pvp_t140_rtcp_packets",
            "RTCP compound packets read.",
            s.rtcp,
        )?;
        {
            let c = ConstCounter::new(0u64);
            let mut fam = enc.encode_descriptor(
                "pvp_t140_drops",
                "Datagrams dropped, by reason.",
                None,
                c.metric_type(),
            )?;
            for r in DropReason::ALL {
                ConstCounter::new(s.drops(r))
                    .encode(fam.encode_family(&[("reason", r.as_str())])?)?;
            }
        }
        counter(
            &mut enc,
            "pvp_t140_recovered_packets",
            "Lost packets recovered from RED.",
            s.recovered,
        )?;
        counter(
            &mut enc,
            "pvp_t140_lost_packets",
            "Lost packets beyond recovery (marked with U+FFFD where their speaker is known).",
            s.lost,
        )?;
        counter(
            &mut enc,
            "pvp_t140_marks_only_chunks",
            "Chunks of nothing but loss marks from participants yet to join: not sent.",
            s.marks_only_chunks,
        )?;
        counter(
            &mut enc,
            "pvp_t140_mapping_refused_chunks",
            "Transcript chunks of speakers no [[stream]] rule matches (unmatched = refuse): not sent.",
            s.refused_chunks,
        )?;
        counter(
            &mut enc,
            "pvp_t140_lost_unattributed_packets",
            "Lost packets no speaker could be named for (t140llm multiplexing), not marked.",
            s.lost_unattributed,
        )?;
        counter(
            &mut enc,
            "pvp_t140_reordered_packets",
            "Packets that waited for a gap.",
            s.reordered,
        )?;
        counter(
            &mut enc,
            "pvp_t140_streams",
            "RTP streams started.",
            s.streams_total,
        )?;
        counter(
            &mut enc,
            "pvp_t140_rtcp_feed_missed",
            "RTCP datagrams a receive worker's feeds lost (it fell behind the RTCP port's reader, or the RTCP other workers handed on): its streams missed them.",
            s.rtcp_feed_missed,
        )?;
        counter(
            &mut enc,
            "pvp_t140_socket_errors",
            "Errors the receive workers' sockets returned to reads (ECONNREFUSED from an ICMP port unreachable, ENOBUFS, ...): read past, with a pause while they persist.",
            s.socket_errors,
        )?;
        counter(
            &mut enc,
            "pvp_t140_kernel_drops",
            "Datagrams the kernel dropped for the receive workers' RTP sockets before they were read (a full receive buffer: --recv-buffer, net.core.rmem_max); Linux only, read once a second and at the stop.",
            s.kernel_drops,
        )?;
        counter(
            &mut enc,
            "pvp_t140_speakers_recycled",
            "Speakers that left to make room for a new voice on a stream at its bound of 32.",
            s.speakers_recycled,
        )?;
        {
            let g = ConstGauge::new(s.streams_live as i64);
            g.encode(enc.encode_descriptor(
                "pvp_t140_streams_live",
                "RTP streams live now.",
                None,
                g.metric_type(),
            )?)?;
        }
        {
            let c = ConstCounter::new(0u64);
            let mut fam = enc.encode_descriptor(
                "pvp_t140_chunks",
                "Transcript chunks sent, by flush cause.",
                None,
                c.metric_type(),
            )?;
            for cause in FlushCause::ALL {
                ConstCounter::new(s.chunks(cause))
                    .encode(fam.encode_family(&[("cause", cause.as_str())])?)?;
            }
        }
        counter(
            &mut enc,
            "pvp_t140_corrections",
            "Sent items corrected by backspace.",
            s.corrections,
        )?;
        counter(
            &mut enc,
            "pvp_t140_envelopes",
            "PVP envelopes produced.",
            s.envelopes,
        )?;
        counter(
            &mut enc,
            "pvp_t140_invalid_utf8",
            "Invalid UTF-8 sequences replaced.",
            s.decode.invalid_utf8,
        )?;
        counter(
            &mut enc,
            "pvp_t140_controls_dropped",
            "T.140 controls dropped.",
            s.decode.controls_dropped,
        )?;
        // The rest of the anomalies the core counts: each one is something a sender did that
        // the gateway forgave, and someone chasing a garbled transcript needs to see it.
        for (name, help, v) in [
            (
                "pvp_t140_streams_evicted",
                "Streams that never carried text, removed to make room at --max-streams.",
                s.evicted,
            ),
            (
                "pvp_t140_sequence_restarts",
                "Sequence restarts accepted (RFC 3550 A.1: a jump confirmed by the next packets).",
                s.restarts,
            ),
            (
                "pvp_t140_streams_head_lost",
                "Streams whose first packets were lost (no session start ever arrived).",
                s.head_lost,
            ),
            (
                "pvp_t140_idle_tail_packets",
                "Lost packets taken for the redundancy-only tail before an idle period (RFC 4103 5.2), not marked.",
                s.idle_tail,
            ),
            (
                "pvp_t140_red_newest_first_packets",
                "RED packets whose blocks came newest first (t140llm), put in age order.",
                s.red_newest_first,
            ),
            (
                "pvp_t140_red_block_pt_other_packets",
                "RED packets with a block whose payload type is not --t140-pt (RFC 4103 4.1), read as T.140 all the same.",
                s.red_block_pt_other,
            ),
            (
                "pvp_t140_metadata_packets",
                "t140llm metadata packets, kept out of the transcript.",
                s.metadata,
            ),
            (
                "pvp_t140_t140llm_objects",
                // No quotes: an OpenMetrics help text holds them only escaped (its ABNF's
                // escaped-string), and `\"` is an invalid escape in the 0.0.4 text made from it.
                "t140llm's text [object Object], for an LLM SDK chunk it cannot read, kept out of the transcript.",
                s.t140llm_objects,
            ),
            (
                "pvp_t140_red_unclamped_packets",
                "t140llm RED packets with a block over 255 bytes (length clamped), read by the packet it repeats.",
                s.red_unclamped,
            ),
            (
                "pvp_t140_erase_unmatched",
                "Backspaces reaching further back than the last item sent (not applied).",
                s.erase_unmatched,
            ),
            (
                "pvp_t140_backspace_unmatched",
                "Backspaces that found nothing to erase in the text not yet sent.",
                s.decode.backspace_unmatched,
            ),
            (
                "pvp_t140_escape_sequences_skipped",
                "T.140 escape sequences (ISO 6429 ESC, CSI and string controls) skipped.",
                s.decode.sequences_skipped,
            ),
            (
                "pvp_t140_boms",
                "Byte-order marks dropped (T.140 allows U+FEFF anywhere as a no-op).",
                s.decode.bom,
            ),
            (
                "pvp_t140_sdes_items_not_utf8",
                "RTCP SDES CNAME or NAME items that are not UTF-8 (RFC 3550 6.5): not taken for a name, but for one cut inside a character at 255 octets, read up to the cut.",
                s.sdes_not_utf8,
            ),
            (
                "pvp_t140_rtcp_early_names_forgotten",
                "RTCP SDES names of sources not yet seen on RTP forgotten, the oldest first, past the 256 kept for their streams' joins.",
                s.early_names_forgotten,
            ),
        ] {
            counter(&mut enc, name, help, v)?;
        }
        Ok(())
    }
}

/// What `/healthz` checks.
#[derive(Debug, Clone)]
pub struct Health {
    /// Receive workers running ([`crate::udp::WorkerLinks::running`]), of `workers` started:
    /// one that ended took its socket with it, and the streams it held.
    pub running: Gauge,
    pub workers: usize,
    /// The PVP server, when there is one: ready only while it accepts TCP connections and no
    /// participant connection is failing.
    pub server: Option<String>,
    pub sink: SinkMetrics,
}

/// Builds the registry over the workers' stat snapshots and the sink metrics.
pub fn registry(
    workers: Vec<watch::Receiver<Stats>>,
    running: &Gauge,
    sink: &SinkMetrics,
) -> Registry {
    let mut r = Registry::default();
    // `Registry::register` ends each help text with a full stop of its own.
    r.register_collector(Box::new(CoreCollector { workers }));
    r.register(
        "pvp_t140_receive_workers_running",
        "Receive workers running; fewer than --workers means one ended and its socket is not read",
        running.clone(),
    );
    r.register(
        "pvp_t140_sink_queue_depth",
        "Envelopes waiting for the sink",
        sink.queue_depth.clone(),
    );
    r.register(
        "pvp_t140_reconnects",
        "PVP WebSocket reconnections",
        sink.reconnects.clone(),
    );
    r.register(
        "pvp_t140_connections",
        "Open PVP WebSocket connections",
        sink.connections.clone(),
    );
    r.register(
        "pvp_t140_connections_failing",
        "PVP connections in reconnect backoff",
        sink.failing.clone(),
    );
    r.register(
        "pvp_t140_send_latency_seconds",
        "Sink entry to frame written",
        sink.send_latency.clone(),
    );
    for (name, help, counter) in [
        (
            "pvp_t140_participants",
            "Virtual participants joined (one a participant id, however many speakers share it)",
            &sink.participants,
        ),
        (
            "pvp_t140_participants_refused",
            "Participants the PVP server refused (UNAUTHORIZED, SESSION_NOT_FOUND)",
            &sink.refused,
        ),
        (
            "pvp_t140_gated_chunks_refused",
            "Gated transcript chunks rejected, timed out or dropped at shutdown",
            &sink.gates_refused,
        ),
        (
            "pvp_t140_gate_requests",
            "Transcript chunks held for approval (gate.request), each counted once",
            &sink.gate_requests,
        ),
        (
            "pvp_t140_gated_chunks_approved",
            "Gated transcript chunks approved and released",
            &sink.gates_approved,
        ),
        (
            "pvp_t140_spool_write_errors",
            "Spool journal writes that failed (disk full, I/O error)",
            &sink.spool_write_errors,
        ),
        (
            "pvp_t140_spool_records_skipped",
            "Spool journal lines a start skipped: cut short, no record, or not sendable",
            &sink.spool_records_skipped,
        ),
        (
            "pvp_t140_server_frames_rejected",
            "PVP server frames not acted on: unparseable, or of an unknown protocol version",
            &sink.server_frames_rejected,
        ),
        (
            "pvp_t140_rate_limited_resent",
            "Text envelopes the PVP server refused as RATE_LIMITED, sent again after the pause",
            &sink.rate_limited_resent,
        ),
        (
            "pvp_t140_unread_resent",
            "Text envelopes written into a PVP connection that was lost before the server was seen to read them, sent again after the rejoin",
            &sink.unread_resent,
        ),
        (
            "pvp_t140_rejoined_not_found",
            "PARTICIPANT_NOT_FOUND errors that made a participant join the PVP session again",
            &sink.rejoined_not_found,
        ),
        (
            "pvp_t140_sessions_ended",
            "PVP sessions the server ended (session.end)",
            &sink.sessions_ended,
        ),
        (
            "pvp_t140_session_ended_items",
            "Envelopes for a PVP session the server had ended, dropped unsent",
            &sink.session_ended_items,
        ),
        (
            "pvp_t140_server_refused_items",
            "Text envelopes a PVP server error refused (CONTEXT_TOO_LARGE, INVALID_MESSAGE, ..., RATE_LIMITED past resending)",
            &sink.server_refused_items,
        ),
        (
            "pvp_t140_sink_queue_refused",
            "Envelopes refused at the queue to the sink (full, or the sink gone)",
            &sink.sink_queue_refused,
        ),
        (
            "pvp_t140_participant_queue_refused",
            "Envelopes a PVP participant's connection queue refused (full), or lost with its connection (the server refused the participant)",
            &sink.participant_queue_refused,
        ),
    ] {
        r.register(name, help, counter.clone());
    }
    r.register(
        "pvp_t140_stdout_failed",
        "1 once stdout has failed (its reader went away): envelopes are dropped from then on",
        sink.stdout_failed.clone(),
    );
    r
}

/// Serves `/metrics` and `/healthz` on `addr` until the process ends.
pub async fn serve(
    addr: SocketAddr,
    registry: Registry,
    health: Health,
) -> std::io::Result<SocketAddr> {
    use axum::routing::get;
    let registry = Arc::new(registry);
    let app = axum::Router::new()
        .route(
            "/metrics",
            get(move |headers: axum::http::HeaderMap| {
                let registry = registry.clone();
                async move {
                    let mut body = String::new();
                    match prometheus_client::encoding::text::encode(&mut body, &registry) {
                        Ok(()) if wants_prometheus_text(&headers) => (
                            axum::http::StatusCode::OK,
                            [("content-type", "text/plain; version=0.0.4; charset=utf-8")],
                            prometheus_text(&body),
                        ),
                        Ok(()) => (
                            axum::http::StatusCode::OK,
                            [(
                                "content-type",
                                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                            )],
                            body,
                        ),
                        Err(_) => (
                            axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                            [("content-type", "text/plain")],
                            String::new(),
                        ),
                    }
                }
            }),
        )
        .route("/healthz", get(move || healthz(health.clone())))
        // The connection's deadline is off while its request is handled ([`Client`]).
        .layer(axum::middleware::map_request(
            |axum::extract::ConnectInfo(asked): axum::extract::ConnectInfo<Asked>,
             req: axum::extract::Request| async move {
                asked.0.store(true, Ordering::Relaxed);
                req
            },
        ));
    let listener = Clients {
        inner: tokio::net::TcpListener::bind(addr).await?,
        room: Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS)),
    };
    let local = listener.inner.local_addr()?;
    let app = app.into_make_service_with_connect_info::<Asked>();
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!("metrics server: {e}");
        }
    });
    Ok(local)
}

/// A scraper that asks for the Prometheus text format (`text/plain`) and not for OpenMetrics:
/// it gets [`prometheus_text`]. One that asks for OpenMetrics, for anything, or says nothing
/// gets OpenMetrics.
fn wants_prometheus_text(headers: &axum::http::HeaderMap) -> bool {
    let accept: String = headers
        .get_all(axum::http::header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect::<Vec<_>>()
        .join(",")
        .to_ascii_lowercase();
    accept.contains("text/plain") && !accept.contains("application/openmetrics-text")
}

/// The OpenMetrics exposition in the Prometheus text format 0.0.4: there a family's samples
/// carry its name, so a counter's HELP and TYPE name its `_total` samples (else a 0.0.4 parser
/// reads a counter without samples and an untyped `_total`), and there is no `# EOF`. The help
/// texts hold no backslash or quote, whose escapes differ between the two.
fn prometheus_text(openmetrics: &str) -> String {
    let counters: std::collections::HashSet<&str> = openmetrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE ")?.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(openmetrics.len() + 16 * counters.len());
    for line in openmetrics.lines() {
        if line == "# EOF" {
            continue;
        }
        let described = ["# HELP ", "# TYPE "].into_iter().find_map(|p| {
            let rest = line.strip_prefix(p)?;
            let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
            counters
                .contains(name)
                .then(|| format!("{p}{name}_total {tail}"))
        });
        match described {
            Some(l) => out.push_str(l.trim_end()),
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

/// Metrics clients served at once. Each holds a descriptor, and the open-file limit keeps
/// only [`crate::fdlimit::RESERVED`] besides the participants' connections: without a bound,
/// clients that connect and stall (or pile up idle) took every descriptor, and participants'
/// connects failed with "Too many open files". Beyond it, connections wait in the kernel's
/// accept queue, holding none of the gateway's. A scraper or two and a probe need a few.
pub const MAX_CONNECTIONS: usize = 16;

/// How long a metrics client may take to send its request, from its connect or the end of its
/// last response (and then how long an idle keep-alive connection is kept), or to take a
/// response it is sent: past it the connection is closed and its room
/// ([`MAX_CONNECTIONS`]) goes to the next. A header read timeout, which `axum::serve` has not
/// (hyper's needs a timer it is not given): a client sending half a request line (slowloris)
/// held its connection for good.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(10);

/// The metrics listener: a connection is accepted only with room for it ([`MAX_CONNECTIONS`]).
struct Clients {
    inner: tokio::net::TcpListener,
    room: Arc<tokio::sync::Semaphore>,
}

impl axum::serve::Listener for Clients {
    type Io = Client;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Client, SocketAddr) {
        let permit = self
            .room
            .clone()
            .acquire_owned()
            .await
            .expect("the semaphore is never closed");
        let (io, addr) = axum::serve::Listener::accept(&mut self.inner).await;
        let deadline = Box::pin(tokio::time::sleep(CLIENT_TIMEOUT));
        let client = Client {
            io,
            deadline,
            asked: Asked::default(),
            _room: permit,
        };
        (client, addr)
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.inner.local_addr()
    }
}

/// Set when a connection's request reaches its handler, cleared when its response starts: the
/// handler's time is not the client's (README "Metrics").
#[derive(Clone, Debug, Default)]
struct Asked(Arc<AtomicBool>);

impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, Clients>> for Asked {
    fn connect_info(stream: axum::serve::IncomingStream<'_, Clients>) -> Self {
        stream.io().asked.clone()
    }
}

/// A metrics client's connection: its room, given back when it closes, and its deadline
/// ([`CLIENT_TIMEOUT`]), put off by each write of a response. A read or write waiting past it
/// fails, which closes the connection, but not a read while the request is handled: hyper
/// reads then only to see an EOF, and `/healthz` may take a second (a hanging connect to the
/// PVP server), which a request sent near the deadline must still be answered after.
struct Client {
    io: tokio::net::TcpStream,
    deadline: std::pin::Pin<Box<tokio::time::Sleep>>,
    asked: Asked,
    _room: tokio::sync::OwnedSemaphorePermit,
}

impl Client {
    /// What a read or write that cannot go on yet returns: pending until the deadline, then
    /// an error.
    fn waiting<T>(&mut self, cx: &mut std::task::Context<'_>) -> Poll<std::io::Result<T>> {
        match self.deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(std::io::ErrorKind::TimedOut.into())),
            Poll::Pending => Poll::Pending,
        }
    }

    /// The deadline [`CLIENT_TIMEOUT`] from now.
    fn rearm(&mut self) {
        let next = tokio::time::Instant::now() + CLIENT_TIMEOUT;
        self.deadline.as_mut().reset(next);
    }

    /// A response went out: the client has [`CLIENT_TIMEOUT`] again. The deadline is polled
    /// so that it wakes the connection: hyper may not read again before it, the read it
    /// polled while the request was handled having waited on the socket alone.
    fn wrote(&mut self, cx: &mut std::task::Context<'_>, r: &Poll<std::io::Result<usize>>) {
        if matches!(r, Poll::Ready(Ok(1..))) {
            self.asked.0.store(false, Ordering::Relaxed);
            self.rearm();
            let _ = self.deadline.as_mut().poll(cx);
        }
    }

    /// A write that cannot go on yet: the first of a response has the whole
    /// [`CLIENT_TIMEOUT`] to be taken, counted from now.
    fn write_waiting<T>(&mut self, cx: &mut std::task::Context<'_>) -> Poll<std::io::Result<T>> {
        if self.asked.0.swap(false, Ordering::Relaxed) {
            self.rearm();
        }
        self.waiting(cx)
    }
}

impl tokio::io::AsyncRead for Client {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        match std::pin::Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Pending if this.asked.0.load(Ordering::Relaxed) => Poll::Pending,
            Poll::Pending => this.waiting(cx),
            done => done,
        }
    }
}

impl tokio::io::AsyncWrite for Client {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        match std::pin::Pin::new(&mut this.io).poll_write(cx, buf) {
            Poll::Pending => this.write_waiting(cx),
            done => {
                this.wrote(cx, &done);
                done
            }
        }
    }

    fn poll_write_vectored(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        match std::pin::Pin::new(&mut this.io).poll_write_vectored(cx, bufs) {
            Poll::Pending => this.write_waiting(cx),
            done => {
                this.wrote(cx, &done);
                done
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        match std::pin::Pin::new(&mut this.io).poll_flush(cx) {
            Poll::Pending => this.waiting(cx),
            done => done,
        }
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        match std::pin::Pin::new(&mut this.io).poll_shutdown(cx) {
            Poll::Pending => this.waiting(cx),
            done => done,
        }
    }
}

/// The host and port a `--server` URL's connections go to, found as the WebSocket client finds
/// them (tokio-tungstenite parses the URL as an `http::Uri`): the authority's host (an IPv6
/// literal keeps its brackets) and its port, 80 for `ws://` and 443 for `wss://` without one.
/// The authority ends at the path, the query or the fragment, whichever comes first
/// (`ws://host:3000?x=1` is host:3000). An error names the URL: no host, a port that is not
/// 0-65535 (which the client would take as no port, and connect to 80 or 443), port 0 (no
/// server listens there, RFC 6335 6: reserved; a connect to it is refused, and was retried
/// for good), or not a URL.
pub fn server_endpoint(url: &str) -> Result<(String, u16), String> {
    // `ws://` alone, or a path right after it: the URI type's own error ("empty string",
    // "invalid format") would not say what is missing.
    if url
        .split_once("://")
        .is_some_and(|(_, rest)| rest.is_empty() || rest.starts_with(['/', '?', '#']))
    {
        return Err(format!("{}: no host", crate::sink::ShownUrl(url)));
    }
    let uri: axum::http::Uri = url
        .parse()
        .map_err(|e| format!("{}: {e}", crate::sink::ShownUrl(url)))?;
    let (Some(authority), Some(host)) = (uri.authority(), uri.host()) else {
        return Err(format!("{}: no host", crate::sink::ShownUrl(url)));
    };
    if host.is_empty() {
        return Err(format!("{}: no host", crate::sink::ShownUrl(url)));
    }
    let port = match uri.port_u16() {
        Some(0) => {
            return Err(format!(
                "{}: port 0: no server listens there (a connect to it is refused)",
                crate::sink::ShownUrl(url)
            ));
        }
        Some(p) => p,
        // `host` or `host:` (an empty port is the default one, RFC 3986 3.2.3); anything else
        // after the host is a port the URI type could not read as a u16.
        None if !authority.as_str().trim_end_matches(':').ends_with(host) => {
            return Err(format!(
                "{}: the port is not 0-65535",
                crate::sink::ShownUrl(url)
            ));
        }
        // A scheme is case-insensitive (RFC 3986 3.1): `WS://host` is port 80 too.
        None => match uri.scheme_str().map(str::to_ascii_lowercase).as_deref() {
            Some("wss") => 443,
            Some("ws") => 80,
            _ => {
                return Err(format!(
                    "{}: not a ws:// or wss:// URL",
                    crate::sink::ShownUrl(url)
                ));
            }
        },
    };
    Ok((host.to_owned(), port))
}

/// `/healthz` with stdout the sink: not ready once it has failed (its reader went away), nor
/// while a write has not returned for [`STDOUT_STALL`] (its reader stopped reading, or the disk
/// under it is full: what comes queues, then is refused).
fn stdout_health(sink: &SinkMetrics, now: Instant) -> (axum::http::StatusCode, String) {
    use axum::http::StatusCode;
    if sink.stdout_failed.get() > 0 {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "stdout failed: envelopes are dropped\n".into(),
        );
    }
    if let Some(stall) = (sink.stdout_busy.stalled_for(now)).filter(|&t| t >= STDOUT_STALL) {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "stdout has taken nothing for {} s (its reader is not reading, or the disk is full): envelopes queue, then are refused\n",
                stall.as_secs()
            ),
        );
    }
    (StatusCode::OK, "ready: udp bound, sink stdout\n".into())
}

async fn healthz(h: Health) -> (axum::http::StatusCode, String) {
    use axum::http::StatusCode;
    let running = h.running.get();
    if running < h.workers as i64 {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "receive workers running: {running} of {}: a socket is not read\n",
                h.workers
            ),
        );
    }
    let Some(url) = h.server else {
        return stdout_health(&h.sink, Instant::now());
    };
    if h.sink.failing.get() > 0 {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("PVP connections failing: {}\n", h.sink.failing.get()),
        );
    }
    let (host, port) = match server_endpoint(&url) {
        Ok(hp) => hp,
        Err(e) => return (StatusCode::SERVICE_UNAVAILABLE, format!("PVP server {e}\n")),
    };
    let hostport = format!("{host}:{port}");
    // An IPv6 literal is connected to without its brackets (`ToSocketAddrs` of `(&str, u16)`
    // takes an address or a name).
    let ip_or_name = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(&host);
    match tokio::time::timeout(
        Duration::from_secs(1),
        tokio::net::TcpStream::connect((ip_or_name, port)),
    )
    .await
    {
        Ok(Ok(_)) => (
            StatusCode::OK,
            format!("ready: udp bound, PVP server {hostport} reachable\n"),
        ),
        Ok(Err(e)) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("PVP server {hostport}: {e}\n"),
        ),
        Err(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("PVP server {hostport}: connect timed out\n"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every help text ends in one full stop: `Registry::register` adds its own, and the texts
    /// given it ended in one as well, "..". A review found them (review, session 33).
    #[test]
    fn help_texts_end_in_one_full_stop() {
        let (_tx, rx) = watch::channel(Stats::default());
        let mut body = String::new();
        prometheus_client::encoding::text::encode(
            &mut body,
            &registry(vec![rx], &Gauge::default(), &SinkMetrics::default()),
        )
        .unwrap();
        let helps: Vec<&str> = body.lines().filter(|l| l.starts_with("# HELP")).collect();
        assert!(helps.len() > 30, "{body}");
        for l in helps {
            assert!(l.ends_with('.') && !l.ends_with(".."), "{l}");
        }
    }

    /// Every sink counter the README lists is in the exposition, under its documented name.
    #[test]
    fn the_sink_counters_are_exposed() {
        let sink = SinkMetrics::default();
        sink.refused.inc();
        sink.gates_refused.inc_by(2);
        sink.spool_write_errors.inc_by(3);
        sink.spool_records_skipped.inc_by(11);
        sink.server_frames_rejected.inc_by(4);
        sink.rate_limited_resent.inc_by(5);
        sink.unread_resent.inc_by(10);
        sink.rejoined_not_found.inc_by(6);
        sink.sink_queue_refused.inc_by(7);
        sink.server_refused_items.inc_by(8);
        sink.participant_queue_refused.inc_by(9);
        let mut body = String::new();
        let running = Gauge::default();
        running.set(2);
        prometheus_client::encoding::text::encode(
            &mut body,
            &registry(Vec::new(), &running, &sink),
        )
        .unwrap();
        for line in [
            "pvp_t140_participants_refused_total 1",
            "pvp_t140_gated_chunks_refused_total 2",
            "pvp_t140_spool_write_errors_total 3",
            "pvp_t140_spool_records_skipped_total 11",
            "pvp_t140_server_frames_rejected_total 4",
            "pvp_t140_rate_limited_resent_total 5",
            "pvp_t140_unread_resent_total 10",
            "pvp_t140_rejoined_not_found_total 6",
            "pvp_t140_sink_queue_refused_total 7",
            "pvp_t140_server_refused_items_total 8",
            "pvp_t140_participant_queue_refused_total 9",
            "pvp_t140_receive_workers_running 2",
        ] {
            assert!(body.lines().any(|l| l == line), "{line} not in\n{body}");
        }
    }

    /// A receive worker that ended (its thread returned or panicked) took its socket and its
    /// streams with it: not ready, with the reason, until every worker started runs.
    /// Every counter of the core's `Stats` is on /metrics: an anomaly counted but not shown
    /// is one nobody can see.
    #[test]
    fn every_core_counter_is_exposed() {
        let mut stats = Stats::default();
        let fields: [(&mut u64, &str); 15] = [
            (&mut stats.evicted, "pvp_t140_streams_evicted_total"),
            (&mut stats.restarts, "pvp_t140_sequence_restarts_total"),
            (&mut stats.head_lost, "pvp_t140_streams_head_lost_total"),
            (&mut stats.idle_tail, "pvp_t140_idle_tail_packets_total"),
            (
                &mut stats.red_newest_first,
                "pvp_t140_red_newest_first_packets_total",
            ),
            (
                &mut stats.red_block_pt_other,
                "pvp_t140_red_block_pt_other_packets_total",
            ),
            (&mut stats.metadata, "pvp_t140_metadata_packets_total"),
            (&mut stats.t140llm_objects, "pvp_t140_t140llm_objects_total"),
            (
                &mut stats.red_unclamped,
                "pvp_t140_red_unclamped_packets_total",
            ),
            (&mut stats.erase_unmatched, "pvp_t140_erase_unmatched_total"),
            (
                &mut stats.decode.backspace_unmatched,
                "pvp_t140_backspace_unmatched_total",
            ),
            (
                &mut stats.decode.sequences_skipped,
                "pvp_t140_escape_sequences_skipped_total",
            ),
            (&mut stats.decode.bom, "pvp_t140_boms_total"),
            (
                &mut stats.sdes_not_utf8,
                "pvp_t140_sdes_items_not_utf8_total",
            ),
            (
                &mut stats.early_names_forgotten,
                "pvp_t140_rtcp_early_names_forgotten_total",
            ),
        ];
        let mut want = Vec::new();
        for (i, (field, name)) in fields.into_iter().enumerate() {
            *field = 100 + i as u64;
            want.push(format!("{name} {}", 100 + i));
        }
        let (_tx, rx) = watch::channel(stats);
        let mut body = String::new();
        prometheus_client::encoding::text::encode(
            &mut body,
            &registry(vec![rx], &Gauge::default(), &SinkMetrics::default()),
        )
        .unwrap();
        for line in want {
            assert!(body.lines().any(|l| l == line), "{line} not in\n{body}");
        }
    }

    #[test]
    fn healthz_is_not_ready_while_a_receive_worker_is_down() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let running = Gauge::default();
        let health = Health {
            running: running.clone(),
            workers: 2,
            server: None,
            sink: SinkMetrics::default(),
        };
        running.set(1);
        let (status, body) = rt.block_on(healthz(health.clone()));
        assert_eq!(status.as_u16(), 503);
        assert_eq!(
            body,
            "receive workers running: 1 of 2: a socket is not read\n"
        );
        running.set(2);
        let (status, body) = rt.block_on(healthz(health));
        assert_eq!(
            (status.as_u16(), body.as_str()),
            (200, "ready: udp bound, sink stdout\n")
        );
    }

    /// `/healthz` with stdout the sink: ready while the writer's writes return; not once one
    /// has not returned for [`STDOUT_STALL`] (a stdout nobody reads: the queue fills and
    /// envelopes are refused; session 36's note: it said 200 then); ready again once it
    /// returns.
    #[test]
    fn healthz_is_not_ready_while_a_write_to_stdout_has_not_returned_for_the_stall() {
        let sink = SinkMetrics::default();
        let now = Instant::now();
        assert_eq!(stdout_health(&sink, now).0.as_u16(), 200, "not in a write");
        sink.stdout_busy.enter();
        let after = |d: Duration| stdout_health(&sink, Instant::now() + d);
        assert_eq!(after(Duration::ZERO).0.as_u16(), 200, "a write just begun");
        assert_eq!(
            after(STDOUT_STALL - Duration::from_secs(1)).0.as_u16(),
            200,
            "a write shorter than the stall"
        );
        let (status, body) = after(STDOUT_STALL + Duration::from_secs(2));
        assert_eq!(status.as_u16(), 503);
        assert!(body.starts_with("stdout has taken nothing for 1"), "{body}");
        sink.stdout_busy.leave();
        assert_eq!(
            after(STDOUT_STALL * 2).0.as_u16(),
            200,
            "the write returned"
        );
    }

    /// At most [`MAX_CONNECTIONS`] metrics clients are served at once, and one that sends half
    /// a request and stalls is closed after [`CLIENT_TIMEOUT`]: the next waiting is then
    /// served. A review found stalled clients held their descriptors for good (review, session
    /// 33; the end-to-end test is in tests/metrics.rs).
    #[tokio::test(start_paused = true)]
    async fn stalled_metrics_clients_are_bounded_and_closed_at_their_deadline() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let health = Health {
            running: Gauge::default(),
            workers: 0,
            server: None,
            sink: SinkMetrics::default(),
        };
        let addr = serve("127.0.0.1:0".parse().unwrap(), Registry::default(), health)
            .await
            .unwrap();
        let start = tokio::time::Instant::now();
        let mut stalled = Vec::new();
        for _ in 0..MAX_CONNECTIONS {
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            s.write_all(b"GET /metrics HTTP/1.1\r\n").await.unwrap();
            stalled.push(s);
        }
        // One more asks in full: it waits for room, which the stalled give up at their deadline.
        let mut asks = tokio::net::TcpStream::connect(addr).await.unwrap();
        asks.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let mut head = [0u8; 12];
        asks.read_exact(&mut head).await.unwrap();
        assert_eq!(&head, b"HTTP/1.1 200");
        assert!(start.elapsed() >= CLIENT_TIMEOUT, "{:?}", start.elapsed());
        for mut s in stalled {
            let r = s.read(&mut [0; 64]).await;
            assert!(
                !matches!(r, Ok(1..)),
                "a stalled client was answered: {r:?}"
            );
        }
    }

    /// A request sent within [`CLIENT_TIMEOUT`] of the connect is answered however long its
    /// handler takes (README "Metrics"), here `/healthz` waiting out a PVP server's hanging
    /// connect past that deadline, and the connection is closed once idle for
    /// [`CLIENT_TIMEOUT`] after the response (`read_to_end` returns). A review found the
    /// deadline also ran while the handler worked (hyper reads for an EOF meanwhile): the
    /// connection was closed without an answer (review, session 33).
    #[tokio::test(start_paused = true)]
    async fn a_request_sent_in_time_is_answered_however_long_its_handler_takes() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        // A PVP server whose connects hang: a backlog of 0, its accept queue already full, so
        // the kernel drops the SYNs of the next connects.
        let hole =
            socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        hole.bind(&"127.0.0.1:0".parse::<SocketAddr>().unwrap().into())
            .unwrap();
        hole.listen(0).unwrap();
        let hole_addr = hole.local_addr().unwrap().as_socket().unwrap();
        let _queued = std::net::TcpStream::connect(hole_addr).unwrap();
        let health = Health {
            running: Gauge::default(),
            workers: 0,
            server: Some(format!("ws://{hole_addr}")),
            sink: SinkMetrics::default(),
        };
        let addr = serve("127.0.0.1:0".parse().unwrap(), Registry::default(), health)
            .await
            .unwrap();
        let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
        // The request, half a second before the deadline counted from the connect.
        tokio::time::sleep(CLIENT_TIMEOUT - Duration::from_millis(500)).await;
        c.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let mut answer = Vec::new();
        let _ = c.read_to_end(&mut answer).await;
        let answer = String::from_utf8_lossy(&answer);
        assert!(
            answer.starts_with("HTTP/1.1 503"),
            "a request sent within the deadline got no answer: {answer:?}"
        );
    }

    /// The `--server` URL's host and port, wherever its authority ends; errors for what the
    /// WebSocket client would connect to wrongly or not at all.
    #[test]
    fn the_server_endpoint_is_the_urls_authority() {
        let ok = |url: &str, host: &str, port: u16| {
            assert_eq!(server_endpoint(url), Ok((host.to_owned(), port)), "{url}");
        };
        ok("ws://host:3000?x=1", "host", 3000);
        ok("wss://host?x=1", "host", 443);
        ok("ws://host?x=1", "host", 80);
        ok("ws://[::1]:3000?x", "[::1]", 3000);
        ok("wss://[::1]?x", "[::1]", 443);
        ok("ws://host:3000/path?x", "host", 3000);
        ok("ws://host:3000/path", "host", 3000);
        ok("ws://host#frag", "host", 80);
        ok("ws://host:/", "host", 80);
        ok("WS://host/pvp", "host", 80);
        ok("Wss://host", "host", 443);
        ok("ws://user:secret@host:3000/", "host", 3000);
        ok("ws://host", "host", 80);
        for bad in [
            "ws://host:99999/",
            "ws://:3000/",
            "ws://",
            "ws://host name/",
            "ws://host:3000:4000/",
            "http://host/",
        ] {
            let e = server_endpoint(bad).unwrap_err();
            assert!(e.starts_with(bad), "{bad}: {e}");
        }
    }

    /// /healthz connects to the `--server` URL's host and port, which end at its path, its
    /// query or its fragment, whichever comes first. They were taken to end at the first `/`
    /// only: `ws://127.0.0.1:3000?x=1` was "127.0.0.1:3000?x=1" (an invalid port: 503 for a
    /// server that answers), and `ws://host?x=1` looked up the host "host?x=1".
    #[test]
    fn healthz_finds_the_server_in_a_url_with_a_query_and_no_path() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let v4 = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let v6 = tokio::net::TcpListener::bind("[::1]:0").await.unwrap();
            let (p4, p6) = (
                v4.local_addr().unwrap().port(),
                v6.local_addr().unwrap().port(),
            );
            for (url, shown) in [
                (
                    format!("ws://127.0.0.1:{p4}?x=1"),
                    format!("127.0.0.1:{p4}"),
                ),
                (
                    format!("ws://127.0.0.1:{p4}/path?x"),
                    format!("127.0.0.1:{p4}"),
                ),
                (format!("ws://127.0.0.1:{p4}/"), format!("127.0.0.1:{p4}")),
                (
                    format!("ws://127.0.0.1:{p4}#top"),
                    format!("127.0.0.1:{p4}"),
                ),
                (
                    format!("ws://localhost:{p4}?x=1"),
                    format!("localhost:{p4}"),
                ),
                (format!("ws://[::1]:{p6}?x"), format!("[::1]:{p6}")),
                (format!("ws://[::1]:{p6}"), format!("[::1]:{p6}")),
            ] {
                let health = Health {
                    running: Gauge::default(),
                    workers: 0,
                    server: Some(url.clone()),
                    sink: SinkMetrics::default(),
                };
                let (status, body) = healthz(health).await;
                assert_eq!(
                    (status.as_u16(), body),
                    (
                        200,
                        format!("ready: udp bound, PVP server {shown} reachable\n")
                    ),
                    "{url}"
                );
            }
        });
    }
}
