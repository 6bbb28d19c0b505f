//! `pvp-t140`: the command line. Thin: parse flags, build the core, wire the shell, run.

#![forbid(unsafe_code)]

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use pvp_t140::clock::random_seed;
use pvp_t140::sink::{Sink, ws::WsConfig, ws::WsSink};
use pvp_t140::{
    Compat, Config, DropReason, Gateway, MixerMode, Stats, chunker::FlushCause, replay, udp,
};

/// T.140 real-time text over RTP (RFC 4103) in, PVP `context.add` transcripts out.
#[derive(Parser, Debug)]
#[command(
    name = "pvp-t140",
    version,
    about,
    override_usage = "pvp-t140 [OPTIONS]\n       pvp-t140 <COMMAND>",
    args_override_self = true
)]
struct Cli {
    #[command(subcommand)]
    cmd: Option<Cmd>,
    #[command(flatten)]
    run: RunArgs,
    /// Log format on stderr (filter with RUST_LOG, default "info").
    #[arg(long, value_enum, default_value_t = LogFormat::Text, global = true)]
    log_format: LogFormat,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Read text from stdin and send it as T.140 over RTP (RFC 4103), the way an STT pipeline
    /// or an RTT terminal does: buffered about 300 ms, BOM first, RED redundancy when asked.
    Send {
        /// Where to send (the gateway's --listen address; not port 0, which no datagram
        /// goes to).
        #[arg(long, default_value = "127.0.0.1:5004", value_parser = send_to)]
        to: SocketAddr,
        /// Redundant generations (RFC 2198 RED); 0 sends plain text/t140.
        #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u8).range(0..=8))]
        red: u8,
        /// Characters per second cap: the receiver's SDP `cps` (RFC 4103 section 6), 30 when
        /// it gave none; 0 sends as fast as text comes (a receiver known to take any rate).
        #[arg(long, default_value_t = pvp_t140::send::DEFAULT_CPS)]
        cps: u32,
        /// SSRC, decimal or hex as `0x1a2b3c4d` (the gateway writes SSRCs in hex; default:
        /// random, RFC 3550 8.1).
        #[arg(long, value_parser = send_ssrc)]
        ssrc: Option<u32>,
        /// RTP payload type of text/t140 (not 64-95: taken for RTCP, RFC 5761 section 4).
        #[arg(long, default_value_t = 98, value_parser = send_payload_type)]
        t140_pt: u8,
        /// RTP payload type of text/red (not 64-95: taken for RTCP, RFC 5761 section 4).
        #[arg(long, default_value_t = 100, value_parser = send_payload_type)]
        red_pt: u8,
        /// The speaker's name, sent as RTCP SDES NAME (RFC 3550 6.5.2): the gateway names
        /// the participant by it (default: by the CNAME, `pvp-t140-<ssrc>@<host>`). At most
        /// 255 bytes of UTF-8 with a visible character, no control characters nor
        /// bidirectional overrides.
        #[arg(long, value_parser = sdes_name)]
        name: Option<String>,
        /// Do not send an RTCP BYE at the end of input.
        #[arg(long)]
        no_bye: bool,
    },
    /// Replay a pcap/pcapng capture through the gateway, using the capture's timestamps as the
    /// clock, and print the envelopes as NDJSON.
    Replay {
        /// The capture file (pcap or pcapng; Ethernet, Linux SLL/SLL2, raw IP or BSD loopback).
        file: PathBuf,
        /// Only UDP datagrams to this destination port and the RTCP port after it, as a live
        /// gateway on it reads by default (the RTCP port not with `--rtcp false`, or `rtcp =
        /// false` in --config; default: all). No datagram goes to port 0: refused.
        #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
        port: Option<u16>,
        /// The live gateway's TOML file: its core settings and `[[stream]]` mapping rules
        /// apply, as live; the keys of live IO only (listen, server, metrics, ...) are ignored.
        /// Flags on the command line override it.
        #[arg(long)]
        config: Option<PathBuf>,
        /// The live gateway's `--rtcp`: with `false` its RTCP port (the one after --port's) was
        /// never read, nor is it here [default: --config's `rtcp`, else true].
        #[arg(long, action = clap::ArgAction::Set)]
        rtcp: Option<bool>,
        #[command(flatten)]
        core: CoreArgs,
    },
}

/// `send --ssrc`: decimal, or hex with `0x`, as the gateway writes SSRCs.
fn send_ssrc(s: &str) -> Result<u32, String> {
    let hex = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X"));
    match hex {
        Some(h) => u32::from_str_radix(h, 16),
        None => s.parse(),
    }
    .map_err(|_| "an SSRC is a 32-bit number, decimal or hex (0x1a2b3c4d)".into())
}

/// `send --to`: an address a datagram can go to. Port 0 was taken, and the sends failed with
/// EINVAL after the first few (review au, session 46).
fn send_to(s: &str) -> Result<SocketAddr, String> {
    let a = pvp_t140::config_file::socket_addr(s)?;
    if a.port() == 0 {
        return Err("port 0: no datagram goes to it; give the gateway's --listen port".into());
    }
    Ok(a)
}

/// `send --t140-pt/--red-pt`: an RTP payload type, 0-127, and not 64-95. The sender's RTCP
/// goes to the RTP port (RFC 5761), and the receiver tells the two apart by the second byte: a
/// marked packet of type 64-95 reads as RTCP (RFC 5761 section 4) and is lost.
fn send_payload_type(s: &str) -> Result<u8, String> {
    match s.parse::<u8>() {
        Ok(64..=95) => Err("payload types 64-95 cannot be told from RTCP on the same port (RFC 5761 section 4); use a dynamic type, 96-127".into()),
        Ok(pt @ 0..=127) => Ok(pt),
        _ => Err("an RTP payload type is 0-127".into()),
    }
}

/// `send --name`: an SDES item holds 255 octets (RFC 3550 6.5), and a receiver shows the name
/// as a participant's: a control character in it (a new line, an escape) or a bidirectional
/// override would be stripped or shown raw, so it is refused here rather than sent; so is one
/// that shows nothing (white space, zero width characters, Hangul fillers), a blank name.
fn sdes_name(s: &str) -> Result<String, String> {
    if s.chars().all(pvp_t140::gateway::shows_nothing) {
        Err("a name has at least one visible character".into())
    } else if s.len() > 255 {
        Err(format!(
            "a name is at most 255 bytes (RFC 3550 6.5), this one {}",
            s.len()
        ))
    } else if s.chars().any(pvp_t140::gateway::not_in_names) {
        Err("a name has no control characters, line separators nor bidirectional overrides".into())
    } else {
        Ok(s.to_owned())
    }
}

#[derive(Args, Debug)]
struct RunArgs {
    /// TOML file with any of these settings and `[[stream]]` mapping rules (see README);
    /// flags on the command line override it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// UDP address to receive RTP on (IPv4 or IPv6, e.g. 0.0.0.0:5004 or [::]:5004; not a
    /// multicast group, which is not joined: refused).
    #[arg(long, default_value = "127.0.0.1:5004", value_parser = pvp_t140::config_file::socket_addr)]
    listen: SocketAddr,
    /// PVP server WebSocket URL (ws://host:port). Without it, envelopes go to stdout as NDJSON.
    #[arg(long)]
    server: Option<String>,
    /// Also read RTCP on the port after --listen's (RTCP multiplexed on the RTP port is always
    /// read, RFC 5761). `--rtcp false` to leave that port alone.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    rtcp: bool,
    /// Receive workers: each has its own SO_REUSEPORT socket and thread (not pinned to a
    /// core); the kernel keeps each source on one worker, so per-stream order holds.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=256))]
    workers: u64,
    /// Receive buffer (SO_RCVBUF) requested for each RTP socket and the RTCP port's, in bytes: a
    /// burst waits there instead of being dropped by the kernel. The kernel caps the request at
    /// net.core.rmem_max (raise it with `sysctl -w net.core.rmem_max=BYTES`).
    #[arg(long, default_value_t = udp::RECV_BUFFER as u64, value_parser = clap::value_parser!(u64).range(1..=i32::MAX as u64))]
    recv_buffer: u64,
    /// Which of [`ASKED`] were given (on the command line or in the file), by their file keys.
    #[arg(skip)]
    asked: Vec<&'static str>,
    /// The settings checked only when used that came from the file, each with where it is
    /// written there (`gw.toml:2: spool`): their errors name it instead of a flag.
    #[arg(skip)]
    located: Vec<(&'static str, String)>,
    /// Journal every envelope for the PVP server in DIR before sending it, so one killed before
    /// it was delivered (text: before the server was seen to read it) is sent after a restart
    /// (requires --server).
    #[arg(long)]
    spool: Option<PathBuf>,
    /// Hold each transcript chunk for approval: a gate.request (action_type "context_change")
    /// goes out, and the context.add only once the gate passes (requires --server).
    /// `--gate-transcripts false` turns off a --config file's `gate_transcripts = true`.
    #[arg(long, num_args = 0..=1, default_value_t = false, default_missing_value = "true",
          action = clap::ArgAction::Set)]
    gate_transcripts: bool,
    /// Approvers a chunk needs: distinct members' gate.approve, one member's repeats counting
    /// once (the request's quorum is {type: "any", count}).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    gate_quorum: u32,
    /// The gate request's timeout_seconds; unanswered chunks are dropped 5 s after it.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    gate_timeout_s: u64,
    /// PEM file of CA certificates to trust for a wss:// server, besides the system's roots.
    #[arg(long)]
    ca_file: Option<PathBuf>,
    /// Serve Prometheus metrics on http://ADDR/metrics and readiness on /healthz.
    #[arg(long, value_parser = pvp_t140::config_file::socket_addr)]
    metrics: Option<SocketAddr>,
    /// Seconds between the heartbeat.ping each participant's connection sends.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    heartbeat_s: u64,
    /// Seconds a participant's connect to the PVP server (TCP, TLS and the WebSocket handshake)
    /// may take before it counts as failed and is retried.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    connect_timeout_s: u64,
    /// Seconds a frame may wait to be taken by the PVP server's connection before the server
    /// counts as no longer reading, and the participant reconnects (and sends it again).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    write_timeout_s: u64,
    /// Seconds with nothing from the PVP server (the connection sends a WebSocket ping each
    /// silent heartbeat interval) before the server counts as gone, and the participant
    /// reconnects. At least two heartbeat intervals.
    #[arg(long, default_value_t = 90, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    server_silence_s: u64,
    #[command(flatten)]
    core: CoreArgs,
}

