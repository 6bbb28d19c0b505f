//! PVP envelopes (pvp-spec sections 4-9, 17) the gateway emits and reads. Building them is plain
//! data in, data out: ids and timestamps come from the time value passed in, so a replay yields
//! the same envelopes (but for the random part of the ULIDs) every run.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::time::Time;

/// Whether an envelope's sender is the server itself (pvp-spec 4.2: it "MAY use `system`"),
/// not a member of the session: the server's word (a ping, an error, a gate's timeout) is
/// acted on only from it.
pub fn from_server(sender: &str) -> bool {
    matches!(sender, "system" | "server")
}

/// pvp-spec 4.1 message envelope in its general, parsed form: what a server sends us, what the
/// spool journal holds, and what tests inspect. The gateway itself emits [`Envelope`]s.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub v: u32,
    pub id: String,
    pub ts: String,
    pub session: String,
    pub sender: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub payload: Value,
    #[serde(rename = "ref", skip_serializing_if = "Option::is_none", default)]
    pub reference: Option<String>,
}

impl Message {
    pub fn to_json(&self) -> String {
        // Serializing a struct of strings and a Value cannot fail.
        separators_escaped(serde_json::to_string(self).unwrap_or_default())
    }

    /// The envelope that sends this message (for messages re-issued from the spool journal or
    /// rebuilt by a sink). Refuses kinds the gateway never sends and ids that are not ULIDs.
    pub fn to_envelope(&self) -> Result<Envelope, String> {
        let kind =
            Kind::parse(&self.kind).ok_or_else(|| format!("not a kind we send: {}", self.kind))?;
        let id = ulid::Ulid::from_string(&self.id).map_err(|e| format!("id {}: {e}", self.id))?;
        Ok(Envelope {
            id,
            kind,
            sender: SenderId::from(self.sender.as_str()),
            json: self.to_json(),
        })
    }
}

/// `","type":"KIND","payload":`, the text between an envelope's sender and its payload, as a
/// literal ([`Kind::type_and_payload_key`], and `context.add`'s longer head).
macro_rules! tail {
    ($kind:literal) => {
        concat!("\",\"type\":\"", $kind, "\",\"payload\":")
    };
}

/// The message types the gateway sends (pvp-spec 4.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    SessionJoin,
    SessionLeave,
    ParticipantAnnounce,
    ContextAdd,
    ContextUpdate,
    ContextRemove,
    HeartbeatPing,
    HeartbeatPong,
    GateRequest,
}

impl Kind {
    const ALL: [Kind; 9] = [
        Kind::SessionJoin,
        Kind::SessionLeave,
        Kind::ParticipantAnnounce,
        Kind::ContextAdd,
        Kind::ContextUpdate,
        Kind::ContextRemove,
        Kind::HeartbeatPing,
        Kind::HeartbeatPong,
        Kind::GateRequest,
    ];

    /// A context item or its correction (pvp-spec 9): what a participant says, which a full
    /// queue gives up first, and what a connection holds until the server is seen to read it.
    pub const fn is_text(self) -> bool {
        matches!(
            self,
            Kind::ContextAdd | Kind::ContextUpdate | Kind::ContextRemove
        )
    }

    pub const fn as_str(self) -> &'static str {
        match self {
            Kind::SessionJoin => "session.join",
            Kind::SessionLeave => "session.leave",
            Kind::ParticipantAnnounce => "participant.announce",
            Kind::ContextAdd => "context.add",
            Kind::ContextUpdate => "context.update",
            Kind::ContextRemove => "context.remove",
            Kind::HeartbeatPing => "heartbeat.ping",
            Kind::HeartbeatPong => "heartbeat.pong",
            Kind::GateRequest => "gate.request",
        }
    }

    pub fn parse(s: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.as_str() == s)
    }

    /// What follows the sender in an envelope of this kind, up to its payload: one append.
    const fn type_and_payload_key(self) -> &'static str {
        match self {
            Kind::SessionJoin => tail!("session.join"),
            Kind::SessionLeave => tail!("session.leave"),
            Kind::ParticipantAnnounce => tail!("participant.announce"),
            Kind::ContextAdd => tail!("context.add"),
            Kind::ContextUpdate => tail!("context.update"),
            Kind::ContextRemove => tail!("context.remove"),
            Kind::HeartbeatPing => tail!("heartbeat.ping"),
            Kind::HeartbeatPong => tail!("heartbeat.pong"),
            Kind::GateRequest => tail!("gate.request"),
        }
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl PartialEq<&str> for Kind {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

/// An envelope the gateway sends, serialized once when it is built: sinks write [`Envelope::json`]
/// as it is (a line on stdout, a WebSocket text frame) and route by sender and kind without
/// parsing. Building one costs one allocation (the JSON text); the sender is shared with its
/// speaker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope {
    id: ulid::Ulid,
    kind: Kind,
    sender: SenderId,
    json: String,
}

impl Envelope {
    pub fn id(&self) -> ulid::Ulid {
        self.id
    }

    pub fn kind(&self) -> Kind {
        self.kind
    }

    pub fn sender(&self) -> &SenderId {
        &self.sender
    }

    /// The envelope's session id as its JSON has it (escaped, without the quotes): enough to
    /// tell sessions apart without parsing. An escaped id holds no unescaped quote, so the key
    /// after it is found by its text.
    pub fn session_json(&self) -> &str {
        const KEY: &str = "\"session\":\"";
        let Some(start) = self.json.find(KEY).map(|i| i + KEY.len()) else {
            return "";
        };
        let len = self.json[start..].find("\",\"sender\":\"").unwrap_or(0);
        &self.json[start..start + len]
    }

