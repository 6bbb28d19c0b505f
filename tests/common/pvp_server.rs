//! A real WebSocket PVP server for integration tests.
//!
//! It accepts WebSocket connections on 127.0.0.1, checks every frame it receives against the PVP
//! specification (`../shared/specs/pvp-spec.md` sections 4, 6.3, 6.4, 7.1, 8, 9.1, 17, 19.1) and
//! the behaviour of the reference server (`agrathwohl/pvp`), records every envelope and every
//! violation, answers like the reference server does (`heartbeat.pong` to pings, `error` envelopes
//! for rejected operations, `heartbeat.ping` at a configurable interval) and lets a test wait for
//! what it expects with a deadline instead of a fixed sleep.
//!
//! Checks that need no state live in [`validate_envelope`]; the server adds the checks that need
//! the history of a connection or a session (first frame is `session.join`, one sender per
//! connection, no duplicate `id`, context keys unique per session, sender has joined, ...).

use std::collections::hash_map::RandomState;
use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::{SinkExt, StreamExt};
use serde_json::{Map, Value, json};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::{Instant, Interval, MissedTickBehavior};
use tokio_tungstenite::tungstenite::Message;

/// The primitive types of spec section 4.3. The spec says "40" but its table lists 41: the
/// implementation guide's `PrimitiveType` union has no `tool.output`. All 41 are accepted here.
pub const PRIMITIVE_TYPES: [&str; 41] = [
    "session.create",
    "session.join",
    "session.leave",
    "session.end",
    "session.config_update",
    "participant.announce",
    "participant.role_change",
    "heartbeat.ping",
    "heartbeat.pong",
    "presence.update",
    "context.add",
    "context.update",
    "context.remove",
    "secret.share",
    "secret.revoke",
    "prompt.draft",
    "prompt.submit",
    "prompt.amend",
    "thinking.start",
    "thinking.chunk",
    "thinking.end",
    "response.start",
    "response.chunk",
    "response.end",
    "tool.propose",
    "tool.approve",
    "tool.reject",
    "tool.execute",
    "tool.output",
    "tool.result",
    "gate.request",
    "gate.approve",
    "gate.reject",
    "gate.timeout",
    "interrupt.raise",
    "interrupt.acknowledge",
    "fork.create",
    "fork.switch",
    "merge.propose",
    "merge.execute",
    "error",
];

/// Section 7.2.
pub const ROLES: [&str; 6] = [
    "driver",
    "navigator",
    "adversary",
    "observer",
    "approver",
    "admin",
];

/// Section 7.3.
pub const CAPABILITIES: [&str; 7] = [
    "prompt",
    "approve",
    "interrupt",
    "fork",
    "add_context",
    "manage_participants",
    "end_session",
];

/// `TransportType` of section 7.1.
pub const TRANSPORTS: [&str; 5] = ["websocket", "mcp", "t140", "http", "stdio"];

/// Section 9.1.
pub const CONTENT_TYPES: [&str; 6] = [
    "text",
    "file",
    "reference",
    "structured",
    "image",
    "audio_transcript",
];

/// Section 17.
pub const ERROR_CODES: [&str; 12] = [
    "INVALID_MESSAGE",
    "UNAUTHORIZED",
    "SESSION_NOT_FOUND",
    "PARTICIPANT_NOT_FOUND",
    "GATE_FAILED",
    "TIMEOUT",
    "RATE_LIMITED",
    "CONTEXT_TOO_LARGE",
    "INVALID_STATE",
    "TRANSPORT_ERROR",
    "AGENT_ERROR",
    "INTERNAL_ERROR",
];

const ENVELOPE_REQUIRED: [&str; 7] = ["v", "id", "ts", "session", "sender", "type", "payload"];
const ENVELOPE_OPTIONAL: [&str; 4] = ["ref", "seq", "causal_refs", "fork"];
const CROCKFORD: &[u8; 32] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";

// ---------------------------------------------------------------------------------------------
// Public data types
// ---------------------------------------------------------------------------------------------

/// One envelope received from a client (valid or not, as long as the frame was JSON).
#[derive(Debug, Clone, PartialEq)]
pub struct Received {
    /// Connection number: 0 for the first accepted TCP connection, then 1, 2, ...
    pub conn: usize,
    pub envelope: Value,
}

/// One envelope the server sent (pings, pongs, errors, broadcasts, [`TestPvpServer::send_to`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Sent {
    pub conn: usize,
    pub envelope: Value,
}

/// Options for [`TestPvpServer::start_with`].
#[derive(Debug, Clone, Default)]
pub struct ServerOptions {
    /// `None`: every session id is accepted (the reference server auto-creates sessions on join).
    /// `Some(list)`: envelopes for any other session are answered with an `error`
    /// `SESSION_NOT_FOUND` (`related_to` = the offending id) and a `session.join` to it does not join.
    pub sessions: Option<Vec<String>>,
    /// Interval of the `heartbeat.ping` envelopes the server sends to every joined connection
    /// (first ping one interval after the join). `None`: no pings.
    pub ping_interval: Option<Duration>,
    /// Behave like the reference server's router: on a valid `session.join` send a
    /// `participant.announce` for the joiner to every member of the session (the joiner included),
    /// and echo every other valid non-heartbeat envelope to the members of its session (the sender
    /// included; `context.add` with `visible_to` only to those participants and the sender).
    /// Off by default, so a client only gets pings, pongs and errors.
    pub broadcast: bool,
    /// Port to listen on (0: any free one). A restarted server takes its predecessor's port.
    pub port: u16,
}

// ---------------------------------------------------------------------------------------------
// Pure validation
// ---------------------------------------------------------------------------------------------

/// Checks one envelope without any session state: the envelope of section 4 and the payloads of
/// `session.join` (6.3), `session.leave` (6.4), `participant.announce` (7.1), `heartbeat.*` (8.1),
/// `context.add` (9.1) and `error` (17). Every problem found is listed, `; `-separated, each
/// naming its field.
pub fn validate_envelope(v: &Value) -> Result<(), String> {
    let problems = envelope_problems(v);
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("; "))
    }
}