#[derive(Args, Debug)]
struct CoreArgs {
    /// PVP session id the virtual participants join.
    #[arg(long, default_value = "default")]
    session: String,
    /// Role of every virtual participant (repeatable).
    #[arg(long = "role", value_enum, default_values_t = [Role::Navigator])]
    roles: Vec<Role>,
    /// RTP payload type of text/t140 [default: 98; 96 with --compat t140llm].
    #[arg(long, value_parser = clap::value_parser!(u8).range(0..=127))]
    t140_pt: Option<u8>,
    /// RTP payload type of text/red, RFC 2198 redundancy [default: 100; 98 with --compat t140llm].
    #[arg(long, value_parser = clap::value_parser!(u8).range(0..=127))]
    red_pt: Option<u8>,
    /// Accommodate a known non-conformant sender (see docs/t140llm.md).
    #[arg(long, value_enum, default_value_t = CompatArg::None)]
    compat: CompatArg,
    /// RFC 9071 RTP mixers: `auto` takes a packet's single CSRC as its speaker, `on` takes the
    /// first CSRC of any packet, `off` ignores CSRCs.
    #[arg(long, value_enum, default_value_t = MixerArg::Auto)]
    mixer: MixerArg,
    /// Flush a stream's text after this many milliseconds without new text.
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(1..=86_400_000))]
    idle_flush_ms: u64,
    /// Flush when a stream's buffer reaches this many characters.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    max_chunk_chars: u64,
    /// A stream silent this long is flushed and leaves the session.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    stream_timeout_s: u64,
    /// Streams at most. At the limit a new stream takes the place of the oldest that never
    /// carried text, else of one lingering after its BYE, else it is refused (counted).
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..))]
    max_streams: u64,
    /// How long a packet that arrived ahead of a gap waits for the gap to fill before the
    /// missing text is recovered from redundancy or marked lost (RFC 4103 5.4 suggests 1 s;
    /// up to 10000 ms for a path that reorders more).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(0..=10_000))]
    reorder_wait_ms: u64,
    /// Only accept datagrams from these networks (repeatable, e.g. 10.0.0.0/8, ::1/128).
    #[arg(long = "allow", value_parser = parse_net)]
    allow: Vec<ipnet::IpNet>,
    /// Packets per second one source address:port may send before its excess is dropped
    /// (counted as rate_limited); 0 turns the limit off.
    #[arg(long, default_value_t = 1000)]
    max_pps_per_source: u32,
    /// Manual stream mapping, from --config's `[[stream]]` rules.
    #[arg(skip)]
    mapping: pvp_t140::mapping::Mapping,
    /// Auth token sent in session.join (prefer the environment variable: it stays out of `ps`).
    /// Empty means none: the join then goes without one.
    #[arg(long, env = "PVP_TOKEN", hide_env_values = true)]
    token: Option<String>,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    Driver,
    Navigator,
    Adversary,
    Observer,
    Approver,
    Admin,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum CompatArg {
    None,
    T140llm,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum MixerArg {
    Auto,
    On,
    Off,
}

#[derive(ValueEnum, Clone, Copy, Debug)]
enum LogFormat {
    Text,
    Json,
}

/// The command-line flag of the setting `key` (a configuration file key): `--ca-file`.
fn flag(key: &str) -> String {
    format!("--{}", key.replace('_', "-"))
}

impl RunArgs {
    /// How an error names the setting `key`: where the file has it, else its flag.
    fn named(&self, key: &str) -> String {
        self.located
            .iter()
            .find(|(k, _)| *k == key)
            .map_or_else(|| flag(key), |(_, at)| at.clone())
    }

    /// An error that begins with the flag of `key`, beginning instead with where the file has
    /// it when it came from there.
    fn said(&self, key: &str, err: String) -> String {
        match err.strip_prefix(&flag(key)) {
            Some(rest) => format!("{}{rest}", self.named(key)),
            None => err,
        }
    }
}

impl CoreArgs {
    /// text/t140 and text/red payload types: as given, else the defaults (t140llm's with
    /// `--compat t140llm`).
    fn payload_types(&self) -> (u8, u8) {
        let t140llm = self.compat == CompatArg::T140llm;
        let t140_pt = self.t140_pt.unwrap_or(if t140llm { 96 } else { 98 });
        let red_pt = self.red_pt.unwrap_or(if t140llm { 98 } else { 100 });
        (t140_pt, red_pt)
    }

    fn config(&self) -> Result<Config, String> {
        let (t140_pt, red_pt) = self.payload_types();
        if t140_pt == red_pt {
            return Err(format!("--t140-pt and --red-pt are both {t140_pt}"));
        }
        // Checked here, after the configuration file's values are in, as clap checks the
        // command line's: the file's keys are the flags' (`t140_pt` for --t140-pt).
        for (flag, pt) in [("--t140-pt", t140_pt), ("--red-pt", red_pt)] {
            if pt > 127 {
                return Err(format!("{flag} {pt}: an RTP payload type is 0-127"));
            }
            if (64..=95).contains(&pt) {
                // RFC 5761 4: the port also takes RTCP, told apart by this byte; a marked
                // packet of payload type 64-95 reads as RTCP (types 192-223) and was lost.
                return Err(format!(
                    "{flag} {pt}: payload types 64-95 cannot be told from RTCP on the same port (RFC 5761 section 4); use a dynamic type, 96-127"
                ));
            }
        }
        if self.reorder_wait_ms > 10_000 {
            return Err(format!(
                "--reorder-wait-ms {}: at most 10000",
                self.reorder_wait_ms
            ));
        }
        if self.max_chunk_chars > 1_000_000 {
            return Err(format!(
                "--max-chunk-chars {}: at most 1000000",
                self.max_chunk_chars
            ));
        }
        if self.session.trim().is_empty() {
            return Err("--session must not be empty".into());
        }
        // An id is an opaque string (pvp-spec 5.1): " demo" joins another session than
        // "demo", which a stray space in a unit file or an environment file made unseen.
        if self.session.trim() != self.session {
            return Err(format!(
                "--session {:?}: white space before or after it names another session than {:?}",
                self.session,
                self.session.trim()
            ));
        }
        // pvp-spec 6.3: session.join's token is optional. An empty one (`--token ""`,
        // `PVP_TOKEN=` as an environment file writes an unset variable, `token = ""`) is no
        // credential: the join goes without the field, not with `"token":""`. Given on the
        // command line or in the environment it still overrides the file's, as any flag does.
        let token = self.token.clone().filter(|t| !t.trim().is_empty());
        if token.is_none() && self.token.is_some() {
            tracing::info!("the token is empty: session.join is sent without one");
        }
        Ok(Config {
            session: self.session.clone(),
            roles: self
                .roles
                .iter()
                .map(|r| {
                    r.to_possible_value()
                        .expect("no skipped variants")
                        .get_name()
                        .to_owned()
                })
                .collect(),
            t140_pt,
            red_pt,
            idle_flush: Duration::from_millis(self.idle_flush_ms),
            max_chunk_chars: self.max_chunk_chars as usize,
            stream_timeout: Duration::from_secs(self.stream_timeout_s),
            max_streams: self.max_streams as usize,
            token,
            id_seed: random_seed(),
            reorder_wait: Duration::from_millis(self.reorder_wait_ms),
            allow: self.allow.clone(),
            max_pps_per_source: self.max_pps_per_source,
            mapping: self.mapping.clone(),
            compat: if self.compat == CompatArg::T140llm {
                Compat::T140llm
            } else {
                Compat::None
            },
            mixer: match self.mixer {
                MixerArg::Auto => MixerMode::Auto,
                MixerArg::On => MixerMode::On,
                MixerArg::Off => MixerMode::Off,
            },
        })
    }
}

/// Fills every setting the command line (or environment) did not give from `--config`: the
/// live gateway's, or for `replay` the core's and the mapping rules, the keys of live IO
/// (listen, server, metrics, workers...) left out, so a capture replays with the file the
/// gateway ran with.
fn apply_file(
    cli: &mut Cli,
    m: &clap::ArgMatches,
    path: &std::path::Path,
    text: &str,
) -> Result<(), String> {
    use clap::parser::ValueSource;
    let (f, mapping, allow) = pvp_t140::config_file::parse(path, text)?;
    // Where the flags were given: replay's are its subcommand's (the global log format too).
    let (m, live) = match &cli.cmd {
        None => (m, true),
        Some(Cmd::Replay { .. }) => (m.subcommand_matches("replay").unwrap_or(m), false),
        Some(Cmd::Send { .. }) => return Ok(()),
    };
    let given = |id: &str| {
        matches!(
            m.value_source(id),
            Some(ValueSource::CommandLine | ValueSource::EnvVariable)
        )
    };
    // An error names the file, the key's line and the key (`path:line: key: ...`).
    let bad = |field: &str, msg: &str| format!("{}: {msg}", f.locate(field));
    let positive = |v: u64, field: &str| {
        if v == 0 {
            Err(bad(field, "must be at least 1"))
        } else {
            Ok(v)
        }
    };
    // Times have the bounds their flags have (a day): far larger ones overflowed the
    // deadlines made from them.
    let seconds = |v: u64, field: &str| {
        if v > 86_400 {
            Err(bad(field, "must be at most 86400"))
        } else {
            positive(v, field)
        }
    };
    let millis = |v: u64, field: &str| {
        if v > 86_400_000 {
            Err(bad(field, "must be at most 86400000"))
        } else {
            positive(v, field)
        }
    };
    let enum_value = |v: &str, field: &str, parse: &dyn Fn(&str) -> bool| {
        if parse(v) {
            Ok(())
        } else {
            Err(bad(field, &format!("unknown value {v:?}")))
        }
    };
    // First: the file's other errors are said in the log format it asks for.
    if let Some(v) = &f.log_format
        && !given("log_format")
    {
        enum_value(v, "log_format", &|s| LogFormat::from_str(s, true).is_ok())?;
        cli.log_format = LogFormat::from_str(v, true).expect("checked");
    }
    // A key given in the file and not on the command line sets its flag: as it is, wrapped in
    // `Some`, or through a check that names the key in its error.
    macro_rules! set {
        ($field:ident, $dst:expr) => {
            if let Some(v) = f.$field.clone()
                && !given(stringify!($field))
            {
                $dst = v;
            }
        };
        ($field:ident, $dst:expr, Some) => {
            if let Some(v) = f.$field.clone()
                && !given(stringify!($field))
            {
                $dst = Some(v);
            }
        };
        ($field:ident, $dst:expr, $check:ident) => {
            if let Some(v) = f.$field.clone()
                && !given(stringify!($field))
            {
                $dst = $check(v, stringify!($field))?;
            }
        };
    }
    if live {
        let run = &mut cli.run;
        set!(listen, run.listen);
        if let Some(v) = f.server.clone()
            && !given("server")
        {
            // Checked here as `--server` is later, so that its error names the file's line.
            server_url(&v).map_err(|e| bad("server", e.trim_start_matches("--server ")))?;
            run.server = Some(v);
        }
        set!(metrics, run.metrics, Some);
        set!(ca_file, run.ca_file, Some);
        set!(rtcp, run.rtcp);
        set!(heartbeat_s, run.heartbeat_s, seconds);
        set!(connect_timeout_s, run.connect_timeout_s, seconds);
        set!(write_timeout_s, run.write_timeout_s, seconds);
        set!(server_silence_s, run.server_silence_s, seconds);
        set!(workers, run.workers, positive);
        if run.workers > 256 {
            return Err(bad("workers", "must be at most 256"));
        }
        if let Some(v) = f.recv_buffer
            && !given("recv_buffer")
        {
            if v > i32::MAX as u64 {
                return Err(bad(
                    "recv_buffer",
                    &format!("must be at most {} bytes", i32::MAX),
                ));
            }
            run.recv_buffer = positive(v, "recv_buffer")?;
        }
        set!(spool, run.spool, Some);
        set!(gate_transcripts, run.gate_transcripts);
        if let Some(v) = f.gate_quorum
            && !given("gate_quorum")
        {
            let v = positive(v, "gate_quorum")?;
            run.gate_quorum = u32::try_from(v).map_err(|_| bad("gate_quorum", "too large"))?;
        }
        set!(gate_timeout_s, run.gate_timeout_s, seconds);
        let keys: toml::Table = toml::from_str(&f.source.1).unwrap_or_default();
        for key in ASKED {
            if keys.contains_key(key) && !run.asked.contains(&key) {
                run.asked.push(key);
            }
        }
        for key in ["spool", "ca_file", "gate_transcripts", "listen"] {
            if keys.contains_key(key) && !given(key) {
                run.located.push((key, f.locate(key)));
            }
        }
    }
    let core = match &mut cli.cmd {
        Some(Cmd::Replay { core, rtcp, .. }) => {
            // What the live gateway read decides what is replayed (README, "Replaying
            // captures"): its RTCP port only if it read it. The flag overrides the file.
            *rtcp = rtcp.or(f.rtcp);
            core
        }
        _ => &mut cli.run.core,
    };
    // The bounds `CoreArgs::config` checks of the flags, checked here first so that the error
    // names the file's line, not a flag the user never typed.
    let nonempty = |v: String, field: &str| {
        if v.trim().is_empty() {
            Err(bad(field, "must not be empty"))
        } else {
            Ok(v)
        }
    };
    let payload_type = |v: u8, field: &str| match v {
        128.. => Err(bad(field, &format!("{v}: an RTP payload type is 0-127"))),
        64..=95 => Err(bad(
            field,
            &format!(
                "{v}: payload types 64-95 cannot be told from RTCP on the same port (RFC 5761 section 4); use a dynamic type, 96-127"
            ),
        )),
        _ => Ok(Some(v)),
    };
    let at_most = |max: u64| {
        move |v: u64, field: &str| {
            if v > max {
                Err(bad(field, &format!("must be at most {max}")))
            } else {
                Ok(v)
            }
        }
    };
    let (reorder, chunk) = (at_most(10_000), at_most(1_000_000));
    set!(session, core.session, nonempty);
    set!(t140_pt, core.t140_pt, payload_type);
    set!(red_pt, core.red_pt, payload_type);
    set!(reorder_wait_ms, core.reorder_wait_ms, reorder);
    set!(idle_flush_ms, core.idle_flush_ms, millis);
    if let Some(v) = f.max_chunk_chars
        && !given("max_chunk_chars")
    {
        core.max_chunk_chars = chunk(positive(v, "max_chunk_chars")?, "max_chunk_chars")?;
    }
    set!(stream_timeout_s, core.stream_timeout_s, seconds);
    set!(max_streams, core.max_streams, positive);
    set!(max_pps_per_source, core.max_pps_per_source);
    set!(token, core.token, Some);
    if !allow.is_empty() && !given("allow") {
        core.allow = allow;
    }
    if let Some(roles) = &f.roles
        && !given("roles")
    {
        core.roles = roles
            .iter()
            .map(|r| Role::from_str(r.get_ref(), true).expect("checked by config_file"))
            .collect();
    }
    if let Some(v) = &f.compat
        && !given("compat")
    {
        enum_value(v, "compat", &|s| CompatArg::from_str(s, true).is_ok())?;
        core.compat = CompatArg::from_str(v, true).expect("checked");
    }
    if let Some(v) = &f.mixer
        && !given("mixer")
    {
        enum_value(v, "mixer", &|s| MixerArg::from_str(s, true).is_ok())?;
        core.mixer = MixerArg::from_str(v, true).expect("checked");
    }
    // The two payload types must differ: checked here when the file set either, so the error
    // names the key's line, not two flags the user never typed.
    let (t140_pt, red_pt) = core.payload_types();
    let from_file = |key: &str| !given(key);
    if t140_pt == red_pt {
        if f.red_pt.is_some() && from_file("red_pt") {
            return Err(bad(
                "red_pt",
                &format!("{red_pt} is also the text/t140 payload type (t140_pt); they must differ"),
            ));
        }
        if f.t140_pt.is_some() && from_file("t140_pt") {
            return Err(bad(
                "t140_pt",
                &format!("{t140_pt} is also the text/red payload type (red_pt); they must differ"),
            ));
        }
    }
    core.mapping = mapping;
    Ok(())
}

/// A network (`10.0.0.0/8`) or a single address (`192.0.2.7`, `::1`).
fn parse_net(s: &str) -> Result<ipnet::IpNet, String> {
    pvp_t140::config_file::parse_net(s)
        .ok_or_else(|| format!("not an address or CIDR network: {s}"))
}

/// Logs go to stderr through a writer thread: a slow reader of stderr (a pipe, journald under
/// pressure) must not stall a receive worker, which would overflow the UDP socket. Beyond the
/// writer's bound lines are dropped, and their count reported at exit. The writer thread
/// buffers and flushes whenever its queue runs empty: a burst of lines (10,000 streams joining)
/// costs a few writes, not one or two system calls a line. The guard flushes what is left when
/// it drops.
fn init_logs(format: LogFormat) -> tracing_appender::non_blocking::WorkerGuard {
    let (writer, guard) = tracing_appender::non_blocking::NonBlockingBuilder::default()
        .lossy(true)
        .finish(std::io::BufWriter::new(std::io::stderr()));
    DROPPED_LOG_LINES
        .set(writer.error_counter())
        .unwrap_or_else(|_| unreachable!("logging is set up once"));
    // A RUST_LOG that does not parse (`pvp_t140=warning`) gives the default, and is said: the
    // operator asked for something else.
    let (filter, not_understood) = match tracing_subscriber::EnvFilter::try_from_default_env() {
        Ok(filter) => (filter, None),
        Err(e) => (
            tracing_subscriber::EnvFilter::new("info"),
            std::env::var("RUST_LOG")
                .ok()
                .filter(|v| !v.trim().is_empty())
                .map(|v| (v, e)),
        ),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    // tungstenite traces each upgrade request whole (its `log` records reach this log): the
    // `--server` URL's query and its credentials' `Authorization` header, which the gateway's
    // own lines show as `***` (`sink::ShownUrl`). Left out at every level.
    let secrets = tracing_subscriber::filter::filter_fn(|m| {
        !(*m.level() == tracing::Level::TRACE && m.target() == "tungstenite::handshake::client")
    });
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    match format {
        LogFormat::Text => builder.finish().with(secrets).init(),
        LogFormat::Json => builder.json().finish().with(secrets).init(),
    }
    if let Some((value, e)) = not_understood {
        tracing::warn!("RUST_LOG {value:?} not understood ({e}): logging at the default, info");
    }
    guard
}

static DROPPED_LOG_LINES: std::sync::OnceLock<tracing_appender::non_blocking::ErrorCounter> =
    std::sync::OnceLock::new();

/// Log lines the writer had no room for (none unless stderr fell far behind).
fn dropped_log_lines() -> usize {
    DROPPED_LOG_LINES.get().map_or(0, |c| c.dropped_lines())
}

/// One descriptor a participant's connection ([`pvp_t140::fdlimit`]): raise the soft limit so
/// the participants of `--max-streams` streams (up to 33 a stream) can connect besides what
/// `workers` receive workers hold, and say so if the hard limit does not allow one a stream.
/// On stdout (`max_streams` 0: no connections) for what the workers hold alone.
fn raise_fd_limit(max_streams: u64, workers: u64) {
    match pvp_t140::fdlimit::raise(max_streams, workers) {
        Ok(l) => {
            if l.now > l.before {
                tracing::info!(from = l.before, to = l.now, "open-file limit raised");
            }
            if l.now < l.reserved {
                tracing::warn!(
                    limit = l.now,
                    workers,
                    "the open-file limit is too low for --workers: receive workers may fail to \
                     start (\"Too many open files\"). Raise the hard limit (`ulimit -Hn`, \
                     systemd `LimitNOFILE=`) or lower --workers"
                );
            } else if max_streams > 0 && l.participants() < max_streams {
                tracing::warn!(
                    limit = l.now,
                    max_streams,
                    "the open-file limit leaves room for about {} PVP connections, fewer than \
                     --max-streams: participants beyond that retry their connect and may drop \
                     transcripts. Raise the hard limit (`ulimit -Hn`, systemd `LimitNOFILE=`) \
                     or lower --max-streams",
                    l.participants()
                );
            }
        }
        // No limit to raise on this platform: nothing to say for the workers alone.
        Err(e) if max_streams == 0 && e.kind() == std::io::ErrorKind::Unsupported => {}
        Err(e) => tracing::warn!("open-file limit not raised: {e}"),
    }
}

fn main() -> ExitCode {
    use clap::{CommandFactory, FromArgMatches};
    let matches = match Cli::command().try_get_matches() {
        Ok(m) => m,
        Err(e) => return command_line_error(e),
    };
    if let Err(e) = refuse_live_flags_with_a_subcommand(&matches) {
        return command_line_error(e);
    }
    let mut cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => return command_line_error(e),
    };
    cli.run.asked = ASKED
        .into_iter()
        .filter(|id| {
            matches!(
                matches.value_source(id),
                Some(clap::parser::ValueSource::CommandLine)
            )
        })
        .collect();
    let config = match &cli.cmd {
        None => cli.run.config.clone(),
        Some(Cmd::Replay { config, .. }) => config.clone(),
        Some(Cmd::Send { .. }) => None,
    };
    // Read once: a file that is a pipe (a FIFO, `--config <(envsubst < gw.toml)`) has nothing
    // to give a second read, and a FIFO's second open waits for a writer that never comes.
    let file = config.map(|path| {
        let text = pvp_t140::config_file::read(&path);
        (path, text)
    });
    if let Some((path, text)) = &file
        && let Err(e) = text
            .clone()
            .and_then(|text| apply_file(&mut cli, &matches, path, &text))
    {
        // Before the logs are set up: said as the exit's last words are, in the format the
        // file asks for unless the command line says otherwise (the file may have been
        // refused before its `log_format` was read).
        let format = match matches.value_source("log_format") {
            Some(
                clap::parser::ValueSource::CommandLine | clap::parser::ValueSource::EnvVariable,
            ) => cli.log_format,
            _ => text
                .as_deref()
                .ok()
                .and_then(file_log_format)
                .unwrap_or(cli.log_format),
        };
        say_before_logs(last_word(format, "ERROR", &e) + "\n");
        return ExitCode::FAILURE;
    }
    let log_format = cli.log_format;
    let log_guard = init_logs(log_format);
    if matches!(log_format, LogFormat::Json) {
        std::panic::set_hook(Box::new(|info| {
            let thread = std::thread::current();
            let line = panic_words(thread.name(), info.payload(), info.location());
            let _ = writeln!(
                std::io::stderr(),
                "{}",
                last_word(LogFormat::Json, "ERROR", &line)
            );
        }));
    }
    let result = match cli.cmd {
        Some(Cmd::Replay {
            file,
            port,
            rtcp,
            core,
            ..
        }) => run_replay(&file, port, rtcp.unwrap_or(true), &core),
        Some(Cmd::Send {
            to,
            red,
            cps,
            ssrc,
            t140_pt,
            red_pt,
            name,
            no_bye,
        }) => {
            let seed = random_seed();
            let cfg = pvp_t140::send::SenderConfig {
                ssrc: ssrc.unwrap_or(seed as u32),
                t140_pt,
                red_pt,
                redundancy: red,
                cps: (cps > 0).then_some(cps),
                initial_seq: (seed >> 32) as u16,
                initial_ts: (seed >> 64) as u32,
                name,
                ..Default::default()
            };
            run_send(to, cfg, !no_bye)
        }
        None => run_live(&cli.run),
    };
    let code = match &result {
        Ok(()) => ExitCode::SUCCESS,
        Err(_) => ExitCode::FAILURE,
    };
    // Said once, after every log line, and not through the log (which a RUST_LOG filter may
    // silence): a `pvp-t140:` line, or in JSON mode a JSON line as the log's, since a collector
    // reads every line of stderr as JSON.
    let dropped = dropped_log_lines();
    let mut last_words = Vec::new();
    if dropped > 0 {
        let msg = format!("{dropped} log lines were dropped (stderr did not keep up)");
        last_words.push(last_word(log_format, "WARN", &msg));
    }
    if let Err(e) = &result {
        last_words.push(last_word(log_format, "ERROR", e));
    }
    finish_logs(log_guard, last_words);
    code
}

/// A command line clap refused (a value out of its range, a flag it does not know, a live flag
/// with a subcommand). In JSON mode it is one JSON line and exit status 1, as every other
/// start-up error (see the last words in `main`): a collector reads every line of stderr as
/// JSON. JSON mode is known only from the command line here (the config file is not read
/// yet). Otherwise it is clap's words and status 2, said here rather than by `Error::exit`,
/// whose write to stderr is not bounded ([`say_before_logs`]). `--help` and `--version` are
/// clap's, on stdout.
fn command_line_error(e: clap::Error) -> ExitCode {
    if !e.use_stderr() {
        e.exit();
    }
    if !json_logs_asked(std::env::args_os().skip(1)) {
        // In colour only on a terminal, as clap's `ColorChoice::Auto`.
        let rendered = e.render();
        say_before_logs(if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
            rendered.ansi().to_string()
        } else {
            rendered.to_string()
        });
        return ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2));
    }
    // clap's words without the usage and the `--help` hint: `error: ` is the level's.
    let rendered = e.render().to_string();
    let msg: Vec<&str> = rendered
        .split("\n\n")
        .map(str::trim_end)
        .filter(|p| !p.is_empty() && !p.starts_with("Usage:") && !p.starts_with("For more"))
        .collect();
    let msg = msg.join("\n");
    let msg = msg.strip_prefix("error: ").unwrap_or(&msg);
    say_before_logs(last_word(LogFormat::Json, "ERROR", msg) + "\n");
    ExitCode::FAILURE
}