    /// The envelope as one line of JSON (no newline).
    pub fn json(&self) -> &str {
        &self.json
    }

    pub fn into_json(self) -> String {
        self.json
    }

    /// The parsed form (for tests, gates and re-issuing; not on the hot path).
    pub fn to_message(&self) -> Message {
        serde_json::from_str(&self.json).expect("an envelope we built is valid JSON")
    }

    /// This `session.join` with the participant as a later `participant.announce` describes it
    /// (pvp-spec 7.1: a name learnt from RTCP): the join a reconnect sends again, so that a
    /// server which forgot the participant learns its current name, not the first one.
    pub fn join_as_announced(&self, announce: &Envelope) -> Envelope {
        let mut m = self.to_message();
        m.payload["participant"] = announce.to_message().payload;
        m.to_envelope().unwrap_or_else(|_| self.clone())
    }
}

/// A session id as every envelope carries it: escaped for a JSON string once, with the keys
/// around it (`","session":"ID","sender":"`), so that an envelope copies it in one append.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionText(String);

impl SessionText {
    const BEFORE: &str = "\",\"session\":\"";
    const AFTER: &str = "\",\"sender\":\"";

    pub fn new(id: impl std::fmt::Display) -> Self {
        use std::fmt::Write;
        let mut s = String::from(Self::BEFORE);
        // Writing into a String cannot fail.
        let _ = write!(Escaper(&mut s), "{id}");
        s.push_str(Self::AFTER);
        SessionText(s)
    }
}

/// Who sends an envelope: a participant id, shared by every envelope its speaker sends (one
/// `Arc`, no copy), which sinks route by. Once the speaker has a chunk to send, the same
/// allocation also holds what every `context.add` of that speaker repeats, escaped once
/// ([`SenderId::with_template`]). A flush then reads its sender's reference count, id and
/// template from one block of adjacent lines: as five blocks (the `Arc`, a boxed template and
/// its three strings) they were up to five cache misses a flush with thousands of streams
/// (docs/performance.md section 12).
#[derive(Clone)]
pub struct SenderId {
    /// The id; with a template, then the escaped id (empty when escaping changes nothing),
    /// the escaped key prefix and the escaped source.
    all: Arc<str>,
    /// End of the id in `all`.
    id: usize,
    /// Ends of the escaped id and of the key prefix, with a template.
    parts: Option<[usize; 2]>,
}

impl SenderId {
    pub fn as_str(&self) -> &str {
        &self.all[..self.id]
    }

    pub fn has_template(&self) -> bool {
        self.parts.is_some()
    }

    /// The escaped parts of this sender's `context.add`s, if [`SenderId::with_template`] made
    /// them.
    pub fn template(&self) -> Option<AddTemplate<'_>> {
        let [sender, key] = self.parts?;
        Some(AddTemplate {
            sender: if sender == self.id {
                self.as_str()
            } else {
                &self.all[self.id..sender]
            },
            key_prefix: &self.all[sender..key],
            source: &self.all[key..],
        })
    }

    /// The same id in a new allocation that also holds its `context.add` template: the item key
    /// prefix (the chunk counter follows it) and the source URI, each escaped for a JSON string.
    pub fn with_template(
        &self,
        key_prefix: impl std::fmt::Display,
        source: impl std::fmt::Display,
    ) -> SenderId {
        use std::fmt::Write;
        let id = self.as_str();
        let mut all = String::with_capacity(3 * id.len() + 64);
        all.push_str(id);
        escape_into(&mut all, id);
        if all[id.len()..] == *id {
            all.truncate(id.len());
        }
        let sender = all.len();
        // Writing into a String cannot fail.
        let _ = write!(Escaper(&mut all), "{key_prefix}");
        let key = all.len();
        let _ = write!(Escaper(&mut all), "{source}");
        SenderId {
            all: all.into(),
            id: id.len(),
            parts: Some([sender, key]),
        }
    }
}

impl From<&str> for SenderId {
    fn from(id: &str) -> Self {
        SenderId {
            all: id.into(),
            id: id.len(),
            parts: None,
        }
    }
}

/// `Arc<str>` copies a `String` into its own allocation either way.
impl From<String> for SenderId {
    fn from(id: String) -> Self {
        SenderId::from(id.as_str())
    }
}

impl std::ops::Deref for SenderId {
    type Target = str;

    fn deref(&self) -> &str {
        self.as_str()
    }
}

/// Sinks key maps by sender and look them up by `&str`.
impl std::borrow::Borrow<str> for SenderId {
    fn borrow(&self) -> &str {
        self.as_str()
    }
}

impl PartialEq for SenderId {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for SenderId {}

impl std::hash::Hash for SenderId {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_str().hash(state);
    }
}

impl std::fmt::Display for SenderId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::fmt::Debug for SenderId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self.as_str(), f)
    }
}

/// What every `context.add` of one speaker repeats, escaped for the inside of a JSON string:
/// its sender, its item key prefix and its source URI ([`SenderId::template`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AddTemplate<'a> {
    /// The sender (the participant id).
    pub sender: &'a str,
    /// `participant/stream-start-ms/`; the chunk counter follows.
    pub key_prefix: &'a str,
    pub source: &'a str,
}

/// JSON text as serde_json writes it, with U+2028 and U+2029 escaped as [`escape_into`] writes
/// them. Outside strings JSON has no such character, so each one met is in a string.
fn separators_escaped(json: String) -> String {
    if !json.contains(['\u{2028}', '\u{2029}']) {
        return json;
    }
    json.replace('\u{2028}', "\\u2028")
        .replace('\u{2029}', "\\u2029")
}

