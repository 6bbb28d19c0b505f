//! Who is in the session, as the envelopes leaving the gateway say it. A stream-mapping rule's
//! fixed participant id can match several speakers (every stream from a network, a mixer's
//! sources), possibly on different receive workers: to the PVP session they are one
//! participant, which joins once (pvp-spec 6.3) and leaves with the last of them. Every sink
//! and replay pass their envelopes through one [`Presence`], which lets the first join and the
//! last leave of a participant id through and holds the rest back. The participant is the
//! one its admitted join described: a `participant.announce` (a name learnt from RTCP) goes
//! out only from that speaker, not from the others that share its id, each of which would
//! otherwise rename it after itself (review ao). Plain data: no IO.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};

use crate::pvp::{Envelope, Kind, SenderId};

#[derive(Debug, Default)]
pub struct Presence {
    /// Speakers joined under each participant id, by session (a mapping rule may give one id
    /// in several sessions: one participant in each); only those with at least one.
    joined: HashMap<(String, SenderId), Joined>,
}

#[derive(Debug)]
struct Joined {
    speakers: u32,
    /// The speaker whose join went out ([`speaker_of`]): the one whose announces do.
    speaker: u64,
}

/// Which speaker a join or an announce describes: a hash of the participant's `metadata` as
/// the envelope carries it (its SSRC, source, CSRC or stream id: one speaker's own, and the
/// same in its join and its announces). Only the participant's metadata is named so in these
/// envelopes; 0 if it is not found.
pub(crate) fn speaker_of(e: &Envelope) -> u64 {
    const KEY: &str = "\"metadata\":";
    let json = e.json();
    let Some(rest) = json.find(KEY).map(|at| &json[at + KEY.len()..]) else {
        return 0;
    };
    let mut values = serde_json::Deserializer::from_str(rest).into_iter::<serde::de::IgnoredAny>();
    let text = match values.next() {
        Some(Ok(_)) => &rest[..values.byte_offset()],
        _ => return 0,
    };
    let mut h = std::hash::DefaultHasher::new();
    text.hash(&mut h);
    h.finish()
}

impl Presence {
    /// Whether `e` goes out: false for a join of a participant already in, for a leave
    /// while another of its speakers is still in, and for an announce from a speaker of a
    /// participant that joined as another of its speakers. Anything else goes out.
    pub fn admit(&mut self, e: &Envelope) -> bool {
        let key = || (e.session_json().to_owned(), e.sender().clone());
        match e.kind() {
            Kind::SessionJoin => {
                let j = self.joined.entry(key()).or_insert_with(|| Joined {
                    speakers: 0,
                    speaker: speaker_of(e),
                });
                j.speakers += 1;
                j.speakers == 1
            }
            // A participant not seen joining (the spool's resend of one announced before a
            // restart) is named by what comes.
            Kind::ParticipantAnnounce => self
                .joined
                .get(&key())
                .is_none_or(|j| j.speaker == speaker_of(e)),
            Kind::SessionLeave => match self.joined.get_mut(&key()) {
                Some(j) if j.speakers > 1 => {
                    j.speakers -= 1;
                    false
                }
                Some(_) => {
                    self.joined.remove(&key());
                    true
                }
                // A leave for no join seen (the spool's resend of one made before a restart).
                None => true,
            },
            _ => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pvp::Builder;
    use crate::time::Time;
    use serde_json::json;

    #[test]
    fn one_join_and_one_leave_per_participant_whatever_its_speakers() {
        let mut b = Builder::new("s".into(), None, 1);
        let mut env = |who: &str, kind| b.envelope(Time(0), SenderId::from(who), kind, &json!({}));
        let mut p = Presence::default();
        let mut out = |e: Envelope| p.admit(&e).then(|| (e.sender().to_string(), e.kind()));
        let got: Vec<_> = [
            env("room", Kind::SessionJoin),
            env("room", Kind::ContextAdd),
            env("ada", Kind::SessionJoin),
            env("room", Kind::SessionJoin),
            env("room", Kind::ContextAdd),
            env("room", Kind::SessionLeave),
            env("ada", Kind::SessionLeave),
            env("room", Kind::ContextAdd),
            env("room", Kind::SessionLeave),
            env("room", Kind::SessionJoin),
            env("bob", Kind::SessionLeave),
        ]
        .into_iter()
        .filter_map(&mut out)
        .collect();
        use Kind::*;
        let want: Vec<(String, Kind)> = [
            ("room", SessionJoin),
            ("room", ContextAdd),
            ("ada", SessionJoin),
            ("room", ContextAdd),
            ("ada", SessionLeave),
            ("room", ContextAdd),
            ("room", SessionLeave),
            ("room", SessionJoin),
            ("bob", SessionLeave),
        ]
        .into_iter()
        .map(|(w, k)| (w.to_owned(), k))
        .collect();
        assert_eq!(got, want);
    }
}