/// Same checks as [`validate_envelope`], one string per problem.
pub fn envelope_problems(v: &Value) -> Vec<String> {
    let mut p = Vec::new();
    let Some(obj) = v.as_object() else {
        p.push(format!("envelope: not a JSON object but {}", kind(v)));
        return p;
    };
    for key in obj.keys() {
        if !ENVELOPE_REQUIRED.contains(&key.as_str()) && !ENVELOPE_OPTIONAL.contains(&key.as_str())
        {
            p.push(format!("field `{key}`: unknown envelope field"));
        }
    }
    for key in ENVELOPE_REQUIRED {
        if !obj.contains_key(key) {
            p.push(format!("field `{key}`: missing"));
        }
    }
    if let Some(val) = obj.get("v")
        && !(val.is_u64() && val.as_u64() == Some(1))
    {
        p.push(format!("field `v`: must be the integer 1, got {val}"));
    }
    if let Some(val) = obj.get("id") {
        match val.as_str() {
            Some(s) => {
                if let Err(e) = check_ulid(s) {
                    p.push(format!("field `id`: {e}"));
                }
            }
            None => p.push(format!("field `id`: must be a string, got {}", kind(val))),
        }
    }
    if let Some(val) = obj.get("ts") {
        match val.as_str() {
            Some(s) => {
                if let Err(e) = check_timestamp(s) {
                    p.push(format!("field `ts`: {e}"));
                }
            }
            None => p.push(format!("field `ts`: must be a string, got {}", kind(val))),
        }
    }
    for key in ["session", "sender"] {
        if let Some(val) = obj.get(key) {
            match val.as_str() {
                Some("") => p.push(format!("field `{key}`: must not be empty")),
                Some(_) => {}
                None => p.push(format!(
                    "field `{key}`: must be a string, got {}",
                    kind(val)
                )),
            }
        }
    }
    let mut typ = None;
    if let Some(val) = obj.get("type") {
        match val.as_str() {
            Some(t) if PRIMITIVE_TYPES.contains(&t) => typ = Some(t),
            Some(t) => p.push(format!(
                "field `type`: {t:?} is not a primitive type of 4.3"
            )),
            None => p.push(format!("field `type`: must be a string, got {}", kind(val))),
        }
    }
    if let Some(val) = obj.get("ref") {
        match val.as_str() {
            Some("") => p.push("field `ref`: must not be empty".to_string()),
            Some(_) => {}
            None => p.push(format!("field `ref`: must be a string, got {}", kind(val))),
        }
    }
    if let Some(val) = obj.get("seq")
        && !val.is_u64()
    {
        p.push(format!(
            "field `seq`: must be a non-negative integer, got {val}"
        ));
    }
    if let Some(val) = obj.get("causal_refs") {
        string_array(&mut p, "causal_refs", val, false);
    }
    if let Some(val) = obj.get("fork") {
        match val.as_str() {
            Some("") => p.push("field `fork`: must not be empty".to_string()),
            Some(_) => {}
            None => p.push(format!("field `fork`: must be a string, got {}", kind(val))),
        }
    }
    let payload = match obj.get("payload") {
        Some(Value::Object(m)) => m,
        Some(other) => {
            p.push(format!(
                "field `payload`: must be an object, got {}",
                kind(other)
            ));
            return p;
        }
        None => return p,
    };
    let sender = obj.get("sender").and_then(Value::as_str);
    match typ {
        Some("session.join") => join_problems(&mut p, payload, sender),
        Some("session.leave") => {
            only_fields(&mut p, "payload", payload, &["reason"]);
            opt_string(&mut p, "payload.reason", payload.get("reason"));
        }
        Some("participant.announce") => participant_problems(&mut p, "payload", payload, sender),
        Some("heartbeat.ping") | Some("heartbeat.pong") if !payload.is_empty() => {
            p.push(format!(
                "field `payload`: must be an empty object (8.1), got {}",
                Value::Object(payload.clone())
            ));
        }
        Some("context.add") => context_add_problems(&mut p, payload),
        Some("error") => error_problems(&mut p, payload),
        _ => {}
    }
    p
}

/// A ULID in canonical form: 26 characters of Crockford base32 (upper case, no I L O U), first
/// character 0-7 so that the value fits in 128 bits.
pub fn check_ulid(s: &str) -> Result<(), String> {
    if s.len() != 26 {
        return Err(format!(
            "{s:?} is not a ULID: {} characters instead of 26",
            s.chars().count()
        ));
    }
    if let Some(c) = s
        .chars()
        .find(|c| !CROCKFORD.contains(&(*c as u8)) || !c.is_ascii())
    {
        let why = if c.is_ascii_lowercase() {
            "lower case (canonical ULIDs are upper case)"
        } else {
            "not Crockford base32"
        };
        return Err(format!("{s:?} is not a ULID: character {c:?} is {why}"));
    }
    if s.as_bytes()[0] > b'7' {
        return Err(format!(
            "{s:?} is not a ULID: first character must be 0-7 (value exceeds 128 bits)"
        ));
    }
    Ok(())
}

/// ISO 8601 / RFC 3339 date-time: `YYYY-MM-DDTHH:MM:SS`, optional `.` and 1-9 fraction digits,
/// then `Z` or `+HH:MM` / `-HH:MM`. Field ranges and days per month are checked.
pub fn check_timestamp(s: &str) -> Result<(), String> {
    let bad = |why: &str| Err(format!("{s:?} is not an ISO 8601 timestamp: {why}"));
    let b = s.as_bytes();
    if b.len() < 20 {
        return bad("too short (want YYYY-MM-DDTHH:MM:SS[.fff]Z)");
    }
    let shape = b"dddd-dd-ddTdd:dd:dd";
    for (i, (&c, &want)) in b.iter().zip(shape.iter()).enumerate() {
        let ok = if want == b'd' {
            c.is_ascii_digit()
        } else {
            c == want
        };
        if !ok {
            return bad(&format!(
                "byte {i} is {:?}, want {}",
                c as char,
                if want == b'd' {
                    "a digit".to_string()
                } else {
                    format!("{:?}", want as char)
                }
            ));
        }
    }
    let num = |r: std::ops::Range<usize>| s[r].parse::<u32>().unwrap_or(u32::MAX);
    let (year, month, day) = (num(0..4), num(5..7), num(8..10));
    let (hour, minute, second) = (num(11..13), num(14..16), num(17..19));
    if !(1..=12).contains(&month) {
        return bad("month out of range");
    }
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    let days = match month {
        2 if leap => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    };
    if day < 1 || day > days {
        return bad("day out of range");
    }
    if hour > 23 || minute > 59 || second > 60 {
        return bad("time out of range");
    }
    let mut rest = &s[19..];
    if let Some(frac) = rest.strip_prefix('.') {
        let digits = frac.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 || digits > 9 {
            return bad("fraction must have 1 to 9 digits");
        }
        rest = &frac[digits..];
    }
    if rest == "Z" {
        return Ok(());
    }
    let o = rest.as_bytes();
    if o.len() == 6
        && (o[0] == b'+' || o[0] == b'-')
        && o[1].is_ascii_digit()
        && o[2].is_ascii_digit()
        && o[3] == b':'
        && o[4].is_ascii_digit()
        && o[5].is_ascii_digit()
        && num_in(&rest[1..3]) <= 23
        && num_in(&rest[4..6]) <= 59
    {
        return Ok(());
    }
    bad(&format!(
        "zone {rest:?} is neither `Z` nor `+HH:MM`/`-HH:MM`"
    ))
}