/// Whether the raw arguments ask for `--log-format json` (or `--log-format=json`), the last
/// one given winning; read before clap has accepted them.
fn json_logs_asked(args: impl Iterator<Item = std::ffi::OsString>) -> bool {
    let mut json = false;
    let mut args = args.take_while(|a| a != "--");
    while let Some(a) = args.next() {
        if a == "--log-format" {
            json = args.next().is_some_and(|v| v == "json");
        } else if let Some(v) = a.to_str().and_then(|a| a.strip_prefix("--log-format=")) {
            json = v == "json";
        }
    }
    json
}

/// The live gateway's flags are not a subcommand's: those given before `replay` or `send` are
/// refused, all named at once as clap's `args_conflicts_with_subcommands` named them (one a
/// line), except `--log-format`, which is global (README: `pvp-t140 --log-format json replay
/// ...`), and which that setting refused too.
fn refuse_live_flags_with_a_subcommand(m: &clap::ArgMatches) -> Result<(), clap::Error> {
    use clap::CommandFactory;
    use clap::parser::ValueSource;
    let Some((name, _)) = m.subcommand() else {
        return Ok(());
    };
    let mut cmd = Cli::command();
    let given: Vec<String> = cmd
        .get_arguments()
        .filter(|a| {
            let id = a.get_id().as_str();
            id != "log_format" && m.value_source(id) == Some(ValueSource::CommandLine)
        })
        .map(|a| {
            a.get_long()
                .map_or_else(|| a.get_id().to_string(), |l| format!("--{l}"))
        })
        .collect();
    let msg = match given.as_slice() {
        [] => return Ok(()),
        [flag] => format!("the subcommand '{name}' cannot be used with '{flag}'"),
        flags => format!(
            "the subcommand '{name}' cannot be used with:\n  {}",
            flags.join("\n  ")
        ),
    };
    Err(cmd.error(clap::error::ErrorKind::ArgumentConflict, msg))
}