/// Appends `s` as a JSON string (RFC 8259 section 7: quote, backslash and C0 controls escaped,
/// and U+2028 and U+2029, which some NDJSON readers take for line ends).
pub fn push_json_str(out: &mut String, s: &str) {
    out.push('"');
    escape_into(out, s);
    out.push('"');
}

struct Escaper<'a>(&'a mut String);

impl std::fmt::Write for Escaper<'_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        escape_into(self.0, s);
        Ok(())
    }
}

/// The first byte of U+2028 and U+2029 (E2 80 A8, E2 80 A9), and of many other characters.
const SEPARATOR_LEAD: u8 = 0xe2;

/// Bytes that need an escape in a JSON string: quote, backslash, C0 controls; and bytes that
/// may begin U+2028 or U+2029, which [`escape_into`] looks at further.
const fn needs_escape(b: u8) -> bool {
    b < 0x20 || b == b'"' || b == b'\\' || b == SEPARATOR_LEAD
}

/// The first byte at or after `from` that needs an escape. Eight bytes at a time while none
/// does (SWAR: a word has a byte below 0x20 iff `(x - 0x20..) & !x & 0x80..` is non-zero, and
/// a byte equal to `c` iff `x ^ c..` has a zero byte), then byte by byte.
fn next_escape(bytes: &[u8], from: usize) -> Option<usize> {
    const LO: u64 = u64::from_ne_bytes([0x01; 8]);
    const HI: u64 = u64::from_ne_bytes([0x80; 8]);
    // The three tests' flags are combined before the one branch a word.
    let below = |x: u64, n: u8| x.wrapping_sub(LO * u64::from(n)) & !x;
    let mut i = from;
    for w in bytes[from..].chunks_exact(8) {
        // A failed conversion (impossible: chunks are 8 bytes) reads as "needs a look".
        let x = u64::from_ne_bytes(<[u8; 8]>::try_from(w).unwrap_or([0; 8]));
        let quote = x ^ (LO * u64::from(b'"'));
        let backslash = x ^ (LO * u64::from(b'\\'));
        let lead = x ^ (LO * u64::from(SEPARATOR_LEAD));
        if (below(x, 0x20) | below(quote, 1) | below(backslash, 1) | below(lead, 1)) & HI != 0 {
            break;
        }
        i += 8;
    }
    bytes[i..]
        .iter()
        .position(|&b| needs_escape(b))
        .map(|p| i + p)
}

/// Writes `s` escaped for the inside of a JSON string. U+2028 LINE SEPARATOR and U+2029
/// PARAGRAPH SEPARATOR are escaped too (`\u2028`, `\u2029`): valid raw in JSON (RFC 8259
/// section 7), but readers of NDJSON that end lines there as well (Node's `readline`, Python's
/// `str.splitlines`) would cut the envelope's line in two (pvp-spec 19.4: one a line).
fn escape_into(out: &mut String, s: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let bytes = s.as_bytes();
    let mut start = 0;
    let mut i = 0;
    while i < bytes.len() {
        // Most text needs no escape: find the next byte that does, then copy the run at once.
        let Some(at) = next_escape(bytes, i) else {
            break;
        };
        i = at;
        let b = bytes[i];
        if b == SEPARATOR_LEAD {
            let escaped = match bytes.get(i + 1..i + 3) {
                Some([0x80, 0xa8]) => "\\u2028",
                Some([0x80, 0xa9]) => "\\u2029",
                // Another character (an en dash, a curly quote): as it is.
                _ => {
                    i += 1;
                    continue;
                }
            };
            out.push_str(&s[start..i]);
            out.push_str(escaped);
            i += 3;
            start = i;
            continue;
        }
        out.push_str(&s[start..i]);
        match b {
            b'"' => out.push_str("\\\""),
            b'\\' => out.push_str("\\\\"),
            b'\n' => out.push_str("\\n"),
            b'\r' => out.push_str("\\r"),
            b'\t' => out.push_str("\\t"),
            0x08 => out.push_str("\\b"),
            0x0c => out.push_str("\\f"),
            _ => {
                out.push_str("\\u00");
                out.push(char::from(HEX[usize::from(b >> 4)]));
                out.push(char::from(HEX[usize::from(b & 0xf)]));
            }
        }
        i += 1;
        start = i;
    }
    out.push_str(&s[start..]);
}

/// Monotonic ULID source (pvp-spec 5.1): time from the value passed in, the random part from a
/// seed the shell supplies, incremented within one millisecond so ids sort in emission order.
#[derive(Debug, Clone)]
pub struct IdGen {
    last_ms: u64,
    rand: u128,
}

const RAND_MASK: u128 = (1 << 80) - 1;

const ULID_MAX_MS: u64 = (1 << 48) - 1;

impl IdGen {
    pub fn new(seed: u128) -> Self {
        IdGen {
            last_ms: 0,
            rand: splitmix(seed) & RAND_MASK,
        }
    }

    pub fn next(&mut self, now: Time) -> ulid::Ulid {
        // A ULID holds 48 bits of milliseconds (to the year 10889): a later time keeps the
        // last, so ids stay ordered rather than wrap to 1970.
        let ms = now.as_millis().min(ULID_MAX_MS).max(self.last_ms);
        if ms == self.last_ms {
            self.rand = (self.rand + 1) & RAND_MASK;
        } else {
            self.last_ms = ms;
            self.rand = splitmix(self.rand ^ u128::from(ms)) & (RAND_MASK >> 1);
        }
        ulid::Ulid::from_parts(ms, self.rand)
    }
}

/// SplitMix64 over a 128-bit word: a well-mixed value from any input (ULID randomness, and the
/// PVP connections' reconnect jitter).
pub(crate) fn splitmix(x: u128) -> u128 {
    let mut z = (x as u64 ^ (x >> 64) as u64).wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut out = 0u128;
    for _ in 0..2 {
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        out = (out << 64) | u128::from(z);
        z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    }
    out
}

