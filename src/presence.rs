//! Who is in the session, as the envelopes leaving the gateway say it. A stream-mapping rule's
//! fixed participant id can match several speakers (every stream from a network, a mixer's
//! sources), possibly on different receive workers: to the PVP session they are one
//! participant, which joins once (pvp-spec 6.3) and leaves with the last of them. Every sink
//! and replay pass their envelopes through one [`Presence`], which lets the first join and the
//! last leave of a participant id through and holds the rest back. Plain data: no IO.

use std::collections::HashMap;

use crate::pvp::{Envelope, Kind, SenderId};

#[derive(Debug, Default)]
pub struct Presence {
    /// Speakers joined under each participant id, by session (a mapping rule may give one id
    /// in several sessions: one participant in each); only those with at least one.
    joined: HashMap<(String, SenderId), u32>,
}

impl Presence {
    /// Whether `e` goes out: false for a join of a participant already in, and for a leave
    /// while another of its speakers is still in. Anything else goes out.
    pub fn admit(&mut self, e: &Envelope) -> bool {
        let key = || (e.session_json().to_owned(), e.sender().clone());
        match e.kind() {
            Kind::SessionJoin => {
                let n = self.joined.entry(key()).or_insert(0);
                *n += 1;
                *n == 1
            }
            Kind::SessionLeave => match self.joined.get_mut(&key()) {
                Some(n) if *n > 1 => {
                    *n -= 1;
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