/// The `log_format` a config file's text asks for, read on its own (a file refused for another
/// key still says how its errors should be written).
fn file_log_format(text: &str) -> Option<LogFormat> {
    let table: toml::Table = toml::from_str(text).ok()?;
    LogFormat::from_str(table.get("log_format")?.as_str()?, true).ok()
}

/// A line said at exit, in the log's format (as tracing-subscriber's JSON lines are shaped).
fn last_word(format: LogFormat, level: &str, msg: &str) -> String {
    match format {
        LogFormat::Text => format!("pvp-t140: {msg}"),
        LogFormat::Json => serde_json::json!({
            "timestamp": pvp_t140::Time::from_system(std::time::SystemTime::now()).to_iso8601(),
            "level": level,
            "fields": { "message": msg },
            "target": "pvp_t140",
        })
        .to_string(),
    }
}

/// A panic said as the default hook says it (`thread 'name' panicked at file:line:col:
/// message`), for the JSON mode's hook: there the default's plain text lines would break a
/// collector reading every line of stderr as JSON, and a receive worker's panic is caught
/// and counted (`udp::join_workers`), the process going on. Written straight to stderr, not
/// through the log's writer thread, so it is said even when that thread is what is stuck.
fn panic_words(
    thread: Option<&str>,
    payload: &(dyn std::any::Any + Send),
    location: Option<&std::panic::Location<'_>>,
) -> String {
    let msg = payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("Box<dyn Any>");
    let at = location.map_or_else(String::new, |l| {
        format!(" at {}:{}:{}", l.file(), l.line(), l.column())
    });
    format!(
        "thread '{}' panicked{at}: {msg}",
        thread.unwrap_or("<unnamed>")
    )
}