/// What a virtual participant announces about itself (pvp-spec 7.1).
#[derive(Debug, Clone, PartialEq)]
pub struct Participant {
    pub id: String,
    pub name: String,
    pub roles: Vec<String>,
    pub metadata: Metadata,
}

/// A participant's `metadata` object (pvp-spec 7.1) of string values, written once as JSON in
/// serde_json's map order (keys ascending): a join then copies it, rather than building and
/// serializing a `serde_json::Value` map (most of a join's cost, and 10,000 streams starting
/// together join 10,000 times).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Metadata {
    json: String,
    last_key: &'static str,
}

impl Default for Metadata {
    fn default() -> Self {
        // Room for the gateway's fields without regrowing.
        let mut json = String::with_capacity(160);
        json.push('{');
        Metadata { json, last_key: "" }
    }
}

impl Metadata {
    /// Adds `key: value`. Keys must come in ascending order, as serde_json writes them.
    pub fn field(mut self, key: &'static str, value: impl std::fmt::Display) -> Self {
        debug_assert!(
            key > self.last_key,
            "metadata key {key} after {}",
            self.last_key
        );
        self.last_key = key;
        if self.json.len() > 1 {
            self.json.push(',');
        }
        push_json_str(&mut self.json, key);
        self.json.push_str(":\"");
        use std::fmt::Write;
        // Escaping writer: writing to a String cannot fail.
        let _ = write!(Escaper(&mut self.json), "{value}");
        self.json.push('"');
        self
    }

    fn write_to(&self, out: &mut String) {
        out.push_str(&self.json);
        out.push('}');
    }
}

/// An envelope's sender as given, or already escaped (a speaker's template).
#[derive(Clone, Copy)]
enum Sender<'a> {
    Raw(&'a str),
    Escaped(&'a str),
}

/// Builds the envelopes of one PVP session.
#[derive(Debug, Clone)]
pub struct Builder {
    /// The session envelopes are built in (a mapping rule may swap it).
    pub session: SessionText,
    pub token: Option<String>,
    ids: IdGen,
    stamp: Stamp,
}

/// The end of a `context.add`: its tags, the flush cause among them, and the closing braces.
const fn tags_to_end(cause: crate::chunker::FlushCause) -> &'static str {
    use crate::chunker::FlushCause;
    macro_rules! tags {
        ($cause:literal) => {
            concat!(
                "\",\"tags\":[\"t140\",\"transcript\",\"flush:",
                $cause,
                "\"]}}"
            )
        };
    }
    match cause {
        FlushCause::Sentence => tags!("sentence"),
        FlushCause::Idle => tags!("idle"),
        FlushCause::Size => tags!("size"),
        FlushCause::End => tags!("end"),
    }
}

/// Crockford's base32 as ULIDs are written (the `ulid` crate's alphabet).
const BASE32: &[u8; 32] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";
const STAMP_HEAD: &[u8] = b"{\"v\":1,\"id\":\"";
const STAMP_TS_KEY: &[u8] = b"\",\"ts\":\"";
const STAMP_ID: usize = STAMP_HEAD.len();
const STAMP_TS: usize = STAMP_ID + ulid::ULID_LEN + STAMP_TS_KEY.len();
const STAMP_LEN: usize = STAMP_TS + 24;

/// How every envelope starts, `{"v":1,"id":"ULID","ts":"TIME`, kept as text and rewritten in
/// place: the id's first ten characters (its millisecond) only when they change, its last
/// sixteen (the random part) each time, the time as [`crate::time::Iso8601Cache`] writes it.
/// An envelope then copies it in one append, where it took five appends and a whole ULID
/// encoding with its UTF-8 check (docs/performance.md section 20).
#[derive(Debug, Clone)]
struct Stamp {
    text: [u8; STAMP_LEN],
    /// The millisecond the id's first ten characters hold.
    id_ms: Option<u64>,
    ts: crate::time::Iso8601Cache,
}

impl Default for Stamp {
    fn default() -> Self {
        let mut text = [b'0'; STAMP_LEN];
        text[..STAMP_ID].copy_from_slice(STAMP_HEAD);
        text[STAMP_TS - STAMP_TS_KEY.len()..STAMP_TS].copy_from_slice(STAMP_TS_KEY);
        Stamp {
            text,
            id_ms: None,
            ts: Default::default(),
        }
    }
}

impl Stamp {
    #[inline]
    fn render(&mut self, id: ulid::Ulid, now: Time) -> &str {
        let ms = id.timestamp_ms();
        let (time, random) = self.text[STAMP_ID..STAMP_ID + ulid::ULID_LEN].split_at_mut(10);
        if self.id_ms != Some(ms) {
            self.id_ms = Some(ms);
            put_base32(time, ms);
        }
        // 80 bits: the last twelve characters take the low 60, the first four the rest.
        let r = id.random();
        let (high, low) = random.split_at_mut(4);
        put_base32(high, (r >> 60) as u64);
        put_base32(low, r as u64);
        self.text[STAMP_TS..].copy_from_slice(self.ts.bytes(now));
        // Only ASCII is ever written into it.
        std::str::from_utf8(&self.text).unwrap_or_default()
    }
}

/// Writes the low `5 * out.len()` bits of `v` into `out` in base32, most significant first.
#[inline]
fn put_base32(out: &mut [u8], mut v: u64) {
    for c in out.iter_mut().rev() {
        *c = BASE32[(v & 31) as usize];
        v >>= 5;
    }
}

