//! PVP envelopes (pvp-spec sections 4-9, 17) the gateway emits and reads. Building them is plain
//! data in, data out: ids and timestamps come from the time value passed in, so a replay yields
//! the same envelopes (but for the random part of the ULIDs) every run.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::time::Time;

/// pvp-spec 4.1 message envelope.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Envelope {
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

impl Envelope {
    pub fn to_json(&self) -> String {
        // Serializing a struct of strings and a Value cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// Monotonic ULID source (pvp-spec 5.1): time from the value passed in, the random part from a
/// seed the shell supplies, incremented within one millisecond so ids sort in emission order.
#[derive(Debug, Clone)]
pub struct IdGen {
    last_ms: u64,
    rand: u128,
}

const RAND_MASK: u128 = (1 << 80) - 1;

impl IdGen {
    pub fn new(seed: u128) -> Self {
        IdGen {
            last_ms: 0,
            rand: splitmix(seed) & RAND_MASK,
        }
    }

    pub fn next(&mut self, now: Time) -> String {
        let ms = now.as_millis().max(self.last_ms);
        if ms == self.last_ms {
            self.rand = (self.rand + 1) & RAND_MASK;
        } else {
            self.last_ms = ms;
            self.rand = splitmix(self.rand ^ u128::from(ms)) & (RAND_MASK >> 1);
        }
        ulid::Ulid::from_parts(ms, self.rand).to_string()
    }
}

fn splitmix(x: u128) -> u128 {
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
    pub metadata: Value,
}

/// Builds the envelopes of one PVP session.
#[derive(Debug, Clone)]
pub struct Builder {
    pub session: String,
    pub token: Option<String>,
    ids: IdGen,
}

impl Builder {
    pub fn new(session: String, token: Option<String>, seed: u128) -> Self {
        Builder {
            session,
            token,
            ids: IdGen::new(seed),
        }
    }

    pub fn envelope(&mut self, now: Time, sender: &str, kind: &str, payload: Value) -> Envelope {
        Envelope {
            v: 1,
            id: self.ids.next(now),
            ts: now.to_iso8601(),
            session: self.session.clone(),
            sender: sender.to_owned(),
            kind: kind.to_owned(),
            payload,
            reference: None,
        }
    }

    /// pvp-spec 6.3 `session.join` carrying the 7.1 announcement: a T.140 stream is a human.
    pub fn join(&mut self, now: Time, p: &Participant) -> Envelope {
        let mut payload = json!({
            "participant": announce(p),
            "supported_versions": [1],
        });
        if let Some(t) = &self.token {
            payload["token"] = Value::String(t.clone());
        }
        self.envelope(now, &p.id, "session.join", payload)
    }

    /// pvp-spec 7.1 `participant.announce`, sent again when what we know of a participant changes.
    pub fn announce(&mut self, now: Time, p: &Participant) -> Envelope {
        self.envelope(now, &p.id, "participant.announce", announce(p))
    }

    /// pvp-spec 9.1 `context.add` of one transcript chunk.
    pub fn context_add(
        &mut self,
        now: Time,
        sender: &str,
        key: String,
        text: String,
        source: String,
        cause: &str,
    ) -> Envelope {
        let payload = json!({
            "key": key,
            "content_type": "audio_transcript",
            // Moved in, not serialised again: the chunk text is copied once per flush, not twice.
            "content": Value::String(text),
            "source": source,
            "tags": ["t140", "transcript", format!("flush:{cause}")],
        });
        self.envelope(now, sender, "context.add", payload)
    }

    /// pvp-spec 9.3 `context.update` replacing an item's content.
    pub fn context_update(
        &mut self,
        now: Time,
        sender: &str,
        key: &str,
        content: &str,
        reason: &str,
    ) -> Envelope {
        let payload = json!({ "key": key, "new_content": content, "reason": reason });
        self.envelope(now, sender, "context.update", payload)
    }

    /// pvp-spec 9.3 `context.remove`.
    pub fn context_remove(&mut self, now: Time, sender: &str, key: &str, reason: &str) -> Envelope {
        self.envelope(
            now,
            sender,
            "context.remove",
            json!({ "key": key, "reason": reason }),
        )
    }

    /// pvp-spec 6.4 `session.leave`.
    pub fn leave(&mut self, now: Time, sender: &str, reason: &str) -> Envelope {
        self.envelope(now, sender, "session.leave", json!({ "reason": reason }))
    }

    /// pvp-spec 8.1 heartbeat (both payloads are empty objects).
    pub fn heartbeat(&mut self, now: Time, sender: &str, pong_to: Option<&str>) -> Envelope {
        let kind = if pong_to.is_some() {
            "heartbeat.pong"
        } else {
            "heartbeat.ping"
        };
        let mut e = self.envelope(now, sender, kind, json!({}));
        e.reference = pong_to.map(str::to_owned);
        e
    }
}

fn announce(p: &Participant) -> Value {
    json!({
        "id": p.id,
        "name": p.name,
        "type": "human",
        "roles": p.roles,
        "transport": "t140",
        "metadata": p.metadata,
    })
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

    #[test]
    fn ids_are_valid_monotonic_ulids() {
        let mut g = IdGen::new(7);
        let t = Time::from_millis(1_700_000_000_000);
        let ids: Vec<String> = (0..100)
            .map(|i| g.next(Time::from_millis(t.as_millis() + i / 10)))
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

    #[test]
    fn join_envelope_has_spec_shape() {
        let mut b = Builder::new("sess".into(), Some("tok".into()), 1);
        let p = Participant {
            id: "t140:00000001@127.0.0.1:5000".into(),
            name: "n".into(),
            roles: vec!["navigator".into()],
            metadata: json!({}),
        };
        let e = b.join(Time::from_millis(1_000), &p);
        let v: Value = serde_json::from_str(&e.to_json()).unwrap();
        assert_eq!(v["v"], 1);
        assert_eq!(v["type"], "session.join");
        assert_eq!(v["sender"], p.id.as_str());
        assert_eq!(v["ts"], "1970-01-01T00:00:01.000Z");
        assert_eq!(v["payload"]["participant"]["transport"], "t140");
        assert_eq!(v["payload"]["participant"]["type"], "human");
        assert_eq!(v["payload"]["supported_versions"], json!([1]));
        assert_eq!(v["payload"]["token"], "tok");
        assert!(v.get("ref").is_none());
        let back: Envelope = serde_json::from_value(v).unwrap();
        assert_eq!(back, e);
    }
}