/// How long the end of the process waits for stderr: the log writer's last lines, then the
/// final words. A stderr nobody reads (a stuck log collector) must not hold the process.
const STDERR_GRACE: Duration = Duration::from_secs(2);

/// Everything logged so far reaches stderr, then `last_words`, unless stderr is blocked: then
/// the process ends after [`STDERR_GRACE`] without them. The log writer's guard, dropped while
/// its queue is full, prints its complaint to stdout, which carries envelopes (pvp-spec 19.4):
/// every envelope is out by now, so stdout is pointed at /dev/null first (Linux).
fn finish_logs(guard: tracing_appender::non_blocking::WorkerGuard, last_words: Vec<String>) {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    if let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
        let _ = nix::unistd::dup2_stdout(&null);
    }
    within_stderr_grace(move || {
        drop(guard);
        for line in last_words {
            let _ = writeln!(std::io::stderr(), "{line}");
        }
    });
}

/// An error said before the logs are set up (the command line, the config file): written as
/// the exit's last words are, bounded by [`STDERR_GRACE`] (README, `--log-format`: a stderr
/// nobody reads holds the exit at most 2 s), and a write error ignored: a closed stderr does
/// not turn the exit status into a panic's.
fn say_before_logs(text: String) {
    within_stderr_grace(move || {
        let _ = std::io::stderr().write_all(text.as_bytes());
    });
}

/// Runs `write` (to stderr) on a thread of its own and waits for it at most [`STDERR_GRACE`].
/// Not joined: a thread blocked on stderr ends with the process.
fn within_stderr_grace(write: impl FnOnce() + Send + 'static) {
    let (done, finished) = std::sync::mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name("last-words".into())
        .spawn(move || {
            write();
            let _ = done.send(());
        });
    if spawned.is_ok() {
        let _ = finished.recv_timeout(STDERR_GRACE);
    }
}

fn run_replay(
    file: &std::path::Path,
    port: Option<u16>,
    rtcp: bool,
    core: &CoreArgs,
) -> Result<(), String> {
    let cfg = core.config()?;
    catch_file_size_signal();
    // A non-blocking stdout that is full for a moment is waited for, as the live writer waits.
    let mut out =
        std::io::BufWriter::with_capacity(64 << 10, pvp_t140::sink::stdout::replay_stdout());
    // An error of the capture names it; one of the output is stdout's, not the capture's.
    let summary = replay::run_reading(file, cfg, port, rtcp, &mut out).map_err(|e| match e {
        replay::ReplayError::Capture(e) => format!("{}: {e}", file.display()),
        replay::ReplayError::Output(e) => format!("writing envelopes to stdout: {e}"),
    })?;
    if summary.capture.cut_by_snaplen > 0 {
        // Skipped, not replayed as cut text: their text is lost to how the capture was taken.
        tracing::warn!(
            file = %file.display(),
            datagrams = summary.capture.cut_by_snaplen,
            "UDP datagrams cut short by the capture's snap length were skipped: capture with a larger one (tcpdump -s 0)"
        );
    }
    if summary.capture.udp_malformed > 0 {
        // Dropped by the receiving host's stack too: the live gateway never read them.
        tracing::warn!(
            file = %file.display(),
            datagrams = summary.capture.udp_malformed,
            "UDP datagrams that are not valid UDP over IP (a UDP or IP length past what the packet holds) were skipped, as the receiving host drops them"
        );
    }
    if summary.capture.no_interface > 0 {
        // A corrupt capture (Wireshark refuses it): what those records held is lost.
        tracing::warn!(
            file = %file.display(),
            records = summary.capture.no_interface,
            "packet records on an interface their pcapng section did not describe were skipped (a corrupt capture)"
        );
    }
    if let Some(link_type) = summary.capture.unsupported_link_type {
        // Skipped, all of them: a capture of such a link layer replays to nothing.
        tracing::warn!(
            file = %file.display(),
            frames = summary.capture.unsupported_link,
            link_type,
            "frames of a link type replay does not read were skipped: it reads Ethernet, Linux cooked SLL/SLL2, raw IP and BSD loopback"
        );
    }
    if summary.capture.cut_short {
        tracing::warn!(file = %file.display(), "the capture ends inside a record: replayed up to it");
    }
    if let Some(port) = port
        && summary.other_ports > 0
        && summary.other_ports == summary.capture.udp
    {
        // Not one datagram fed: a port mistyped, or the sender's given for the receiver's.
        tracing::warn!(
            file = %file.display(),
            datagrams = summary.other_ports,
            "--port {port} left out every UDP datagram of the capture (none went to it, nor to the RTCP port read after it): replayed nothing; without --port every datagram is replayed"
        );
    }
    tracing::info!(
        frames = summary.capture.frames,
        udp = summary.capture.udp,
        skipped = summary.capture.skipped,
        other_ports = summary.other_ports,
        "replay finished"
    );
    let c = &summary.capture;
    if c.fragments > 0 {
        // IP fragments of UDP datagrams (RFC 791, RFC 8200 4.5), reassembled as a socket would.
        tracing::info!(
            fragments = c.fragments,
            reassembled = c.reassembled,
            duplicate = c.fragments_duplicate,
            timed_out = c.reassembly_timeouts,
            evicted = c.reassembly_evicted,
            invalid = c.reassembly_invalid,
            unfinished = c.reassembly_unfinished,
            "IP fragments in the capture"
        );
    }
    log_stats(&summary.stats);
    Ok(())
}

/// SIGXFSZ caught for `replay`, as the live gateway catches it ([`Signals::install`]): a write
/// past the file-size limit (`ulimit -f`, systemd `LimitFSIZE=`) to a stdout redirected to a
/// file then fails with EFBIG, and the replay ends with that error and exit status 1, instead
/// of the signal's default action killing it (a core dump, and no word of why). Installed
/// through a runtime of its own, which the replay has not; the handler, once installed, stays
/// for the process's life.
fn catch_file_size_signal() {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    if let Ok(rt) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        let _entered = rt.enter();
        let _ = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::from_raw(
            nix::libc::SIGXFSZ,
        ));
    }
}

fn run_send(to: SocketAddr, cfg: pvp_t140::send::SenderConfig, bye: bool) -> Result<(), String> {
    // With --red 0 no text/red packet is written: --red-pt plays no part.
    if cfg.redundancy > 0 && cfg.t140_pt == cfg.red_pt {
        return Err(format!("--t140-pt and --red-pt are both {}", cfg.t140_pt));
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))?;
    let ssrc = cfg.ssrc;
    tracing::info!(%to, ssrc = format_args!("{ssrc:08x}"), red = cfg.redundancy, "sending stdin as T.140");
    // The signals are caught inside the runtime, before the first packet goes out.
    let sent = rt.block_on(async {
        let (input, hurry) = UntilInterrupt::stdin();
        udp::send_text_until(to, cfg, input, bye, hurry).await
    });
    // Not waited for: a read of stdin still blocks its thread after an interrupt, and would
    // hold the process until the terminal gave a line.
    rt.shutdown_background();
    let stats = sent.map_err(|e| match e {
        udp::SendError::Input(e) => format!("reading stdin: {e}"),
        udp::SendError::Socket(e) => format!("send to {to}: {e}"),
    })?;
    tracing::info!(
        packets = stats.packets,
        chars = stats.chars,
        bytes = stats.bytes,
        send_errors = stats.send_errors,
        unsent = stats.unsent,
        controls_left_out = stats.left_out,
        "sent"
    );
    Ok(())
}

