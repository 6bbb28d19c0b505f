//! `--config FILE`: everything the flags have, in TOML, plus manual stream mapping
//! (`[[stream]]` rules, pvp-implementation-guide STEP 4 `streamMapping: "manual"`). Flags given
//! on the command line (or by environment variable) override the file. Errors name the line
//! and the field.

use std::net::SocketAddr;
use std::ops::Range;
use std::path::{Path, PathBuf};

use ipnet::IpNet;
use serde::Deserialize;
use toml::Spanned;
use toml::de::{DeTable, DeValue};

use crate::mapping::{Mapping, Rule, Unmatched};

/// The file's top level: the flags' names with `-` as `_` (`t140_pt`, `idle_flush_ms`, ...).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    #[serde(default, deserialize_with = "socket_addr_value")]
    pub listen: Option<SocketAddr>,
    pub server: Option<String>,
    pub session: Option<String>,
    pub roles: Option<Vec<Spanned<String>>>,
    pub t140_pt: Option<u8>,
    pub red_pt: Option<u8>,
    pub compat: Option<String>,
    pub mixer: Option<String>,
    pub reorder_wait_ms: Option<u64>,
    pub idle_flush_ms: Option<u64>,
    pub max_chunk_chars: Option<u64>,
    pub stream_timeout_s: Option<u64>,
    pub max_streams: Option<u64>,
    pub heartbeat_s: Option<u64>,
    pub connect_timeout_s: Option<u64>,
    pub write_timeout_s: Option<u64>,
    pub server_silence_s: Option<u64>,
    pub workers: Option<u64>,
    pub recv_buffer: Option<u64>,
    pub rtcp: Option<bool>,
    #[serde(default, deserialize_with = "socket_addr_value")]
    pub metrics: Option<SocketAddr>,
    pub ca_file: Option<PathBuf>,
    pub allow: Option<Vec<Spanned<String>>>,
    pub max_pps_per_source: Option<u32>,
    pub token: Option<String>,
    pub log_format: Option<String>,
    pub spool: Option<PathBuf>,
    pub gate_transcripts: Option<bool>,
    pub gate_quorum: Option<u64>,
    pub gate_timeout_s: Option<u64>,
    /// `auto` (default) or `refuse`: what happens to speakers no `[[stream]]` rule matches.
    pub unmatched: Option<Spanned<String>>,
    #[serde(default)]
    pub stream: Vec<Spanned<StreamRule>>,
    /// The file's path and text, so that a value checked later is named by its line.
    #[serde(skip)]
    pub source: (PathBuf, String),
}

impl FileConfig {
    /// `path:line: key` for a top-level `key`, the start of an error about its value (the
    /// line its key is written on, however TOML lets it be written: quoted, after a BOM; the
    /// file alone if not found).
    pub fn locate(&self, key: &str) -> String {
        let (path, text) = &self.source;
        match key_span(text, None, key) {
            Some(span) => at_line(path, text, span, key),
            None => format!("{}: {key}", path.display()),
        }
    }
}

/// Where `key` is written: at the top level, or in the `[[stream]]` rule numbered `rule`
/// (a table or an inline one), by the spans the TOML parser gives, so a quoted key, a BOM or
/// a later top-level key of the same name do not mislead it.
fn key_span(text: &str, rule: Option<usize>, key: &str) -> Option<Range<usize>> {
    let doc = DeTable::parse(text).ok()?.into_inner();
    let find = |table: &DeTable<'_>| {
        table
            .iter()
            .find(|(k, _)| k.get_ref() == key)
            .map(|(k, _)| k.span())
    };
    let Some(i) = rule else {
        return find(&doc);
    };
    let (_, rules) = doc.iter().find(|(k, _)| k.get_ref() == "stream")?;
    let DeValue::Array(rules) = rules.get_ref() else {
        return None;
    };
    match rules.get(i)?.get_ref() {
        DeValue::Table(t) => find(t),
        _ => None,
    }
}

/// One `[[stream]]` table.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamRule {
    /// SSRC to match: an integer or a hex string with `0x` (`"0x1a2b3c4d"`).
    pub ssrc: Option<Spanned<toml::Value>>,
    /// Source address or network (`"10.0.0.5"`, `"10.0.0.0/8"`).
    pub source: Option<Spanned<String>>,
    /// RTCP SDES NAME (or CNAME) to match.
    pub rtcp_name: Option<String>,
    pub participant: Option<String>,
    pub name: Option<String>,
    pub roles: Option<Vec<Spanned<String>>>,
    pub session: Option<String>,
}

