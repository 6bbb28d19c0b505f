//! Manual stream mapping (pvp-implementation-guide STEP 4, `streamMapping: "manual"`): rules
//! that match a speaker by SSRC, source network or RTCP name and give it a participant id,
//! display name, roles and target session, so one gateway can feed several PVP sessions.
//! Evaluated once per speaker, when it is about to join (so an SDES name can match).

use std::net::IpAddr;

use ipnet::IpNet;

/// One `[[stream]]` rule. Every `match_*` given must match; the first rule that matches wins.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rule {
    pub match_ssrc: Option<u32>,
    pub match_source: Option<IpNet>,
    pub match_rtcp_name: Option<String>,
    pub participant: Option<String>,
    pub name: Option<String>,
    pub roles: Option<Vec<String>>,
    pub session: Option<String>,
}

/// What to do with a speaker no rule matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Unmatched {
    /// The automatic rule: participant id and name derived from the stream.
    #[default]
    Auto,
    /// Not a participant: its text is dropped and counted.
    Refuse,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Mapping {
    pub rules: Vec<Rule>,
    pub unmatched: Unmatched,
}

/// What the mapping decided for one speaker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision<'a> {
    Rule(&'a Rule),
    Auto,
    Refuse,
}

impl Mapping {
    /// `ssrc` is the speaker's own source id (the CSRC for a mixer's speaker); `rtcp_name` its
    /// SDES NAME or CNAME when known.
    pub fn decide(&self, ssrc: u32, source: IpAddr, rtcp_name: Option<&str>) -> Decision<'_> {
        let hit = self.rules.iter().find(|r| {
            r.match_ssrc.is_none_or(|s| s == ssrc)
                && r.match_source.is_none_or(|n| n.contains(&source))
                && r.match_rtcp_name
                    .as_deref()
                    .is_none_or(|n| rtcp_name == Some(n))
        });
        match (hit, self.unmatched) {
            (Some(r), _) => Decision::Rule(r),
            (None, Unmatched::Auto) => Decision::Auto,
            (None, Unmatched::Refuse) => Decision::Refuse,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_matching_rule_wins_and_unmatched_follows_the_policy() {
        let m = Mapping {
            rules: vec![
                Rule {
                    match_rtcp_name: Some("Ada".into()),
                    participant: Some("ada".into()),
                    ..Rule::default()
                },
                Rule {
                    match_ssrc: Some(7),
                    match_source: Some("10.0.0.0/8".parse().unwrap()),
                    participant: Some("seven".into()),
                    ..Rule::default()
                },
            ],
            unmatched: Unmatched::Refuse,
        };
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let pid = |d: Decision<'_>| match d {
            Decision::Rule(r) => r.participant.clone().unwrap(),
            other => format!("{other:?}"),
        };
        assert_eq!(pid(m.decide(7, ip("10.1.1.1"), None)), "seven");
        assert_eq!(pid(m.decide(7, ip("10.1.1.1"), Some("Ada"))), "ada");
        assert_eq!(pid(m.decide(7, ip("192.0.2.1"), None)), "Refuse");
        assert_eq!(pid(m.decide(8, ip("10.1.1.1"), None)), "Refuse");
    }
}