fn run_live(args: &RunArgs) -> Result<(), String> {
    let cfg = args.core.config()?;
    // A socket bound to a multicast group's address receives nothing until it joins the group
    // (RFC 1112 7.2, on an interface of its choosing), which the gateway does not: it listened
    // and read nothing, without a word.
    if args.listen.ip().to_canonical().is_multicast() {
        return Err(format!(
            "{} {}: a multicast group, which the gateway does not join (it would read nothing): \
             listen on a unicast address of this host, or 0.0.0.0",
            args.named("listen"),
            args.listen
        ));
    }
    let workers = args.workers.max(1) as usize;
    // The receive workers run on threads of their own (`udp::spawn_worker`); this runtime
    // carries the rest: the sink, the RTCP reader, metrics and signals.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))?;
    let done = rt.block_on(async {
        let mut signals = Signals::install();
        // Before the sockets: `--workers N` binds N of them (and each worker's runtime holds
        // more), which a low soft limit refused at the bind, the raise not yet made.
        let streams = if args.server.is_some() {
            cfg.max_streams as u64
        } else {
            // No participant connections on stdout, but each receive worker holds descriptors
            // of its own: under a low soft limit many workers failed to start.
            0
        };
        raise_fd_limit(streams, workers as u64);
        let sockets = udp::bind_group(args.listen, workers, args.recv_buffer as usize)
            .map_err(|e| e.to_string())?;
        let local = sockets[0].local_addr().map_err(|e| e.to_string())?;
        let asked = |key: &str| args.asked.contains(&key);
        say_recv_buffer(&sockets[0], args.recv_buffer, asked("recv_buffer"));
        say_unused(args);
        say_server_silence(args);
        say_refusing_all(&args.core.mapping);
        // RTCP on the next port up (RFC 3550 11); rtcp-mux on the RTP port works regardless.
        let rtcp = match (args.rtcp, local.port()) {
            (false, _) => None,
            (true, port @ (0 | u16::MAX)) => {
                // No port after it: said as a taken one is, since a sender's RTCP to the port
                // after its RTP (RFC 3550 11) is then never read.
                tracing::warn!("RTCP port: none after {port}; only rtcp-mux RTCP is read");
                None
            }
            (true, port) => {
                let mut addr = local;
                addr.set_port(port + 1);
                match udp::bind_with_buffer(addr, false, args.recv_buffer as usize) {
                    Ok(s) => Some(s),
                    Err(e) => {
                        tracing::warn!(
                            "RTCP port {addr} not bound ({e}); only rtcp-mux RTCP is read"
                        );
                        None
                    }
                }
            }
        };
        let rtcp_addr = rtcp.as_ref().and_then(|s| s.local_addr().ok());
        let sink_metrics = pvp_t140::metrics::SinkMetrics::default();
        if args.gate_transcripts && args.server.is_none() {
            return Err(format!(
                "{} needs --server (approvals come from the PVP session)",
                args.named("gate_transcripts")
            ));
        }
        if args.spool.is_some() && args.server.is_none() {
            return Err(format!(
                "{} needs --server (stdout is written at once)",
                args.named("spool")
            ));
        }
        // The URL as connected to (scheme in lowercase, a query given its path): /healthz
        // checks the same server the connections use.
        let server = args.server.as_deref().map(server_url).transpose()?;
        let ws = match &server {
            Some(url) => {
                let (spool, resend) = match &args.spool {
                    Some(dir) => {
                        let (s, pending) = pvp_t140::sink::spool::Spool::open(
                            dir,
                            sink_metrics.spool_write_errors.clone(),
                        )
                        .map_err(|e| args.said("spool", e))?;
                        sink_metrics.spool_records_skipped.inc_by(s.skipped());
                        tracing::info!(journal = %s.path().display(), resend = pending.len(), skipped = s.skipped(), "spool open");
                        (Some(std::sync::Arc::new(s)), pending)
                    }
                    None => (None, Vec::new()),
                };
                if args.ca_file.is_some() && !url.starts_with("wss://") {
                    tracing::warn!(url = %pvp_t140::sink::ShownUrl(url), "--ca-file is for wss:// servers only; not used");
                }
                let mut ws = WsSink::new(WsConfig {
                    url: url.clone(),
                    session: cfg.session.clone(),
                    heartbeat: Duration::from_secs(args.heartbeat_s),
                    connect_timeout: Duration::from_secs(args.connect_timeout_s),
                    write_timeout: Duration::from_secs(args.write_timeout_s),
                    silence: Duration::from_secs(args.server_silence_s),
                    queue: 4096,
                    metrics: sink_metrics.clone(),
                    tls: if url.starts_with("wss://") {
                        Some(
                            pvp_t140::sink::tls::client_config(args.ca_file.as_deref())
                                .map_err(|e| args.said("ca_file", e))?,
                        )
                    } else {
                        None
                    },
                    spool,
                    gate: args.gate_transcripts.then_some(pvp_t140::sink::gate::GateConfig {
                        quorum: args.gate_quorum,
                        timeout: Duration::from_secs(args.gate_timeout_s),
                    }),
                });
                ws.resend(resend);
                Some(ws)
            }
            None => None,
        };
        let (mut tx, rx) = pvp_t140::handoff::queue(udp::SINK_QUEUE);
        tx.count_refusals(sink_metrics.sink_queue_refused.clone());
        let sink = Sink::start(rx, ws, sink_metrics.clone(), udp::SHUTDOWN_GRACE)
            .map_err(|e| format!("starting the sink: {e}"))?;
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let (rtcp_tx, _) = tokio::sync::broadcast::channel(udp::RTCP_FEED);
        // RTCP on the RTP port for another worker's streams (README, Scaling out).
        let mut shares = match workers {
            1 => Vec::new(),
            n => udp::RtcpShare::group(n),
        }
        .into_iter();
        let mut handles = Vec::new();
        let running = prometheus_client::metrics::gauge::Gauge::default();
        // The workers' counters for the metrics endpoint, which is served before any worker
        // starts: an address in use fails the start before a datagram is read, not after
        // the workers took some (dropped unflushed by the error's exit).
        let (publishers, snapshots): (Vec<_>, Vec<_>) = (0..sockets.len())
            .map(|_| tokio::sync::watch::channel(Stats::default()))
            .unzip();
        if let Some(addr) = args.metrics {
            let health = pvp_t140::metrics::Health {
                running: running.clone(),
                workers: sockets.len(),
                server: server.clone(),
                sink: sink_metrics.clone(),
            };
            let registry = pvp_t140::metrics::registry(snapshots, &running, &sink_metrics);
            let at = pvp_t140::metrics::serve(addr, registry, health)
                .await
                .map_err(|e| format!("metrics on {addr}: {e}"))?;
            tracing::info!(metrics = %at, "serving /metrics and /healthz");
        }
        // Said once nothing of the start can fail but a thread's spawn.
        tracing::info!(
            listen = %local,
            rtcp = %rtcp_addr.map_or("mux only".to_owned(), |a| a.to_string()),
            workers,
            session = %cfg.session,
            sink = %pvp_t140::sink::ShownUrl(args.server.as_deref().unwrap_or("stdout")),
            "pvp-t140 listening"
        );
        // One stream limit for the gateway, not one a worker, with a share each worker is
        // guaranteed (README, `--max-streams`; [`pvp_t140::budget`]).
        let budget = pvp_t140::budget::StreamBudget::new(cfg.max_streams, sockets.len());
        // What the RTCP port's reader refuses, counted by worker 0 (`udp::RtcpRefused`).
        let rtcp_refused = std::sync::Arc::new(udp::RtcpRefused::default());
        for ((i, socket), stats_tx) in sockets.into_iter().enumerate().zip(publishers) {
            let publish = args.metrics.is_some().then_some(stats_tx);
            let feed = rtcp.as_ref().map(|_| rtcp_tx.subscribe());
            let mut wcfg = cfg.clone();
            // Distinct ULID randomness per worker.
            wcfg.id_seed = cfg.id_seed.wrapping_add(i as u128 * 0x9e37_79b9_7f4a_7c15);
            let gw = Gateway::with_budget(wcfg, budget.clone());
            let links = udp::WorkerLinks {
                rtcp: feed,
                counts_rtcp: i == 0,
                rtcp_refused: (i == 0).then(|| rtcp_refused.clone()),
                out: tx.clone(),
                shutdown: stop_rx.clone(),
                publish,
                running: running.clone(),
                share: shares.next(),
            };
            handles.push(
                udp::spawn_worker(i, socket, gw, links)
                    .map_err(|e| format!("receive worker {i}: {e}"))?,
            );
        }
        drop(tx);
        let (rtcp_stop, rtcp_stopped) = tokio::sync::watch::channel(false);
        let rtcp_reader =
            rtcp.map(|sock| {
                let admission = pvp_t140::admission::Admission::new(
                    cfg.allow.clone(),
                    cfg.max_pps_per_source,
                );
                tokio::spawn(udp::run_rtcp_reader(
                    sock,
                    rtcp_tx,
                    rtcp_stopped,
                    admission,
                    rtcp_refused,
                ))
            });
        signals.wait().await;
        tracing::info!("shutting down: flushing streams");
        // The RTCP port first: what it holds goes into the workers' feed, which they read at
        // their stop after their own sockets.
        let _ = rtcp_stop.send(true);
        // What the kernel dropped for the RTCP port's socket, for the exit line (the workers
        // count their RTP sockets').
        let mut rtcp_kernel_drops = 0;
        if let Some(reader) = rtcp_reader
            && let Ok(Ok(n)) = tokio::time::timeout(Duration::from_secs(1), reader).await
        {
            rtcp_kernel_drops = n;
        }
        let _ = stop_tx.send(true);
        // Joined off the runtime's threads: the sink must go on taking the workers' last
        // envelopes meanwhile.
        let joined = tokio::task::spawn_blocking(move || udp::join_workers(handles))
            .await
            .map_err(|e| format!("joining the receive workers: {e}"))?;
        let (mut total, full) = (joined.stats, joined.sink_queue_full);
        total.kernel_drops += rtcp_kernel_drops;
        let sink_stats = sink.finish().await?;
        log_stats(&total);
        // Besides what the sink sent and dropped, the text that was received and refused: the
        // chunks of speakers the stream mapping refused (never handed to the sink), the
        // participants the PVP server refused and the gated chunks not approved.
        tracing::info!(
            sent = sink_stats.sent,
            dropped = sink_stats.dropped,
            sink_queue_full = full,
            mapping_refused_chunks = total.refused_chunks,
            participants_refused = sink_metrics.refused.get(),
            gated_chunks_refused = sink_metrics.gates_refused.get(),
            server_refused_items = sink_metrics.server_refused_items.get(),
            "stopped"
        );
        // Everything was still flushed and said; the status tells a supervisor a worker did
        // not end as a stop ends it, or that stdout failed (its reader gone, the file at its
        // size limit): what was received after that was not delivered.
        let stdout_failed = args.server.is_none() && sink_metrics.stdout_failed.get() > 0;
        match (joined.failed, stdout_failed) {
            (0, false) => Ok(()),
            (0, true) => Err(format!(
                "writing to stdout failed; {} envelopes were dropped",
                sink_stats.dropped
            )),
            (n, false) => Err(format!("{n} of {workers} receive workers failed")),
            (n, true) => Err(format!(
                "{n} of {workers} receive workers failed; writing to stdout failed, {} \
                 envelopes were dropped",
                sink_stats.dropped
            )),
        }
    });
    // Everything is delivered or counted by now (the spool's flush and the workers' join were
    // awaited). A blocking task still running is a connect's name lookup, which a hung
    // resolver holds for as long as it likes: dropping the runtime waited for it, past the
    // `stopped` line and a supervisor's stop timeout (review au, session 46).
    rt.shutdown_timeout(Duration::from_secs(1));
    done
}