pub const ROLES: [&str; 6] = [
    "driver",
    "navigator",
    "adversary",
    "observer",
    "approver",
    "admin",
];

/// `path:line: field: message` for a value found at `span` in `text`.
fn at(path: &Path, text: &str, span: Range<usize>, field: &str, msg: &str) -> String {
    format!("{}: {msg}", at_line(path, text, span, field))
}

/// `path:line: field` for something found at `span` in `text`.
fn at_line(path: &Path, text: &str, span: Range<usize>, field: &str) -> String {
    let line = text[..span.start.min(text.len())].matches('\n').count() + 1;
    format!("{}:{line}: {field}", path.display())
}

/// A network or a single address. An IPv4-mapped IPv6 network (`::ffff:10.0.0.0/104`, the
/// form a dual-stack socket shows its IPv4 peers in) is taken as the IPv4 network it maps:
/// senders are known by their IPv4 address (`stream::canonical`), so as written it could never
/// match one.
pub fn parse_net(s: &str) -> Option<IpNet> {
    let net = s
        .parse::<IpNet>()
        .ok()
        .or_else(|| s.parse::<std::net::IpAddr>().ok().map(IpNet::from))?;
    Some(match net {
        IpNet::V6(n) if n.prefix_len() >= 96 => match n.addr().to_ipv4_mapped() {
            Some(v4) => IpNet::new(v4.into(), n.prefix_len() - 96).unwrap_or(net),
            None => net,
        },
        _ => net,
    })
}

/// An address and port as `--listen`, `--metrics` and `send --to` take them: numeric, since a
/// host name may name several addresses (`localhost`: 127.0.0.1 and ::1) and a listener binds
/// one. The error says so, where the standard library's said only "invalid socket address
/// syntax".
pub fn socket_addr(s: &str) -> Result<SocketAddr, String> {
    s.parse().map_err(|e| {
        format!("{e}: an address and port, as 127.0.0.1:5004 or [::1]:5004 (a host name is not looked up)")
    })
}

/// [`socket_addr`] for a key of the file.
fn socket_addr_value<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<SocketAddr>, D::Error> {
    let s = String::deserialize(d)?;
    socket_addr(&s).map(Some).map_err(serde::de::Error::custom)
}

/// Reads and checks a configuration file.
pub fn load(path: &Path) -> Result<(FileConfig, Mapping, Vec<IpNet>), String> {
    parse(path, &read(path)?)
}

/// The largest configuration file read: far beyond any real one (a thousand `[[stream]]`
/// rules are about 100 KiB), and a bound on what `--config /dev/zero` or a runaway pipe costs.
pub const MAX_FILE: u64 = 1 << 20;

/// Reads a configuration file as UTF-8, refusing one over [`MAX_FILE`] before reading more.
pub fn read(path: &Path) -> Result<String, String> {
    use std::io::Read;
    let shown = path.display();
    let file = std::fs::File::open(path).map_err(|e| format!("{shown}: {e}"))?;
    let mut bytes = Vec::new();
    (file.take(MAX_FILE + 1).read_to_end(&mut bytes)).map_err(|e| format!("{shown}: {e}"))?;
    if bytes.len() as u64 > MAX_FILE {
        return Err(format!(
            "{shown}: larger than {} KiB: not a configuration file",
            MAX_FILE >> 10
        ));
    }
    String::from_utf8(bytes).map_err(|_| format!("{shown}: stream did not contain valid UTF-8"))
}