fn num_in(s: &str) -> u32 {
    s.parse().unwrap_or(u32::MAX)
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn only_fields(p: &mut Vec<String>, path: &str, m: &Map<String, Value>, allowed: &[&str]) {
    for key in m.keys() {
        if !allowed.contains(&key.as_str()) {
            p.push(format!("field `{path}.{key}`: unknown field"));
        }
    }
}

fn req_nonempty_string(p: &mut Vec<String>, path: &str, v: Option<&Value>) {
    match v {
        None => p.push(format!("field `{path}`: missing")),
        Some(Value::String(s)) if s.is_empty() => {
            p.push(format!("field `{path}`: must not be empty"))
        }
        Some(Value::String(_)) => {}
        Some(other) => p.push(format!(
            "field `{path}`: must be a string, got {}",
            kind(other)
        )),
    }
}

fn opt_string(p: &mut Vec<String>, path: &str, v: Option<&Value>) {
    if let Some(v) = v
        && !v.is_string()
    {
        p.push(format!("field `{path}`: must be a string, got {}", kind(v)));
    }
}

fn req_enum(p: &mut Vec<String>, path: &str, v: Option<&Value>, allowed: &[&str]) {
    match v {
        None => p.push(format!("field `{path}`: missing")),
        Some(Value::String(s)) if allowed.contains(&s.as_str()) => {}
        Some(other) => p.push(format!("field `{path}`: {other} is not one of {allowed:?}")),
    }
}

/// An array of strings; `allowed` (if not empty) restricts the values.
fn string_array(p: &mut Vec<String>, path: &str, v: &Value, non_empty: bool) -> Vec<String> {
    enum_array(p, path, v, non_empty, &[])
}

fn enum_array(
    p: &mut Vec<String>,
    path: &str,
    v: &Value,
    non_empty: bool,
    allowed: &[&str],
) -> Vec<String> {
    let Some(items) = v.as_array() else {
        p.push(format!("field `{path}`: must be an array, got {}", kind(v)));
        return Vec::new();
    };
    if non_empty && items.is_empty() {
        p.push(format!("field `{path}`: must not be empty"));
    }
    let mut out = Vec::new();
    for (i, item) in items.iter().enumerate() {
        match item.as_str() {
            Some(s) if allowed.is_empty() || allowed.contains(&s) => out.push(s.to_string()),
            Some(s) => p.push(format!(
                "field `{path}[{i}]`: {s:?} is not one of {allowed:?}"
            )),
            None => p.push(format!(
                "field `{path}[{i}]`: must be a string, got {}",
                kind(item)
            )),
        }
    }
    out
}

/// `ParticipantAnnouncePayload` (7.1); `id` must equal the envelope's sender.
fn participant_problems(
    p: &mut Vec<String>,
    path: &str,
    m: &Map<String, Value>,
    sender: Option<&str>,
) {
    only_fields(
        p,
        path,
        m,
        &[
            "id",
            "name",
            "type",
            "roles",
            "capabilities",
            "transport",
            "metadata",
        ],
    );
    req_nonempty_string(p, &format!("{path}.id"), m.get("id"));
    if let (Some(id), Some(sender)) = (m.get("id").and_then(Value::as_str), sender)
        && id != sender
    {
        p.push(format!(
            "field `{path}.id`: {id:?} differs from the envelope sender {sender:?}"
        ));
    }
    req_nonempty_string(p, &format!("{path}.name"), m.get("name"));
    req_enum(
        p,
        &format!("{path}.type"),
        m.get("type"),
        &["human", "agent"],
    );
    match m.get("roles") {
        None => p.push(format!("field `{path}.roles`: missing")),
        Some(v) => {
            enum_array(p, &format!("{path}.roles"), v, true, &ROLES);
        }
    }
    if let Some(v) = m.get("capabilities") {
        enum_array(p, &format!("{path}.capabilities"), v, false, &CAPABILITIES);
    }
    req_enum(
        p,
        &format!("{path}.transport"),
        m.get("transport"),
        &TRANSPORTS,
    );
    if let Some(v) = m.get("metadata")
        && !v.is_object()
    {
        p.push(format!(
            "field `{path}.metadata`: must be an object, got {}",
            kind(v)
        ));
    }
}

fn join_problems(p: &mut Vec<String>, m: &Map<String, Value>, sender: Option<&str>) {
    only_fields(
        p,
        "payload",
        m,
        &["participant", "token", "supported_versions"],
    );
    match m.get("participant") {
        None => p.push("field `payload.participant`: missing".to_string()),
        Some(Value::Object(part)) => participant_problems(p, "payload.participant", part, sender),
        Some(other) => p.push(format!(
            "field `payload.participant`: must be an object, got {}",
            kind(other)
        )),
    }
    opt_string(p, "payload.token", m.get("token"));
    match m.get("supported_versions") {
        None => p.push("field `payload.supported_versions`: missing".to_string()),
        Some(Value::Array(items)) => {
            let mut has_one = false;
            for (i, item) in items.iter().enumerate() {
                if !item.is_u64() && !item.is_i64() {
                    p.push(format!(
                        "field `payload.supported_versions[{i}]`: must be an integer, got {item}"
                    ));
                }
                has_one |= item.as_u64() == Some(1);
            }
            if !has_one {
                p.push(
                    "field `payload.supported_versions`: must contain protocol version 1"
                        .to_string(),
                );
            }
        }
        Some(other) => p.push(format!(
            "field `payload.supported_versions`: must be an array, got {}",
            kind(other)
        )),
    }
}

fn context_add_problems(p: &mut Vec<String>, m: &Map<String, Value>) {
    only_fields(
        p,
        "payload",
        m,
        &[
            "key",
            "content_type",
            "content",
            "content_ref",
            "visible_to",
            "source",
            "tags",
        ],
    );
    req_nonempty_string(p, "payload.key", m.get("key"));
    if let Some(key) = m.get("key").and_then(Value::as_str)
        && key.starts_with("session:")
    {
        p.push(format!(
            "field `payload.key`: {key:?} uses the reserved `session:` prefix (9.4)"
        ));
    }
    req_enum(
        p,
        "payload.content_type",
        m.get("content_type"),
        &CONTENT_TYPES,
    );
    match m.get("content") {
        None | Some(Value::String(_)) | Some(Value::Object(_)) => {}
        Some(other) => p.push(format!(
            "field `payload.content`: must be a string or an object, got {}",
            kind(other)
        )),
    }
    match m.get("content_ref") {
        None => {}
        Some(Value::Object(r)) => {
            only_fields(
                p,
                "payload.content_ref",
                r,
                &["hash", "size_bytes", "mime_type", "storage", "uri"],
            );
            req_nonempty_string(p, "payload.content_ref.hash", r.get("hash"));
            if !r.get("size_bytes").is_some_and(Value::is_u64) {
                p.push(
                    "field `payload.content_ref.size_bytes`: must be a non-negative integer"
                        .to_string(),
                );
            }
            req_nonempty_string(p, "payload.content_ref.mime_type", r.get("mime_type"));
            req_enum(
                p,
                "payload.content_ref.storage",
                r.get("storage"),
                &["inline", "local", "s3", "ipfs"],
            );
            opt_string(p, "payload.content_ref.uri", r.get("uri"));
        }
        Some(other) => p.push(format!(
            "field `payload.content_ref`: must be an object, got {}",
            kind(other)
        )),
    }
    if !m.contains_key("content") && !m.contains_key("content_ref") {
        p.push("field `payload.content`: neither `content` nor `content_ref` is present".into());
    }
    if let Some(v) = m.get("visible_to") {
        string_array(p, "payload.visible_to", v, false);
    }
    opt_string(p, "payload.source", m.get("source"));
    if let Some(v) = m.get("tags") {
        string_array(p, "payload.tags", v, false);
    }
}

fn error_problems(p: &mut Vec<String>, m: &Map<String, Value>) {
    only_fields(
        p,
        "payload",
        m,
        &["code", "message", "recoverable", "details", "related_to"],
    );
    req_enum(p, "payload.code", m.get("code"), &ERROR_CODES);
    match m.get("message") {
        Some(Value::String(_)) => {}
        Some(other) => p.push(format!(
            "field `payload.message`: must be a string, got {}",
            kind(other)
        )),
        None => p.push("field `payload.message`: missing".to_string()),
    }
    if !m.get("recoverable").is_some_and(Value::is_boolean) {
        p.push("field `payload.recoverable`: must be a boolean".to_string());
    }
    if let Some(v) = m.get("details")
        && !v.is_object()
    {
        p.push(format!(
            "field `payload.details`: must be an object, got {}",
            kind(v)
        ));
    }
    opt_string(p, "payload.related_to", m.get("related_to"));
}

// ---------------------------------------------------------------------------------------------
// Identifiers and timestamps for envelopes the server (or a test client) creates
// ---------------------------------------------------------------------------------------------

/// A fresh, canonical ULID (48-bit millisecond time, 80 bits of which the low 32 are a process-wide
/// counter, so ids never repeat within a test run).
pub fn new_ulid() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
        & ((1 << 48) - 1);
    let mut h = RandomState::new().build_hasher();
    h.write_u64(n);
    let random48 = h.finish() & ((1 << 48) - 1);
    let mut value: u128 =
        ((ms as u128) << 80) | ((random48 as u128) << 32) | (n as u128 & 0xFFFF_FFFF);
    let mut out = [0u8; 26];
    for slot in out.iter_mut().rev() {
        *slot = CROCKFORD[(value & 31) as usize];
        value >>= 5;
    }
    String::from_utf8(out.to_vec()).expect("Crockford alphabet is ASCII")
}