impl Builder {
    pub fn new(session: String, token: Option<String>, seed: u128) -> Self {
        Builder {
            session: SessionText::new(session),
            token,
            ids: IdGen::new(seed),
            stamp: Stamp::default(),
        }
    }

    /// Writes the envelope up to and including `"payload":`; the caller appends the payload and
    /// calls [`Builder::finish`]. Field order is pvp-spec 4.1's.
    fn begin(
        &mut self,
        now: Time,
        sender: &str,
        kind: Kind,
        capacity: usize,
    ) -> (ulid::Ulid, String) {
        self.begin_as(
            now,
            Sender::Raw(sender),
            kind.type_and_payload_key(),
            capacity,
        )
    }

    /// [`Builder::begin`] with what follows the sender given as text (`tail`).
    fn begin_as(
        &mut self,
        now: Time,
        sender: Sender<'_>,
        tail: &str,
        capacity: usize,
    ) -> (ulid::Ulid, String) {
        let id = self.ids.next(now);
        // Never before the id's time, which never goes back: an envelope made late for an
        // earlier moment (an idle flush a gap held back) is dated when it is made, so one
        // sender's timestamps, like its ids, follow the order it sends in (pvp-spec 4.2, 19.5).
        let now = now.max(Time::from_millis(id.timestamp_ms()));
        let sender_len = match sender {
            Sender::Raw(s) | Sender::Escaped(s) => s.len(),
        };
        let mut out = String::with_capacity(capacity + 160 + self.session.0.len() + sender_len);
        out.push_str(self.stamp.render(id, now));
        out.push_str(&self.session.0);
        match sender {
            Sender::Raw(s) => escape_into(&mut out, s),
            Sender::Escaped(s) => out.push_str(s),
        }
        out.push_str(tail);
        (id, out)
    }

    fn finish(id: ulid::Ulid, kind: Kind, sender: SenderId, mut json: String) -> Envelope {
        json.push('}');
        Envelope {
            id,
            kind,
            sender,
            json,
        }
    }

    /// An envelope with any payload (the less frequent kinds).
    pub fn envelope(
        &mut self,
        now: Time,
        sender: SenderId,
        kind: Kind,
        payload: &Value,
    ) -> Envelope {
        self.envelope_ref(now, sender, kind, payload, None)
    }

    fn envelope_ref(
        &mut self,
        now: Time,
        sender: SenderId,
        kind: Kind,
        payload: &Value,
        reference: Option<&str>,
    ) -> Envelope {
        let payload = serde_json::to_string(payload).unwrap_or_else(|_| "{}".into());
        let payload = separators_escaped(payload);
        let (id, mut out) = self.begin(now, &sender, kind, payload.len());
        out.push_str(&payload);
        if let Some(r) = reference {
            out.push_str(",\"ref\":");
            push_json_str(&mut out, r);
        }
        Self::finish(id, kind, sender, out)
    }

    /// The same message with a fresh id and timestamp (a join sent again after a reconnect).
    pub fn reissue(&mut self, now: Time, e: &Envelope) -> Envelope {
        let mut m = e.to_message();
        let id = self.ids.next(now);
        m.id = id.to_string();
        // Dated no earlier than its id, as every envelope (`Builder::begin_as`).
        m.ts = now.max(Time::from_millis(id.timestamp_ms())).to_iso8601();
        m.to_envelope().unwrap_or_else(|_| e.clone())
    }

    /// pvp-spec 6.3 `session.join` carrying the 7.1 announcement: a T.140 stream is a human.
    /// Written straight into its JSON text, as serde_json would write it (keys sorted): every
    /// new stream joins, and a flood of new streams should not cost a JSON tree each.
    pub fn join(&mut self, now: Time, sender: SenderId, p: &Participant) -> Envelope {
        let capacity = 288 + p.id.len() + p.name.len();
        let (id, mut out) = self.begin(now, &sender, Kind::SessionJoin, capacity);
        out.push_str("{\"participant\":");
        write_announce(&mut out, p);
        out.push_str(",\"supported_versions\":[1]");
        if let Some(t) = &self.token {
            out.push_str(",\"token\":");
            push_json_str(&mut out, t);
        }
        out.push('}');
        Self::finish(id, Kind::SessionJoin, sender, out)
    }

    /// pvp-spec 7.1 `participant.announce`, sent again when what we know of a participant changes.
    pub fn announce(&mut self, now: Time, sender: SenderId, p: &Participant) -> Envelope {
        let capacity = 224 + p.id.len() + p.name.len();
        let (id, mut out) = self.begin(now, &sender, Kind::ParticipantAnnounce, capacity);
        write_announce(&mut out, p);
        Self::finish(id, Kind::ParticipantAnnounce, sender, out)
    }

    /// pvp-spec 9.1 `context.add` of one transcript chunk: the hot output, written straight into
    /// its JSON text (one allocation). The speaker's key prefix and source were escaped once,
    /// into the sender's template ([`SenderId::with_template`]); the key is the prefix followed
    /// by `n`. `None` for a sender without a template.
    pub fn context_add(
        &mut self,
        now: Time,
        sender: &SenderId,
        n: u64,
        text: &str,
        cause: crate::chunker::FlushCause,
    ) -> Option<Envelope> {
        let template = sender.template()?;
        let capacity = sender.all.len() + text.len() + 128;
        let escaped = Sender::Escaped(template.sender);
        // Keys in sorted order, as serde_json writes a map.
        let (id, mut out) = self.begin_as(
            now,
            escaped,
            concat!(tail!("context.add"), "{\"content\":\""),
            capacity,
        );
        escape_into(&mut out, text);
        out.push_str("\",\"content_type\":\"audio_transcript\",\"key\":\"");
        out.push_str(template.key_prefix);
        out.push_str(itoa::Buffer::new().format(n));
        out.push_str("\",\"source\":\"");
        out.push_str(template.source);
        out.push_str(tags_to_end(cause));
        Some(Envelope {
            id,
            kind: Kind::ContextAdd,
            sender: sender.clone(),
            json: out,
        })
    }

