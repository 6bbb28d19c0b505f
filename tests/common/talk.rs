//! PVP envelopes made by hand for a sink to send, as the core would make them: a join, text
//! (`context.add`, audio_transcript) and a leave, a millisecond apart.
#![allow(dead_code)]

use pvp_t140::pvp::{Builder, Envelope, Kind, SenderId};
use pvp_t140::time::Time;
use serde_json::{Value, json};

pub struct Talk {
    b: Builder,
    t: u64,
}

impl Default for Talk {
    fn default() -> Self {
        Self::new()
    }
}

impl Talk {
    /// Envelopes in session "s".
    pub fn new() -> Self {
        Self::in_session("s")
    }

    /// Envelopes in `session` (a `[[stream]]` rule can put a participant in any session),
    /// with ids of their own: two sessions' `Talk`s must not make the same ids.
    pub fn in_session(session: &str) -> Self {
        let seed = session.bytes().fold(7u128, |h, b| h * 31 + u128::from(b));
        Talk {
            b: Builder::new(session.into(), None, seed),
            t: 1_700_000_000_000,
        }
    }

    pub fn env(&mut self, who: &str, kind: Kind, payload: Value) -> Envelope {
        self.t += 1;
        self.b.envelope(
            Time::from_millis(self.t),
            SenderId::from(who),
            kind,
            &payload,
        )
    }

    pub fn join(&mut self, who: &str) -> Envelope {
        self.env(
            who,
            Kind::SessionJoin,
            json!({"participant": {"id": who, "name": who, "type": "human",
                "roles": ["navigator"], "transport": "t140"}, "supported_versions": [1]}),
        )
    }

    pub fn add(&mut self, who: &str, text: &str) -> Envelope {
        self.env(
            who,
            Kind::ContextAdd,
            json!({"key": format!("k-{text}"), "content_type": "audio_transcript", "content": text}),
        )
    }

    pub fn leave(&mut self, who: &str) -> Envelope {
        self.env(who, Kind::SessionLeave, json!({"reason": "stream timeout"}))
    }
}