pub fn parse(path: &Path, text: &str) -> Result<(FileConfig, Mapping, Vec<IpNet>), String> {
    let mut file: FileConfig =
        toml::from_str(text).map_err(|e| format!("{}: {e}", path.display()))?;
    file.source = (path.to_owned(), text.to_owned());
    // An empty list is refused, as `--role` always gives one (navigator by default): a join
    // with no roles is refused by a PVP server (pvp-spec 7.2), and so is all its context.
    const NO_ROLES: &str = "must list at least one role (the --role default is navigator)";
    let check_roles = |roles: &Option<Vec<Spanned<String>>>,
                       field: &str,
                       empty: &dyn Fn() -> String|
     -> Result<Option<Vec<String>>, String> {
        if roles.as_ref().is_some_and(Vec::is_empty) {
            return Err(empty());
        }
        roles
            .as_ref()
            .map(|v| {
                v.iter()
                    .map(|r| {
                        if ROLES.contains(&r.get_ref().as_str()) {
                            Ok(r.get_ref().clone())
                        } else {
                            Err(at(
                                path,
                                text,
                                r.span(),
                                field,
                                &format!("unknown role {:?} (one of {ROLES:?})", r.get_ref()),
                            ))
                        }
                    })
                    .collect()
            })
            .transpose()
    };
    check_roles(&file.roles, "roles", &|| {
        format!("{}: {NO_ROLES}", file.locate("roles"))
    })?;
    let mut allow = Vec::new();
    for a in file.allow.iter().flatten() {
        allow.push(parse_net(a.get_ref()).ok_or_else(|| {
            at(
                path,
                text,
                a.span(),
                "allow",
                "not an address or CIDR network",
            )
        })?);
    }
    let unmatched = match file
        .unmatched
        .as_ref()
        .map(|u| (u.get_ref().as_str(), u.span()))
    {
        None | Some(("auto", _)) => Unmatched::Auto,
        Some(("refuse", _)) => Unmatched::Refuse,
        Some((_, span)) => {
            return Err(at(
                path,
                text,
                span,
                "unmatched",
                "must be \"auto\" or \"refuse\"",
            ));
        }
    };
    let mut rules = Vec::new();
    for (i, rule) in file.stream.iter().enumerate() {
        let r = rule.get_ref();
        let field = |f: &str| format!("stream[{i}].{f}");
        let match_ssrc = match &r.ssrc {
            None => None,
            Some(v) => {
                let parsed = match v.get_ref() {
                    toml::Value::Integer(n) => u32::try_from(*n).ok(),
                    // Hex only after one `0x`: a bare string is ambiguous (`"4660"` is
                    // decimal to `send --ssrc`, `"00001234"` hex in a participant id), and
                    // `from_str_radix` alone takes a sign.
                    toml::Value::String(s) => s
                        .strip_prefix("0x")
                        .or_else(|| s.strip_prefix("0X"))
                        .filter(|h| !h.is_empty() && h.bytes().all(|b| b.is_ascii_hexdigit()))
                        .and_then(|h| u32::from_str_radix(h, 16).ok()),
                    _ => None,
                };
                Some(parsed.ok_or_else(|| {
                    at(
                        path,
                        text,
                        v.span(),
                        &field("ssrc"),
                        "an integer (ssrc = 4660, or 0x1234) or a hex string with 0x, like \"0x1a2b3c4d\"",
                    )
                })?)
            }
        };
        let match_source = match &r.source {
            None => None,
            Some(s) => Some(parse_net(s.get_ref()).ok_or_else(|| {
                at(
                    path,
                    text,
                    s.span(),
                    &field("source"),
                    "not an address or CIDR network",
                )
            })?),
        };
        // An SDES item that shows no name (white space, controls, invisible characters only)
        // names no one (`gateway::sdes_item`): a rule for one could match nothing.
        if r.rtcp_name
            .as_deref()
            .is_some_and(|v| crate::gateway::clean_name(v).is_none())
        {
            return Err(at(
                path,
                text,
                key_span(text, Some(i), "rtcp_name").unwrap_or(rule.span()),
                &field("rtcp_name"),
                "must not be empty (no SDES name is, nor one of control or invisible characters \
                 only: it could match nothing)",
            ));
        }
        // An SDES item holds 255 octets (RFC 3550 6.5): a longer name could match nothing.
        if let Some(n) = r.rtcp_name.as_deref().map(str::trim)
            && n.len() > 255
        {
            return Err(at(
                path,
                text,
                key_span(text, Some(i), "rtcp_name").unwrap_or(rule.span()),
                &field("rtcp_name"),
                &format!(
                    "{} bytes: an SDES item holds at most 255 (RFC 3550 6.5), so it could match \
                     nothing",
                    n.len()
                ),
            ));
        }
        if r.name
            .as_deref()
            .is_some_and(|n| crate::gateway::clean_name(n).is_none())
        {
            return Err(at(
                path,
                text,
                key_span(text, Some(i), "name").unwrap_or(rule.span()),
                &field("name"),
                "must not be empty (nothing is left to show once spaces and control characters \
                 are dropped, as they are from every display name, invisible ones not showing)",
            ));
        }
        for (key, value) in [("participant", &r.participant), ("session", &r.session)] {
            if value.as_deref().is_some_and(|v| v.trim().is_empty()) {
                return Err(at(
                    path,
                    text,
                    key_span(text, Some(i), key).unwrap_or(rule.span()),
                    &field(key),
                    &format!(
                        "must not be empty (pvp-spec 4.1: it names the {key} of every envelope)"
                    ),
                ));
            }
        }
        // pvp-spec 4.2: the server's own sender. A participant under it is taken for the
        // server by every member, this gateway's other participants too: its heartbeat pings
        // answered by all of them (`crate::pvp::from_server`).
        if let Some(id) = r
            .participant
            .as_deref()
            .filter(|id| crate::pvp::from_server(id))
        {
            return Err(at(
                path,
                text,
                key_span(text, Some(i), "participant").unwrap_or(rule.span()),
                &field("participant"),
                &format!(
                    "{id:?} is the PVP server's own sender (pvp-spec 4.2): members would take \
                     this participant for the server"
                ),
            ));
        }
        if match_ssrc.is_none() && match_source.is_none() && r.rtcp_name.is_none() {
            return Err(at(
                path,
                text,
                rule.span(),
                &format!("stream[{i}]"),
                "a rule needs at least one of ssrc, source, rtcp_name",
            ));
        }
        rules.push(Rule {
            match_ssrc,
            match_source,
            // An SDES name is matched trimmed (`gateway::sdes_item`): so is the rule's.
            match_rtcp_name: r.rtcp_name.as_deref().map(|n| n.trim().to_owned()),
            participant: r.participant.clone(),
            name: r.name.clone(),
            roles: check_roles(&r.roles, &field("roles"), &|| {
                at(
                    path,
                    text,
                    key_span(text, Some(i), "roles").unwrap_or(rule.span()),
                    &field("roles"),
                    NO_ROLES,
                )
            })?,
            session: r.session.clone(),
        });
    }
    Ok((file, Mapping { rules, unmatched }, allow))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(text: &str) -> Result<(FileConfig, Mapping, Vec<IpNet>), String> {
        parse(Path::new("gw.toml"), text)
    }

    #[test]
    fn a_full_file_parses() {
        let (f, m, allow) = p(r#"
listen = "0.0.0.0:5004"
session = "s1"
roles = ["navigator", "observer"]
idle_flush_ms = 1500
allow = ["10.0.0.0/8", "192.0.2.7"]
unmatched = "refuse"

[[stream]]
ssrc = "0x1a2b3c4d"
participant = "alice"
name = "Alice"
roles = ["driver"]
session = "other"

[[stream]]
source = "10.1.0.0/16"
rtcp_name = "Bob"
"#)
        .unwrap();
        assert_eq!(f.session.as_deref(), Some("s1"));
        assert_eq!(f.idle_flush_ms, Some(1500));
        assert_eq!(allow.len(), 2);
        assert_eq!(m.unmatched, Unmatched::Refuse);
        assert_eq!(m.rules[0].match_ssrc, Some(0x1a2b3c4d));
        assert_eq!(m.rules[0].session.as_deref(), Some("other"));
        assert_eq!(m.rules[1].match_rtcp_name.as_deref(), Some("Bob"));
    }

    /// An SDES name is matched trimmed, so a rule's `rtcp_name` is too (`"Alice "` matched
    /// nothing); one that is all blanks could match nothing and is refused.
    #[test]
    fn a_rules_rtcp_name_is_trimmed_and_not_empty() {
        let (_, m, _) = p("[[stream]]\nrtcp_name = \" Alice \"\n").unwrap();
        assert_eq!(m.rules[0].match_rtcp_name.as_deref(), Some("Alice"));
        let e = p("session = \"s\"\n[[stream]]\nrtcp_name = \"  \"\n").unwrap_err();
        assert!(
            e.starts_with("gw.toml:3: stream[0].rtcp_name: must not be empty"),
            "{e}"
        );
    }

    /// A rule's `name` with nothing left once cleaned as every display name is (spaces and
    /// control characters) is refused at load, not sent as it came. (Review, session 34: `name
    /// = "\u0007"` reached PVP clients and the log with its BEL.)
    #[test]
    fn a_rules_name_that_shows_nothing_is_refused() {
        for name in ["", "  ", "\\u0007", "\\u2028 \\u001b"] {
            let e = p(&format!("[[stream]]\nssrc = \"0x1\"\nname = \"{name}\"\n")).unwrap_err();
            assert!(
                e.starts_with("gw.toml:3: stream[0].name: must not be empty"),
                "{name}: {e}"
            );
        }
        let (_, m, _) = p("[[stream]]\nssrc = \"0x1\"\nname = \" Ada\\u0007 \"\n").unwrap();
        assert_eq!(
            m.rules[0].name.as_deref(),
            Some(" Ada\u{7} "),
            "cleaned when sent"
        );
    }

    /// A rule's participant id that is the server's own sender (pvp-spec 4.2, `system` or
    /// `server`) is refused at load: every member, this gateway's other participants too, took
    /// what it sent for the server's word (its heartbeat pings were answered by all of them).
    /// Found by review ao (session 45).
    #[test]
    fn a_rules_participant_id_that_is_the_servers_sender_is_refused() {
        for id in ["system", "server"] {
            let e = p(&format!("[[stream]]\nssrc = 1\nparticipant = \"{id}\"\n")).unwrap_err();
            assert!(
                e.starts_with("gw.toml:3: stream[0].participant:") && e.contains("pvp-spec 4.2"),
                "{e}"
            );
        }
        let (_, m, _) = p("[[stream]]\nssrc = 1\nparticipant = \"systems\"\n").unwrap();
        assert_eq!(m.rules[0].participant.as_deref(), Some("systems"));
    }

    #[test]
    fn errors_name_the_line_and_the_field() {
        let e = p("session = \"s\"\nidle_flush_mss = 5\n").unwrap_err();
        assert!(e.contains("line 2") && e.contains("idle_flush_mss"), "{e}");
        let e = p("session = \"s\"\n\n[[stream]]\nssrc = \"zz\"\n").unwrap_err();
        assert!(e.starts_with("gw.toml:4: stream[0].ssrc:"), "{e}");
        let e = p("roles = [\"navigator\",\n  \"pilot\"]\n").unwrap_err();
        assert!(
            e.starts_with("gw.toml:2: roles: unknown role \"pilot\""),
            "{e}"
        );
        let e = p("allow = [\"10.0.0.0/33\"]").unwrap_err();
        assert!(e.starts_with("gw.toml:1: allow:"), "{e}");
        let e = p("idle_flush_ms = \"soon\"").unwrap_err();
        assert!(e.contains("line 1") && e.contains("idle_flush_ms"), "{e}");
        let e = p("[[stream]]\nname = \"x\"\n").unwrap_err();
        assert!(e.contains("stream[0]"), "{e}");
    }

    /// A rule may be an inline table (`stream = [{ ... }]`, which the file's
    /// `Vec<Spanned<StreamRule>>` takes as well), after which the top level goes on: a
    /// top-level `roles` on a later line is not the rule's own, and the error names line 1,
    /// where the empty list is.
    #[test]
    fn an_empty_roles_list_in_an_inline_stream_rule_names_its_line_not_a_later_top_level_key() {
        let e = p("stream = [{ ssrc = 9, roles = [] }]\nroles = [\"driver\"]\n").unwrap_err();
        assert!(e.starts_with("gw.toml:1: stream[0].roles:"), "{e}");
    }

    /// A key TOML lets be written quoted is found by the parser's spans as a bare one is:
    /// in a `[[stream]]` rule, the error names the line of `"roles" = []`, not the rule's
    /// header; after a BOM, a top-level key's line is still counted from 1.
    #[test]
    fn a_quoted_key_or_a_bom_keeps_the_line_in_errors() {
        let e = p("[[stream]]\nssrc = 1\n\"roles\" = []\n").unwrap_err();
        assert!(e.starts_with("gw.toml:3: stream[0].roles:"), "{e}");
        let e = p("\u{feff}\n'roles' = []\n").unwrap_err();
        assert!(e.starts_with("gw.toml:2: roles:"), "{e}");
    }
}