/// Settings whose being given (not defaulted) matters once they are read: by their file keys,
/// which are their flags' ids (`recv_buffer` for `--recv-buffer`).
const ASKED: [&str; 8] = [
    "recv_buffer",
    "ca_file",
    "heartbeat_s",
    "connect_timeout_s",
    "write_timeout_s",
    "server_silence_s",
    "gate_quorum",
    "gate_timeout_s",
];

/// Says which settings given do nothing in the mode the gateway runs in: those of the PVP
/// server's connections without `--server`, the gate's without `--gate-transcripts` (one who
/// gave `--gate-quorum 2` meant gating, and gets none). `--spool` and `--gate-transcripts`
/// without `--server` are refused instead ([`run_live`]); `--ca-file` with a `ws://` server is
/// said there.
fn say_unused(args: &RunArgs) {
    let given = |keys: &[&str]| -> Vec<String> {
        keys.iter()
            .filter(|k| args.asked.contains(k))
            .map(|k| flag(k))
            .collect()
    };
    let gate = ["gate_quorum", "gate_timeout_s"];
    if args.server.is_none() {
        let mut keys = vec![
            "ca_file",
            "heartbeat_s",
            "connect_timeout_s",
            "write_timeout_s",
            "server_silence_s",
        ];
        keys.extend(gate);
        let unused = given(&keys);
        if !unused.is_empty() {
            tracing::warn!(
                "{} not used: they are for a PVP server (--server), and envelopes go to \
                 stdout",
                unused.join(", ")
            );
        }
    } else if !args.gate_transcripts {
        let unused = given(&gate);
        if !unused.is_empty() {
            tracing::warn!(
                "{} not used: settings of the transcript gate, and there is no \
                 --gate-transcripts (chunks are added ungated)",
                unused.join(", ")
            );
        }
    }
}

/// Says so when `unmatched = "refuse"` comes with no `[[stream]]` rule: every speaker is
/// refused, a gateway that says nothing (a rule lost in an edit, or a file of another host).
fn say_refusing_all(mapping: &pvp_t140::mapping::Mapping) {
    if mapping.unmatched == pvp_t140::mapping::Unmatched::Refuse && mapping.rules.is_empty() {
        tracing::warn!(
            "unmatched = \"refuse\" with no [[stream]] rule: every speaker is refused, nothing is sent"
        );
    }
}

/// Says so when a silent server is left later than `--server-silence-s`: the silence is
/// counted in whole heartbeat intervals, at least two, so that a ping always has an interval
/// to be answered in (`sink::ws::Liveness`). `--server-silence-s 10` with 30 s heartbeats is
/// 60 s.
fn say_server_silence(args: &RunArgs) {
    if args.server.is_none() {
        return;
    }
    let (silence, heartbeat) = (args.server_silence_s, args.heartbeat_s.max(1));
    let taken = silence.div_ceil(heartbeat).max(2).saturating_mul(heartbeat);
    if taken != silence {
        tracing::warn!(
            "--server-silence-s {silence} is counted in --heartbeat-s intervals ({heartbeat} s), \
             at least two: a silent server is left after {taken} s"
        );
    }
}

/// Says so when the kernel gave an RTP socket less receive buffer than `--recv-buffer` asked
/// for: it caps SO_RCVBUF at `net.core.rmem_max` without an error, and a burst beyond what it
/// gave is dropped by the kernel (counted as `kernel_drops` on Linux, nowhere else). A warning
/// when the size was asked for, a note on the default (208 KiB of a stock kernel's 8 MiB
/// asked).
fn say_recv_buffer(socket: &std::net::UdpSocket, asked: u64, explicit: bool) {
    let Ok(reported) = socket2::SockRef::from(socket).recv_buffer_size() else {
        return;
    };
    // Linux reports twice what it set, the other half for its own bookkeeping (socket(7)).
    let got = if cfg!(any(target_os = "linux", target_os = "android")) {
        reported / 2
    } else {
        reported
    } as u64;
    if got >= asked {
        return;
    }
    let msg = format!(
        "--recv-buffer {asked}: the kernel gave each RTP socket {got} bytes of receive buffer \
         (net.core.rmem_max caps it); a burst beyond that is dropped by the kernel \
         (kernel_drops). Raise the cap (`sysctl -w net.core.rmem_max={asked}`) or ask for less"
    );
    if explicit {
        tracing::warn!(asked, got, "{msg}");
    } else {
        tracing::info!(asked, got, "{msg}");
    }
}

/// `--server` as the WebSocket client is to be given it: a `ws://` or `wss://` URL, its scheme
/// in lowercase (RFC 3986 3.1: schemes are case-insensitive, and the client matches the
/// lowercase ones). Read as the client and /healthz read it
/// ([`pvp_t140::metrics::server_endpoint`]): one they cannot (no host, a port beyond 65535,
/// which the client takes as none) is refused here, not retried forever against the wrong port.
/// A query with no path before it (`ws://host:3000?x=1`) gets the path `/` (RFC 3986 6.2.3):
/// the client asks for the URL's path and query as they are, and `GET ?x=1` is no origin-form
/// request target (RFC 9112 3.2.1), which a server may refuse.
fn server_url(url: &str) -> Result<String, String> {
    let scheme = url.find("://").map_or("", |i| &url[..i]);
    let lower = match scheme.to_ascii_lowercase().as_str() {
        s @ ("ws" | "wss") => format!("{s}{}", &url[scheme.len()..]),
        _ => {
            return Err(format!(
                "--server must be a ws:// or wss:// URL, got {}",
                pvp_t140::sink::ShownUrl(url)
            ));
        }
    };
    let url = lower.as_str();
    pvp_t140::metrics::server_endpoint(url).map_err(|e| format!("--server {e}"))?;
    let uri: tokio_tungstenite::tungstenite::http::Uri = url
        .parse()
        .map_err(|e| format!("--server {}: {e}", pvp_t140::sink::ShownUrl(url)))?;
    let (Some(scheme), Some(authority)) = (uri.scheme_str(), uri.authority()) else {
        return Ok(url.to_owned());
    };
    let query = url
        .strip_prefix(scheme)
        .and_then(|r| r.strip_prefix("://"))
        .and_then(|r| r.strip_prefix(authority.as_str()))
        .filter(|r| r.starts_with('?'));
    Ok(match query {
        Some(q) => format!("{scheme}://{authority}/{q}"),
        None => url.to_owned(),
    })
}

/// SIGINT, SIGTERM and SIGHUP, caught from the moment [`Signals::install`] runs, which is
/// before the sockets are bound: a supervisor that stops the gateway as soon as it says it
/// listens gets a graceful shutdown, not the signal's default action (death, with nothing
/// flushed). SIGHUP (the terminal closed, an ssh session lost, `kill -HUP`) stops it as SIGTERM
/// does: text already accepted is not lost (README, "Trying it"). SIGHUP and SIGINT ignored at
/// start stay ignored ([`ignored_at_start`]): `nohup` starts a program so that a hangup does not
/// end it, and a shell without job control starts a background job (`pvp-t140 &` in a script)
/// with SIGINT ignored, so that a Ctrl-C for the foreground does not reach it (POSIX XCU 2.11).
/// SIGXFSZ is caught too, and never acted on: a write past the file-size limit fails (EFBIG).
struct Signals {
    #[cfg(unix)]
    int: Option<tokio::signal::unix::Signal>,
    #[cfg(unix)]
    term: Option<tokio::signal::unix::Signal>,
    #[cfg(unix)]
    hup: Option<tokio::signal::unix::Signal>,
}

/// Whether the disposition of signal `signo`, inherited at exec, is to ignore it (`nohup`,
/// `trap '' HUP`, a background job's SIGINT): catching it would undo that. Read from the
/// kernel's `SigIgn` mask (proc(5)), so without `unsafe`; elsewhere taken as not ignored.
#[cfg(unix)]
fn ignored_at_start(signo: u32) -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|s| ignores(&s, signo))
}

/// [`ignored_at_start`] from a `/proc/PID/status` text: bit N-1 of `SigIgn` is signal N.
#[cfg(unix)]
fn ignores(status: &str, signo: u32) -> bool {
    status
        .lines()
        .find_map(|l| l.strip_prefix("SigIgn:"))
        .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
        .is_some_and(|mask| (mask >> (signo - 1)) & 1 == 1)
}