    /// pvp-spec 9.3 `context.update` replacing an item's content.
    pub fn context_update(
        &mut self,
        now: Time,
        sender: SenderId,
        key: &str,
        content: &str,
        reason: &str,
    ) -> Envelope {
        let payload = json!({ "key": key, "new_content": content, "reason": reason });
        self.envelope(now, sender, Kind::ContextUpdate, &payload)
    }

    /// pvp-spec 9.3 `context.remove`.
    pub fn context_remove(
        &mut self,
        now: Time,
        sender: SenderId,
        key: &str,
        reason: &str,
    ) -> Envelope {
        let payload = json!({ "key": key, "reason": reason });
        self.envelope(now, sender, Kind::ContextRemove, &payload)
    }

    /// pvp-spec 6.4 `session.leave`.
    pub fn leave(&mut self, now: Time, sender: SenderId, reason: &str) -> Envelope {
        self.envelope(
            now,
            sender,
            Kind::SessionLeave,
            &json!({ "reason": reason }),
        )
    }

    /// pvp-spec 8.1 heartbeat (both payloads are empty objects).
    pub fn heartbeat(&mut self, now: Time, sender: SenderId, pong_to: Option<&str>) -> Envelope {
        let kind = if pong_to.is_some() {
            Kind::HeartbeatPong
        } else {
            Kind::HeartbeatPing
        };
        self.envelope_ref(now, sender, kind, &json!({}), pong_to)
    }
}

/// The pvp-spec 7.1 announcement of a T.140 participant (a human), keys in serde_json's order.
/// It claims the `add_context` capability (7.3), the one thing it does: adding context is no
/// right of any role in the 7.2 table, the implementation guide's router requires the
/// capability for `context.add`, and the reference server takes it or the driver or navigator
/// role, so a participant with `--role observer` (or approver, admin, adversary) announced
/// without it had every chunk refused.
fn write_announce(out: &mut String, p: &Participant) {
    out.push_str("{\"capabilities\":[\"add_context\"],\"id\":");
    push_json_str(out, &p.id);
    out.push_str(",\"metadata\":");
    p.metadata.write_to(out);
    out.push_str(",\"name\":");
    push_json_str(out, &p.name);
    out.push_str(",\"roles\":[");
    // Each role once: `--role driver --role driver` (or a rule's list) names it twice.
    for (i, r) in p.roles.iter().enumerate() {
        if p.roles[..i].contains(r) {
            continue;
        }
        if i > 0 {
            out.push(',');
        }
        push_json_str(out, r);
    }
    out.push_str("],\"transport\":\"t140\",\"type\":\"human\"}");
}