/// Current time as `YYYY-MM-DDTHH:MM:SS.mmmZ` (what JavaScript's `toISOString` produces).
pub fn now_ts() -> String {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let secs = d.as_secs() as i64;
    let (days, sod) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, dd) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{dd:02}T{:02}:{:02}:{:02}.{:03}Z",
        sod / 3600,
        sod % 3600 / 60,
        sod % 60,
        d.subsec_millis()
    )
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian (H. Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// An envelope as the server sends it: fresh id, current ts, optional `ref`.
pub fn make_envelope(
    typ: &str,
    session: &str,
    sender: &str,
    payload: Value,
    reference: Option<&str>,
) -> Value {
    let mut v = json!({
        "v": 1,
        "id": new_ulid(),
        "ts": now_ts(),
        "session": session,
        "sender": sender,
        "type": typ,
        "payload": payload,
    });
    if let Some(r) = reference {
        v["ref"] = json!(r);
    }
    v
}

// ---------------------------------------------------------------------------------------------
// Server state
// ---------------------------------------------------------------------------------------------

enum Out {
    Frame(Value),
    /// An envelope as one text message cut into frames of this many bytes (RFC 6455 5.4).
    Fragments(Value, usize),
    Close,
}

struct Joined {
    session: String,
    roles: Vec<String>,
    capabilities: Vec<String>,
}

struct ConnState {
    open: bool,
    frames: usize,
    sender: Option<String>,
    joined: Option<Joined>,
    left: bool,
    outstanding_pings: VecDeque<String>,
    pings_sent: usize,
    pongs: usize,
    tx: Option<mpsc::UnboundedSender<Out>>,
}

#[derive(Default)]
struct State {
    received: Vec<Received>,
    sent: Vec<Sent>,
    violations: Vec<String>,
    seen_ids: HashSet<String>,
    context_keys: HashMap<String, HashSet<String>>,
    conns: HashMap<usize, ConnState>,
    opened: usize,
    closed: usize,
    pings_sent: usize,
    pongs: usize,
}

impl State {
    fn send(&mut self, conn: usize, envelope: Value) {
        if let Some(tx) = self.conns.get(&conn).and_then(|c| c.tx.as_ref())
            && tx.send(Out::Frame(envelope.clone())).is_ok()
        {
            self.sent.push(Sent { conn, envelope });
        }
    }

    /// Open connections joined (and not left) to `session`.
    fn members(&self, session: &str) -> Vec<(usize, Option<String>)> {
        let mut m: Vec<_> = self
            .conns
            .iter()
            .filter(|(_, c)| {
                c.open && !c.left && c.joined.as_ref().is_some_and(|j| j.session == session)
            })
            .map(|(k, c)| (*k, c.sender.clone()))
            .collect();
        m.sort();
        m
    }
}

struct Shared {
    state: Mutex<State>,
    opts: ServerOptions,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

// ---------------------------------------------------------------------------------------------
// The server
// ---------------------------------------------------------------------------------------------

/// A PVP server on 127.0.0.1 that records and checks everything it receives.
pub struct TestPvpServer {
    addr: std::net::SocketAddr,
    shared: Arc<Shared>,
    shutdown: watch::Sender<bool>,
    accept_task: JoinHandle<()>,
}

impl TestPvpServer {
    /// Binds 127.0.0.1:0, spawns the accept loop on the current tokio runtime. Any session id is
    /// accepted and no pings are sent.
    pub async fn start() -> TestPvpServer {
        Self::start_with(ServerOptions::default()).await
    }

    /// Like [`TestPvpServer::start`] with options.
    pub async fn start_with(opts: ServerOptions) -> TestPvpServer {
        let listener = TcpListener::bind(("127.0.0.1", opts.port))
            .await
            .expect("bind 127.0.0.1");
        let addr = listener.local_addr().expect("local_addr");
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            opts,
        });
        let (shutdown, shutdown_rx) = watch::channel(false);
        let accept_task = tokio::spawn(accept_loop(listener, shared.clone(), shutdown_rx));
        TestPvpServer {
            addr,
            shared,
            shutdown,
            accept_task,
        }
    }

    /// `ws://127.0.0.1:PORT`
    pub fn url(&self) -> String {
        format!("ws://{}", self.addr)
    }

    /// Every envelope received so far (any JSON text frame, valid or not), in arrival order.
    pub fn received(&self) -> Vec<Received> {
        self.shared.lock().received.clone()
    }

    /// Received envelopes of one `type`, in arrival order.
    pub fn received_of_type(&self, typ: &str) -> Vec<Value> {
        self.shared
            .lock()
            .received
            .iter()
            .filter(|r| r.envelope["type"] == typ)
            .map(|r| r.envelope.clone())
            .collect()
    }

    /// Every envelope the server sent so far, in order.
    pub fn sent(&self) -> Vec<Sent> {
        self.shared.lock().sent.clone()
    }

    /// Every violation found so far; empty means everything received was conformant.
    pub fn violations(&self) -> Vec<String> {
        self.shared.lock().violations.clone()
    }

    /// Panics listing the violations (and what was received) if there are any.
    pub fn assert_no_violations(&self) {
        let v = self.violations();
        if !v.is_empty() {
            panic!(
                "PVP test server found {} violation(s):\n  {}\nreceived:\n{}",
                v.len(),
                v.join("\n  "),
                self.describe_received()
            );
        }
    }

    /// WebSocket connections whose handshake succeeded (a failed handshake is a violation).
    pub fn connections_opened(&self) -> usize {
        self.shared.lock().opened
    }

    /// Of those, the ones that have ended (either side closed, or the TCP connection broke).
    pub fn connections_closed(&self) -> usize {
        self.shared.lock().closed
    }

    /// `heartbeat.ping` envelopes the server sent (all connections).
    pub fn pings_sent(&self) -> usize {
        self.shared.lock().pings_sent
    }

    /// `heartbeat.pong` envelopes that answered a ping the server sent on the same connection
    /// (all connections).
    pub fn pongs_received(&self) -> usize {
        self.shared.lock().pongs
    }

    /// Matched pongs on one connection.
    pub fn pongs_received_on(&self, conn: usize) -> usize {
        self.shared.lock().conns.get(&conn).map_or(0, |c| c.pongs)
    }

    /// Pings sent on one connection.
    pub fn pings_sent_on(&self, conn: usize) -> usize {
        self.shared
            .lock()
            .conns
            .get(&conn)
            .map_or(0, |c| c.pings_sent)
    }

    /// The sender a connection is bound to (from its first envelope).
    pub fn sender_of(&self, conn: usize) -> Option<String> {
        self.shared
            .lock()
            .conns
            .get(&conn)
            .and_then(|c| c.sender.clone())
    }

    /// Sends an arbitrary envelope (not checked) to a connection, e.g. an `error` to see how the
    /// client copes. Returns false if the connection is gone.
    pub fn send_to(&self, conn: usize, envelope: Value) -> bool {
        let mut st = self.shared.lock();
        let before = st.sent.len();
        st.send(conn, envelope);
        st.sent.len() > before
    }

    /// Sends an envelope (not checked, not recorded as sent) as one text message cut into
    /// frames of `frame_size` bytes, as a server may (RFC 6455 5.4). Returns false if the
    /// connection is gone.
    pub fn send_fragmented_to(&self, conn: usize, envelope: Value, frame_size: usize) -> bool {
        let st = self.shared.lock();
        st.conns
            .get(&conn)
            .and_then(|c| c.tx.as_ref())
            .is_some_and(|tx| tx.send(Out::Fragments(envelope, frame_size)).is_ok())
    }

    /// Closes one connection from the server side (WebSocket close frame), e.g. to exercise the
    /// client's reconnection (19.1). Returns false if the connection is gone.
    pub fn close_connection(&self, conn: usize) -> bool {
        let st = self.shared.lock();
        st.conns
            .get(&conn)
            .and_then(|c| c.tx.as_ref())
            .is_some_and(|tx| tx.send(Out::Close).is_ok())
    }

    /// Polls (every 10 ms, up to `timeout`) until `pred(self)` holds. Panics on timeout with
    /// `what`, the violations and everything received.
    pub async fn wait_until(&self, timeout: Duration, what: &str, pred: impl Fn(&Self) -> bool) {
        let deadline = Instant::now() + timeout;
        loop {
            if pred(self) {
                return;
            }
            if Instant::now() >= deadline {
                panic!(
                    "timed out after {timeout:?} waiting for {what}\n\
                     connections opened {}, closed {}; pings sent {}, pongs received {}\n\
                     violations ({}):\n  {}\nreceived:\n{}",
                    self.connections_opened(),
                    self.connections_closed(),
                    self.pings_sent(),
                    self.pongs_received(),
                    self.violations().len(),
                    self.violations().join("\n  "),
                    self.describe_received()
                );
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Polls until `pred(&received)` holds and returns what was received; panics after `timeout`
    /// listing what was received.
    pub async fn wait_for(
        &self,
        timeout: Duration,
        pred: impl Fn(&[Received]) -> bool,
    ) -> Vec<Received> {
        self.wait_until(timeout, "the received envelopes to match", |s| {
            pred(&s.shared.lock().received)
        })
        .await;
        self.received()
    }

    /// Polls until `pred(&violations)` holds and returns the violations.
    pub async fn wait_for_violations(
        &self,
        timeout: Duration,
        pred: impl Fn(&[String]) -> bool,
    ) -> Vec<String> {
        self.wait_until(timeout, "the violations to match", |s| {
            pred(&s.shared.lock().violations)
        })
        .await;
        self.violations()
    }

    /// Closes the listener and every connection (close frame), and waits for the tasks to end.
    pub async fn stop(self) {
        let _ = self.shutdown.send(true);
        let _ = tokio::time::timeout(Duration::from_secs(5), self.accept_task).await;
    }

    fn describe_received(&self) -> String {
        let st = self.shared.lock();
        if st.received.is_empty() {
            return "  (nothing)".to_string();
        }
        st.received
            .iter()
            .map(|r| format!("  conn {}: {}", r.conn, r.envelope))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

async fn accept_loop(
    listener: TcpListener,
    shared: Arc<Shared>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut tasks = JoinSet::new();
    // Numbered in TCP accept order, so clients that connect one after another get 0, 1, 2, ...
    let mut next_conn = 0;
    loop {
        tokio::select! {
            _ = shutdown.changed() => break,
            accepted = listener.accept() => {
                if let Ok((stream, _)) = accepted {
                    tasks.spawn(run_connection(stream, next_conn, shared.clone(), shutdown.clone()));
                    next_conn += 1;
                }
            }
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
        }
    }
    drop(listener);
    while tasks.join_next().await.is_some() {}
}

async fn tick(ticker: &mut Option<Interval>) {
    match ticker {
        Some(t) => {
            t.tick().await;
        }
        None => std::future::pending::<()>().await,
    }
}

async fn run_connection(
    stream: TcpStream,
    conn: usize,
    shared: Arc<Shared>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut ws = match tokio_tungstenite::accept_async(stream).await {
        Ok(ws) => ws,
        Err(e) => {
            shared
                .lock()
                .violations
                .push(format!("conn {conn}: WebSocket handshake failed: {e}"));
            return;
        }
    };
    let (tx, mut rx) = mpsc::unbounded_channel();
    {
        let mut st = shared.lock();
        st.opened += 1;
        st.conns.insert(
            conn,
            ConnState {
                open: true,
                frames: 0,
                sender: None,
                joined: None,
                left: false,
                outstanding_pings: VecDeque::new(),
                pings_sent: 0,
                pongs: 0,
                tx: Some(tx),
            },
        );
    }
    let mut ticker: Option<Interval> = None;
    loop {
        tokio::select! {
            _ = shutdown.changed() => {
                let _ = ws.close(None).await;
                break;
            }
            out = rx.recv() => match out {
                Some(Out::Frame(v)) => {
                    if ws.send(Message::text(v.to_string())).await.is_err() {
                        break;
                    }
                }
                Some(Out::Fragments(v, size)) => {
                    if send_fragments(&mut ws, v.to_string().as_bytes(), size).await.is_err() {
                        break;
                    }
                }
                Some(Out::Close) | None => {
                    let _ = ws.close(None).await;
                    break;
                }
            },
            msg = ws.next() => match msg {
                None | Some(Err(_)) => break,
                Some(Ok(Message::Text(text))) => on_text(&shared, conn, text.as_str()),
                Some(Ok(Message::Binary(b))) => on_binary(&shared, conn, b.len()),
                Some(Ok(_)) => {} // WebSocket-level ping/pong/close are handled by tungstenite
            },
            _ = tick(&mut ticker) => send_ping(&shared, conn),
        }
        // Pings run while the connection is joined and has not left.
        let should_ping = shared.opts.ping_interval.is_some() && {
            let st = shared.lock();
            st.conns[&conn].joined.is_some() && !st.conns[&conn].left
        };
        match (should_ping, ticker.is_some()) {
            (true, false) => {
                let period = shared.opts.ping_interval.expect("checked");
                let mut t = tokio::time::interval_at(Instant::now() + period, period);
                t.set_missed_tick_behavior(MissedTickBehavior::Delay);
                ticker = Some(t);
            }
            (false, true) => ticker = None,
            _ => {}
        }
    }
    let mut st = shared.lock();
    st.closed += 1;
    if let Some(c) = st.conns.get_mut(&conn) {
        c.open = false;
        c.tx = None;
    }
}

/// One text message as frames of `size` bytes: the first a text frame, the rest continuations,
/// FIN on the last (RFC 6455 5.4).
async fn send_fragments(
    ws: &mut tokio_tungstenite::WebSocketStream<TcpStream>,
    text: &[u8],
    size: usize,
) -> Result<(), tokio_tungstenite::tungstenite::Error> {
    use tokio_tungstenite::tungstenite::protocol::frame::Frame;
    use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};
    let pieces: Vec<&[u8]> = text.chunks(size.max(1)).collect();
    for (i, piece) in pieces.iter().enumerate() {
        let opcode = OpCode::Data(if i == 0 { Data::Text } else { Data::Continue });
        let fin = i + 1 == pieces.len();
        ws.feed(Message::Frame(Frame::message(piece.to_vec(), opcode, fin)))
            .await?;
    }
    ws.flush().await
}

fn send_ping(shared: &Shared, conn: usize) {
    let mut st = shared.lock();
    let Some(session) = st.conns[&conn].joined.as_ref().map(|j| j.session.clone()) else {
        return;
    };
    let ping = make_envelope("heartbeat.ping", &session, "system", json!({}), None);
    let id = ping["id"].as_str().expect("id").to_string();
    let c = st.conns.get_mut(&conn).expect("conn");
    c.outstanding_pings.push_back(id);
    c.pings_sent += 1;
    st.pings_sent += 1;
    st.send(conn, ping);
}

fn on_binary(shared: &Shared, conn: usize, len: usize) {
    let mut st = shared.lock();
    let c = st.conns.get_mut(&conn).expect("conn");
    c.frames += 1;
    let frame_no = c.frames;
    st.violations.push(format!(
        "conn {conn}, frame {frame_no}: binary frame of {len} bytes \
         (19.1: one JSON envelope per text frame)"
    ));
    if frame_no == 1 {
        st.violations.push(format!(
            "conn {conn}: first frame must be a session.join envelope, got a binary frame"
        ));
    }
}

/// Error code and message of one problem.
type Problem = (&'static str, String);

fn on_text(shared: &Shared, conn: usize, text: &str) {
    let opts = &shared.opts;
    let mut st = shared.lock();
    let frame_no = {
        let c = st.conns.get_mut(&conn).expect("conn");
        c.frames += 1;
        c.frames
    };
    let v: Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(e) => {
            let shown: String = text.chars().take(200).collect();
            st.violations.push(format!(
                "conn {conn}, frame {frame_no}: not JSON ({e}): {shown:?}"
            ));
            if frame_no == 1 {
                st.violations.push(format!(
                    "conn {conn}: first frame must be a session.join envelope, got non-JSON text"
                ));
            }
            return;
        }
    };
    st.received.push(Received {
        conn,
        envelope: v.clone(),
    });

    let id = v.get("id").and_then(Value::as_str).map(str::to_string);
    let typ = v
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let sender = v.get("sender").and_then(Value::as_str).map(str::to_string);
    let session = v.get("session").and_then(Value::as_str).map(str::to_string);
    let mut problems: Vec<Problem> = envelope_problems(&v)
        .into_iter()
        .map(|p| ("INVALID_MESSAGE", p))
        .collect();

    if let Some(id) = &id
        && !st.seen_ids.insert(id.clone())
    {
        problems.push((
            "INVALID_MESSAGE",
            "field `id`: duplicate, an earlier envelope already used this id".to_string(),
        ));
    }
    if frame_no == 1 && typ != "session.join" {
        problems.push((
            "INVALID_STATE",
            format!("field `type`: first frame on a connection must be session.join, got {typ:?}"),
        ));
    }
    if sender.as_deref() == Some("system") {
        problems.push((
            "UNAUTHORIZED",
            "field `sender`: \"system\" is reserved for the server".to_string(),
        ));
    }
    // One connection, one sender: bound by its first envelope that names one.
    if let Some(s) = &sender {
        match st.conns[&conn].sender.clone() {
            None => {
                let other = st
                    .conns
                    .iter()
                    .find(|(k, c)| **k != conn && c.open && c.sender.as_deref() == Some(s))
                    .map(|(k, _)| *k);
                if let Some(other) = other {
                    problems.push((
                        "INVALID_STATE",
                        format!(
                            "field `sender`: {s:?} is already bound to open connection {other} \
                             (the reference server keys transports by sender)"
                        ),
                    ));
                }
                st.conns.get_mut(&conn).expect("conn").sender = Some(s.clone());
            }
            Some(bound) if &bound != s => problems.push((
                "INVALID_STATE",
                format!("field `sender`: {s:?} differs from {bound:?}, the sender this connection is bound to"),
            )),
            Some(_) => {}
        }
    }

    let unknown_session = match (&opts.sessions, &session) {
        (Some(known), Some(s)) => !known.contains(s),
        _ => false,
    };
    if unknown_session {
        let s = session.clone().unwrap_or_default();
        let err = make_envelope(
            "error",
            &s,
            "system",
            json!({
                "code": "SESSION_NOT_FOUND",
                "message": format!("Session {s} not found"),
                "recoverable": false,
                "related_to": id.clone().unwrap_or_default(),
            }),
            None,
        );
        st.send(conn, err);
    }

    let payload = v.get("payload").cloned().unwrap_or(Value::Null);
    let (joined_session, active) = {
        let c = &st.conns[&conn];
        (
            c.joined.as_ref().map(|j| j.session.clone()),
            c.joined.is_some() && !c.left,
        )
    };
    if typ != "session.join"
        && let (Some(js), Some(s)) = (&joined_session, &session)
        && js != s
    {
        problems.push((
            "INVALID_STATE",
            format!(
                "field `session`: {s:?} differs from {js:?}, the session joined on this connection"
            ),
        ));
    }

    let mut joined_now = false;
    match typ.as_str() {
        "session.join" => {
            if active {
                problems.push((
                    "INVALID_STATE",
                    "field `type`: session.join on a connection that has already joined".into(),
                ));
            } else if !unknown_session
                && let (Some(s), Some(part)) = (&session, payload.get("participant"))
                && part.is_object()
            {
                let strings = |k: &str| -> Vec<String> {
                    part.get(k)
                        .and_then(Value::as_array)
                        .map(|a| {
                            a.iter()
                                .filter_map(Value::as_str)
                                .map(str::to_string)
                                .collect()
                        })
                        .unwrap_or_default()
                };
                let c = st.conns.get_mut(&conn).expect("conn");
                c.joined = Some(Joined {
                    session: s.clone(),
                    roles: strings("roles"),
                    capabilities: strings("capabilities"),
                });
                c.left = false;
                joined_now = true;
            }
        }
        "heartbeat.pong" => {
            let c = st.conns.get_mut(&conn).expect("conn");
            let reference = v.get("ref").and_then(Value::as_str);
            let matched = match reference {
                Some(r) => match c.outstanding_pings.iter().position(|p| p == r) {
                    Some(i) => {
                        c.outstanding_pings.remove(i);
                        true
                    }
                    None => {
                        problems.push((
                            "INVALID_MESSAGE",
                            format!("field `ref`: {r:?} is not a heartbeat.ping sent on this connection and not yet answered"),
                        ));
                        false
                    }
                },
                None => match c.outstanding_pings.pop_front() {
                    Some(_) => true,
                    None => {
                        problems.push((
                            "INVALID_STATE",
                            "field `type`: heartbeat.pong without an outstanding heartbeat.ping"
                                .into(),
                        ));
                        false
                    }
                },
            };
            if matched {
                c.pongs += 1;
                st.pongs += 1;
            }
            if joined_session.is_none() {
                problems.push((
                    "PARTICIPANT_NOT_FOUND",
                    "field `sender`: has not sent session.join on this connection".into(),
                ));
            }
        }
        _ => {
            if !active {
                let why = if joined_session.is_some() {
                    "has left (session.leave) on this connection"
                } else {
                    "has not sent session.join on this connection"
                };
                problems.push(("PARTICIPANT_NOT_FOUND", format!("field `sender`: {why}")));
            }
            if typ == "session.leave" && active {
                st.conns.get_mut(&conn).expect("conn").left = true;
            }
            if typ == "heartbeat.ping"
                && let (Some(s), Some(id)) = (&session, &id)
            {
                let pong = make_envelope("heartbeat.pong", s, "system", json!({}), Some(id));
                st.send(conn, pong);
            }
            if typ == "context.add" {
                if active && let Some(j) = &st.conns[&conn].joined {
                    // Reference server rule (ParticipantManager.canAddContext).
                    let allowed = j.capabilities.iter().any(|c| c == "add_context")
                        || j.roles.iter().any(|r| r == "driver" || r == "navigator");
                    if !allowed {
                        problems.push((
                            "UNAUTHORIZED",
                            format!(
                                "field `sender`: may not add context (roles {:?}, capabilities {:?}; \
                                 needs the add_context capability or the driver/navigator role)",
                                j.roles, j.capabilities
                            ),
                        ));
                    }
                }
                if let (Some(s), Some(key)) = (&session, payload.get("key").and_then(Value::as_str))
                    && !key.is_empty()
                    && !st
                        .context_keys
                        .entry(s.clone())
                        .or_default()
                        .insert(key.to_string())
                {
                    problems.push((
                        "INVALID_STATE",
                        format!("field `payload.key`: {key:?} already exists in session {s:?} (keys are unique within a session)"),
                    ));
                }
            }
        }
    }

    let label = id.clone().unwrap_or_else(|| "<no id>".to_string());
    for (_, p) in &problems {
        st.violations
            .push(format!("conn {conn}, id {label}, type {typ:?}: {p}"));
    }

    // Spec 17: every rejected operation gets an error (unknown sessions were answered above).
    if let (Some((code, _)), Some(s)) = (problems.first(), session.clone().or(joined_session))
        && !s.is_empty()
    {
        let message = problems
            .iter()
            .map(|(_, p)| p.as_str())
            .collect::<Vec<_>>()
            .join("; ");
        let mut payload = json!({ "code": code, "message": message, "recoverable": true });
        if let Some(id) = &id {
            payload["related_to"] = json!(id);
        }
        let err = make_envelope("error", &s, "system", payload, None);
        st.send(conn, err);
    }

    if opts.broadcast && problems.is_empty() && !unknown_session {
        broadcast(&mut st, conn, &v, &typ, joined_now);
    }
}

/// Reference-server style fan-out (see [`ServerOptions::broadcast`]).
fn broadcast(st: &mut State, conn: usize, v: &Value, typ: &str, joined_now: bool) {
    let Some(session) = v["session"].as_str() else {
        return;
    };
    let members = st.members(session);
    if joined_now {
        let sender = v["sender"].as_str().unwrap_or_default();
        let announce = make_envelope(
            "participant.announce",
            session,
            sender,
            v["payload"]["participant"].clone(),
            None,
        );
        for (m, _) in members {
            st.send(m, announce.clone());
        }
        return;
    }
    if typ.starts_with("heartbeat.") {
        return;
    }
    let visible: Option<Vec<&str>> = (typ == "context.add")
        .then(|| v["payload"]["visible_to"].as_array())
        .flatten()
        .map(|a| a.iter().filter_map(Value::as_str).collect());
    // A session.leave has already removed the sender from the members; it still gets the echo.
    let mut targets: Vec<usize> = members
        .into_iter()
        .filter(|(m, s)| {
            *m == conn
                || visible
                    .as_ref()
                    .is_none_or(|vis| s.as_deref().is_some_and(|s| vis.contains(&s)))
        })
        .map(|(m, _)| m)
        .collect();
    if !targets.contains(&conn) {
        targets.push(conn);
    }
    for m in targets {
        st.send(m, v.clone());
    }
}

/// A member of `session` on the server at `url`, joined as `id` with the approver role, that
/// answers each `gate.request` it is relayed with the envelopes `answer` makes of it (a
/// decision, or a forgery), in order. Runs until the server closes the connection.
pub async fn gate_answerer(
    url: String,
    session: &str,
    id: &str,
    answer: impl Fn(&Value) -> Vec<Value> + Send + 'static,
) {
    let (mut ws, _) = tokio_tungstenite::connect_async(url).await.unwrap();
    let join = make_envelope(
        "session.join",
        session,
        id,
        json!({
            "participant": {"id": id, "name": id, "type": "human", "roles": ["approver"],
                "transport": "websocket"},
            "supported_versions": [1]
        }),
        None,
    );
    ws.send(Message::text(join.to_string())).await.unwrap();
    tokio::spawn(async move {
        while let Some(Ok(msg)) = ws.next().await {
            let Ok(e) = serde_json::from_str::<Value>(msg.to_text().unwrap_or("")) else {
                continue;
            };
            if e["type"] != "gate.request" {
                continue;
            }
            for reply in answer(&e) {
                ws.send(Message::text(reply.to_string())).await.unwrap();
            }
        }
    });
}