/// SIGHUP's and SIGINT's numbers, the same on every Unix (POSIX XSI).
#[cfg(unix)]
const SIGHUP: u32 = 1;
#[cfg(unix)]
const SIGINT: u32 = 2;

/// SIGINT, SIGTERM and SIGHUP unblocked in this thread, the one that installs [`Signals`] and
/// waits in the runtime until the process ends: a signal mask is inherited across exec (POSIX
/// XSH `exec`), and a parent's thread that blocked them (to take signals on a thread of its
/// own) started a gateway whose handlers never ran. SIGTERM stopped nothing, and the
/// supervisor's SIGKILL lost what every stream held. The kernel gives a process a signal on
/// any of its threads that does not block it. Blocking is no choice to keep, as ignoring is
/// ([`ignored_at_start`]): an ignored SIGINT or SIGHUP stays ignored, unblocked or not.
fn unblock_stop_signals() {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    {
        use nix::sys::signal::{SigSet, Signal};
        let mut set = SigSet::empty();
        for s in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
            set.add(s);
        }
        if let Err(e) = set.thread_unblock() {
            tracing::warn!("unblocking SIGINT, SIGTERM and SIGHUP: {e}");
        }
    }
}

impl Signals {
    /// Inside the runtime.
    fn install() -> Self {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            let unless_ignored = |signo, kind| {
                (!ignored_at_start(signo))
                    .then(|| signal(kind).ok())
                    .flatten()
            };
            // SIGXFSZ: a write past the file-size limit (`ulimit -f`, systemd `LimitFSIZE=`)
            // to a stdout redirected to a file, or to the `--spool` journal, then fails with
            // EFBIG, a write error counted as any other, instead of the signal's default
            // action killing the process with all it held (a handler, once installed, stays
            // for the process's life).
            #[cfg(any(target_os = "linux", target_os = "android"))]
            let _ = signal(SignalKind::from_raw(nix::libc::SIGXFSZ));
            unblock_stop_signals();
            Signals {
                int: unless_ignored(SIGINT, SignalKind::interrupt()),
                term: signal(SignalKind::terminate()).ok(),
                hup: unless_ignored(SIGHUP, SignalKind::hangup()),
            }
        }
        #[cfg(not(unix))]
        Signals {}
    }

    /// The next of the signals (again and again: `send` stops at once at its second); true
    /// for a hangup (SIGHUP).
    async fn wait(&mut self) -> bool {
        #[cfg(unix)]
        {
            async fn next(s: &mut Option<tokio::signal::unix::Signal>) {
                match s {
                    Some(s) => {
                        s.recv().await;
                    }
                    None => std::future::pending().await,
                }
            }
            let Signals { int, term, hup } = self;
            tokio::select! {
                () = next(int) => false,
                () = next(term) => false,
                () = next(hup) => true,
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
            false
        }
    }
}

fn log_stats(s: &Stats) {
    let drops: Vec<String> = DropReason::ALL
        .iter()
        .filter(|r| s.drops(**r) > 0)
        .map(|r| format!("{}={}", r.as_str(), s.drops(*r)))
        .collect();
    let chunks: Vec<String> = FlushCause::ALL
        .iter()
        .map(|c| format!("{}={}", c.as_str(), s.chunks(*c)))
        .collect();
    tracing::info!(
        datagrams = s.datagrams,
        bytes = s.bytes,
        streams = s.streams_total,
        envelopes = s.envelopes,
        recovered = s.recovered,
        lost = s.lost,
        invalid_utf8 = s.decode.invalid_utf8,
        controls_dropped = s.decode.controls_dropped,
        // Reads the kernel failed, and RTCP the workers' feed lost: on /metrics too, but a
        // run without --metrics would otherwise never show them.
        socket_errors = s.socket_errors,
        // Datagrams the kernel dropped for the RTP sockets (Linux): read and these are what
        // reached the host.
        kernel_drops = s.kernel_drops,
        rtcp_feed_missed = s.rtcp_feed_missed,
        drops = %drops.join(","),
        chunks = %chunks.join(","),
        "counters"
    );
}

/// Standard input that ends at the first Ctrl-C (SIGINT), SIGTERM or SIGHUP, the gateway's
/// [`Signals`] (SIGINT and SIGHUP not when ignored at start: a background job, `nohup`): `send` then sends what it
/// read, the redundancy and its BYE, as at the end of input, instead of dying with the text in
/// its buffer and the receiver left to time the stream out (RFC 3550 6.3.7: a leaving
/// participant sends a BYE). A supervisor's stop or a closed terminal ends it as Ctrl-C does.
/// What stdin's reader had already read when the signal came is still the input's.
struct UntilInterrupt {
    input: tokio::io::Stdin,
    /// None once it fired: the input ends with what is already read.
    interrupt: Option<std::pin::Pin<Box<dyn std::future::Future<Output = ()>>>>,
    ended: bool,
    /// Set once stdin itself has ended (not a signal): a later signal is logged by the task
    /// that counts them, as no read is made to log it.
    input_ended: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl UntilInterrupt {
    /// Inside the runtime: the signals are caught from here on. With the future that a second
    /// Ctrl-C or SIGTERM completes ([`udp::send_text_until`]: the text not yet sent is given
    /// up, so that a user who asks twice is not kept waiting for `--cps` to pace out what was
    /// read). A hangup ends the input and never hurries it: one stop often comes as two
    /// signals of different kinds at once (systemd's `SendSIGHUP=yes` sends SIGHUP right after
    /// SIGTERM; a closed terminal's shell and the kernel each send a SIGHUP), and must not
    /// give up what was read (review, session 37).
    fn stdin() -> (Self, impl std::future::Future<Output = ()>) {
        // (signals, of them Ctrl-C or SIGTERM)
        let (count, signals_seen) = tokio::sync::watch::channel((0u32, 0u32));
        let mut signals = Signals::install();
        let ended = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let input_ended = ended.clone();
        tokio::spawn(async move {
            while !count.is_closed() {
                let hangup = signals.wait().await;
                count.send_modify(|(any, stops)| {
                    *any += 1;
                    *stops += u32::from(!hangup);
                });
                // The input had already ended: nothing reads it to say so, and a user whose
                // first Ctrl-C did nothing visible would not know a second one is heard. A
                // hangup never counts toward that: after one, the first Ctrl-C or SIGTERM is
                // still the one that asks for another.
                let (any, stops) = *count.borrow();
                let ended = input_ended.load(std::sync::atomic::Ordering::Relaxed);
                if ended && !hangup && stops == 1 {
                    tracing::info!(
                        "interrupted after the input ended: still sending what was read, then the BYE; interrupt again to give up the unsent text"
                    );
                } else if ended && any == 1 {
                    tracing::info!(
                        "hung up after the input ended: still sending what was read, then the BYE"
                    );
                }
            }
        });
        let when = |f: fn(&(u32, u32)) -> bool| {
            let mut seen = signals_seen.clone();
            async move {
                if seen.wait_for(f).await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
        };
        let input = UntilInterrupt {
            input: tokio::io::stdin(),
            interrupt: Some(Box::pin(when(|&(any, _)| any >= 1))),
            ended: false,
            input_ended: ended,
        };
        (input, when(|&(_, stops)| stops >= 2))
    }
}

impl tokio::io::AsyncRead for UntilInterrupt {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        use std::task::Poll;
        if self.ended {
            return Poll::Ready(Ok(()));
        }
        let fired = match self.interrupt.as_mut() {
            Some(interrupt) => interrupt.as_mut().poll(cx).is_ready(),
            None => true,
        };
        if !fired {
            let before = (buf.filled().len(), buf.remaining());
            let read = std::pin::Pin::new(&mut self.input).poll_read(cx, buf);
            if matches!(read, Poll::Ready(Ok(()))) && before.1 > 0 && buf.filled().len() == before.0
            {
                self.input_ended
                    .store(true, std::sync::atomic::Ordering::Relaxed);
            }
            return read;
        }
        if self.interrupt.take().is_some() {
            tracing::info!("interrupted: sending what was read, then the BYE");
        }
        // A read stdin's thread finished before the signal is the input's (it was typed
        // before the Ctrl-C): taken without waiting, then the input ends.
        let before = buf.filled().len();
        match std::pin::Pin::new(&mut self.input).poll_read(cx, buf) {
            Poll::Ready(Ok(())) if buf.filled().len() > before => {}
            _ => self.ended = true,
        }
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// In JSON mode a panic is one JSON line saying what the default hook says: the thread,
    /// where, and the message, whether `panic!` was given a literal or a formatted one.
    #[test]
    fn a_panic_in_json_mode_is_one_json_line_with_the_default_words() {
        let here = std::panic::Location::caller();
        let literal: Box<dyn std::any::Any + Send> = Box::new("a receive worker's bug");
        let words = panic_words(Some("recv-1"), literal.as_ref(), Some(here));
        assert_eq!(
            words,
            format!(
                "thread 'recv-1' panicked at {}:{}:{}: a receive worker's bug",
                here.file(),
                here.line(),
                here.column()
            )
        );
        let formatted: Box<dyn std::any::Any + Send> = Box::new(format!("index {} out", 3));
        assert_eq!(
            panic_words(None, formatted.as_ref(), None),
            "thread '<unnamed>' panicked: index 3 out"
        );
        let line = last_word(LogFormat::Json, "ERROR", &words);
        assert!(!line.contains('\n'));
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["level"], "ERROR");
        assert_eq!(v["fields"]["message"], words.as_str());
    }
}