/// pvp-spec 17 `error` payload, as read from a server.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct ErrorPayload {
    pub code: String,
    pub message: String,
    #[serde(default)]
    pub recoverable: bool,
    #[serde(default)]
    pub related_to: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chunker::FlushCause;

    #[test]
    fn ids_are_valid_monotonic_ulids() {
        let mut g = IdGen::new(7);
        let t = Time::from_millis(1_700_000_000_000);
        let ids: Vec<String> = (0..100)
            .map(|i| {
                g.next(Time::from_millis(t.as_millis() + i / 10))
                    .to_string()
            })
            .collect();
        for w in ids.windows(2) {
            assert!(w[0] < w[1], "{} !< {}", w[0], w[1]);
        }
        for id in &ids {
            let u: ulid::Ulid = id.parse().unwrap();
            assert!(u.timestamp_ms() >= 1_700_000_000_000);
        }
        // A clock that steps back does not break ordering.
        let a = g.next(Time::from_millis(1_800_000_000_000));
        let b = g.next(Time::from_millis(1_000));
        assert!(a < b);
    }

    /// The stamp rewritten in place writes what a whole encoding writes: within a millisecond,
    /// across milliseconds, minutes and days, and with a clock that steps back.
    #[test]
    fn the_stamp_writes_each_envelopes_id_and_time() {
        let mut g = IdGen::new(11);
        let mut stamp = Stamp::default();
        let base = 1_700_000_000_000u64;
        let times = [0, 0, 0, 1, 999, 1_000, 59_999, 60_000, 86_400_000, 5];
        for (i, &dt) in times.iter().enumerate() {
            let now = Time::from_millis(base + dt).plus_us(i as u64 * 7);
            let id = g.next(now);
            let want = format!("{{\"v\":1,\"id\":\"{id}\",\"ts\":\"{}", now.to_iso8601());
            assert_eq!(stamp.render(id, now), want, "time {i}");
        }
    }

    /// The literals written whole stay what the kind and cause names would give.
    #[test]
    fn the_literal_tails_spell_each_kind_and_cause() {
        for k in Kind::ALL {
            let want = format!("\",\"type\":\"{}\",\"payload\":", k.as_str());
            assert_eq!(k.type_and_payload_key(), want);
        }
        for c in crate::chunker::FlushCause::ALL {
            let want = format!(
                "\",\"tags\":[\"t140\",\"transcript\",\"flush:{}\"]}}}}",
                c.as_str()
            );
            assert_eq!(tags_to_end(c), want);
        }
        let s = SessionText::new("a\"b");
        assert_eq!(s.0, "\",\"session\":\"a\\\"b\",\"sender\":\"");
    }

    #[test]
    fn join_envelope_has_spec_shape() {
        let mut b = Builder::new("sess".into(), Some("tok".into()), 1);
        let p = Participant {
            id: "t140:00000001@127.0.0.1:5000".into(),
            name: "n".into(),
            roles: vec!["navigator".into()],
            metadata: Metadata::default(),
        };
        let e = b.join(Time::from_millis(1_000), p.id.as_str().into(), &p);
        let v: Value = serde_json::from_str(e.json()).unwrap();
        assert_eq!(v["v"], 1);
        assert_eq!(v["type"], "session.join");
        assert_eq!(v["sender"], p.id.as_str());
        assert_eq!(v["ts"], "1970-01-01T00:00:01.000Z");
        assert_eq!(v["payload"]["participant"]["transport"], "t140");
        assert_eq!(v["payload"]["participant"]["type"], "human");
        assert_eq!(v["payload"]["supported_versions"], json!([1]));
        assert_eq!(v["payload"]["token"], "tok");
        assert!(v.get("ref").is_none());
        let back: Message = serde_json::from_value(v).unwrap();
        assert_eq!(back.to_envelope().unwrap(), e);
        assert_eq!(back.id, e.id().to_string());
    }

    /// A role given twice (`--role driver --role driver`) is named once in the join.
    #[test]
    fn a_role_given_twice_is_named_once() {
        let mut b = Builder::new("s".into(), None, 1);
        let p = Participant {
            id: "t140:1@127.0.0.1:5".into(),
            name: "n".into(),
            roles: ["driver", "navigator", "driver", "navigator"]
                .map(String::from)
                .to_vec(),
            metadata: Metadata::default(),
        };
        let e = b.join(Time::from_millis(1_000), p.id.as_str().into(), &p);
        let v: Value = serde_json::from_str(e.json()).unwrap();
        assert_eq!(
            v["payload"]["participant"]["roles"],
            json!(["driver", "navigator"])
        );
    }

    /// The hand-written join and announce are exactly what serde_json makes of the same JSON.
    #[test]
    fn join_and_announce_equal_serde_json() {
        let hostile = "q\"b\\s\u{1}\n é 日 \u{2028}";
        let p = Participant {
            id: format!("t140:1@[::1]:5/{hostile}"),
            name: hostile.into(),
            roles: vec!["navigator".into(), hostile.into()],
            metadata: Metadata::default()
                .field("csrc", hostile)
                .field("gateway", "pvp-t140/0")
                .field("source", "[::1]:5")
                .field("ssrc", format_args!("{:08x}", 1))
                .field("stream_id", hostile),
        };
        let announce = json!({
            "capabilities": ["add_context"],
            "id": p.id,
            "name": p.name,
            "type": "human",
            "roles": p.roles,
            "transport": "t140",
            "metadata": {"ssrc": "00000001", "source": "[::1]:5", "csrc": hostile,
                "gateway": "pvp-t140/0", "stream_id": hostile},
        });
        for (token, roles) in [(None, 2), (Some(hostile), 0), (Some("tok"), 1)] {
            let p = Participant {
                roles: p.roles[..roles].to_vec(),
                ..p.clone()
            };
            let mut announce = announce.clone();
            announce["roles"] = json!(p.roles);
            let mut b = Builder::new("s".into(), token.map(str::to_owned), 1);
            let now = Time::from_millis(1_000);
            let e = b.join(now, p.id.as_str().into(), &p);
            let mut payload = json!({"participant": announce, "supported_versions": [1]});
            if let Some(t) = token {
                payload["token"] = json!(t);
            }
            let m = e.to_message();
            assert_eq!(m.payload, payload);
            assert_eq!(e.json(), m.to_json());
            let e = b.announce(now, p.id.as_str().into(), &p);
            let m = e.to_message();
            assert_eq!(m.payload, announce);
            assert_eq!(e.json(), m.to_json());
        }
    }

    /// The hand-written context.add must be exactly what serde_json makes of the same message,
    /// for any text: every C0 control, quotes, backslashes, non-ASCII, and hostile participant
    /// ids (a t140llm stream id or a mapping rule can put anything there).
    #[test]
    fn the_word_scan_finds_the_same_escapes_as_a_byte_scan() {
        for b in 0..=255u8 {
            for len in [1, 7, 8, 9, 16, 23] {
                for at in 0..len {
                    let mut v = vec![b'a'; len];
                    v[at] = b;
                    v[len - 1] = if at == len - 1 { b } else { 0xc3 };
                    for from in 0..len {
                        let slow = v[from..]
                            .iter()
                            .position(|&c| needs_escape(c))
                            .map(|p| from + p);
                        assert_eq!(
                            next_escape(&v, from),
                            slow,
                            "byte {b:#x} at {at} of {len} from {from}"
                        );
                    }
                }
            }
        }
    }

    /// Found by review ax (session 46): U+2028 and U+2029 are escaped wherever they fall in the
    /// 8-byte scan, and nothing else that starts with their lead byte (an en dash, a curly
    /// quote, a lone separator's start cut off at the end of nothing) is: the text otherwise is
    /// what serde_json writes, and reads back the same.
    #[test]
    fn line_and_paragraph_separators_are_escaped_at_every_alignment() {
        for pad in 0..17 {
            for c in [
                '\u{2028}', '\u{2029}', '\u{2013}', '\u{201c}', '\u{20ac}', '\u{2a00}',
            ] {
                let s = format!("{}{c}x{c}\"{c}", "a".repeat(pad));
                let mut ours = String::new();
                push_json_str(&mut ours, &s);
                let want = serde_json::to_string(&s)
                    .unwrap()
                    .replace('\u{2028}', "\\u2028")
                    .replace('\u{2029}', "\\u2029");
                assert_eq!(ours, want, "pad {pad}, {c:?}");
                assert_eq!(serde_json::from_str::<String>(&ours).unwrap(), s);
            }
        }
    }

    #[test]
    fn context_add_text_equals_serde_json_for_any_content() {
        let mut text: String = (0u8..0x20).map(char::from).collect();
        text.push_str("\"quoted\" back\\slash \u{7f} café — 日本 \u{2028} \u{fffd} 🎉");
        let mut b = Builder::new("s\"ess\n".into(), None, 3);
        let sender: SenderId = "t140:1@[::1]:5/\"evil\\\u{1}".into();
        let now = Time::from_micros(1_700_000_000_123_456);
        // No template yet: no context.add.
        assert!(
            b.context_add(now, &sender, 2, &text, FlushCause::Sentence)
                .is_none()
        );
        let sender = sender.with_template(format_args!("{sender}/1/"), "rtp://x?\"");
        let e = b
            .context_add(now, &sender, 2, &text, FlushCause::Sentence)
            .expect("a sender with a template");
        let m: Message = serde_json::from_str(e.json()).expect("valid JSON");
        let expected = Message {
            v: 1,
            id: e.id().to_string(),
            ts: "2023-11-14T22:13:20.123Z".into(),
            session: "s\"ess\n".into(),
            sender: sender.to_string(),
            kind: "context.add".into(),
            payload: json!({
                "key": format!("{sender}/1/2"),
                "content_type": "audio_transcript",
                "content": text,
                "source": "rtp://x?\"",
                "tags": ["t140", "transcript", "flush:sentence"],
            }),
            reference: None,
        };
        assert_eq!(m, expected);
        // Byte for byte what serde_json writes (same field order, same escapes).
        assert_eq!(e.json(), expected.to_json());
        assert_eq!(e.kind(), Kind::ContextAdd);
        assert_eq!(&**e.sender(), &*sender);
    }

    /// The template travels in the id's allocation but is not part of the id: equality, hash,
    /// display and map lookups by `&str` see the id alone.
    #[test]
    fn sender_id_with_template_is_the_same_id() {
        use std::collections::HashMap;
        for id in ["t140:deadbeef@10.0.0.1:5004", "odd \"id\"\n"] {
            let plain = SenderId::from(id);
            assert!(plain.template().is_none());
            let full = plain.with_template(format_args!("{id}/7/"), "rtp://10.0.0.1:5004");
            assert_eq!(full, plain);
            assert_eq!(full.as_str(), id);
            assert_eq!(full.to_string(), id);
            assert_eq!(format!("{full:?}"), format!("{id:?}"));
            let t = full.template().expect("template");
            let escaped = |v: &str| {
                let mut s = String::new();
                escape_into(&mut s, v);
                s
            };
            assert_eq!(t.sender, escaped(id));
            assert_eq!(t.key_prefix, escaped(&format!("{id}/7/")));
            assert_eq!(t.source, "rtp://10.0.0.1:5004");
            let mut map = HashMap::new();
            map.insert(plain.clone(), 1);
            assert_eq!(map.get(id), Some(&1));
            assert_eq!(map.get(&full), Some(&1));
            // A template made again from a templated id is the same.
            let again = full.with_template(format_args!("{id}/7/"), "rtp://10.0.0.1:5004");
            assert_eq!(again.template(), full.template());
        }
    }

    /// pvp-spec 4.2 / 19.5, and the rule `Builder::begin_as` keeps for every other envelope:
    /// an envelope is never dated before its id's time, which never goes back, so one
    /// sender's `ts`, like its ids, follow the order it sends in. `Builder::reissue` (the join a
    /// participant's connection sends again after a reconnect, `sink/ws.rs`) takes its id from
    /// the same `IdGen` but writes `now` as it is: after the wall clock stepped back (an NTP
    /// step), the rejoin's ULID says 5 s and its `ts` 4 s, a second before the ping the same
    /// connection sent earlier.
    #[test]
    fn a_reissued_join_is_not_dated_before_its_id_or_the_envelope_before_it() {
        let mut b = Builder::new("s".into(), None, 1);
        let p = Participant {
            id: "p".into(),
            name: "p".into(),
            roles: vec!["navigator".into()],
            metadata: Metadata::default(),
        };
        let join = b.join(Time::from_millis(1_000), "p".into(), &p);
        let ping = b.heartbeat(Time::from_millis(5_000), "p".into(), None);
        // The clock steps back a second before the reconnect.
        let again = b.reissue(Time::from_millis(4_000), &join);
        let (ping, again) = (ping.to_message(), again.to_message());
        let id_ms = ulid::Ulid::from_string(&again.id).unwrap().timestamp_ms();
        let id_time = Time::from_millis(id_ms).to_iso8601();
        assert!(
            again.ts >= ping.ts && again.ts >= id_time,
            "rejoin ts {} (id's time {id_time}) after a ping dated {}",
            again.ts,
            ping.ts
        );
    }

    #[test]
    fn pong_carries_ref_and_kinds_round_trip() {
        let mut b = Builder::new("s".into(), None, 1);
        let e = b.heartbeat(Time(0), "p".into(), Some("01ARZ3NDEKTSV4RRFFQ69G5FAV"));
        let m = e.to_message();
        assert_eq!(m.kind, "heartbeat.pong");
        assert_eq!(m.reference.as_deref(), Some("01ARZ3NDEKTSV4RRFFQ69G5FAV"));
        assert_eq!(m.payload, json!({}));
        for k in Kind::ALL {
            assert_eq!(Kind::parse(k.as_str()), Some(k));
        }
        assert_eq!(Kind::parse("error"), None);
    }
}
