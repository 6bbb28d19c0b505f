//! The `/metrics` exposition of the real binary against the OpenMetrics 1.0 ABNF: every
//! `# HELP` text is an `escaped-string` (no bare double quote or backslash).
//!
//! Found by review aq (session 45).

mod common;

use common::gateway_proc::{Gateway, http_get};

/// Whether `text` is an OpenMetrics 1.0 `escaped-string`: `normal-char` excludes LF, DQUOTE
/// and BS, which appear only as `\n`, `\"` and `\\`.
fn is_escaped_string(text: &str) -> bool {
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' | '\n' => return false,
            '\\' if !matches!(chars.next(), Some('n' | '"' | '\\')) => return false,
            _ => {}
        }
    }
    true
}

/// OpenMetrics 1.0 (ABNF, `metric-descriptor =/ HASH SP help SP metricname SP
/// escaped-string LF`): a HELP text holds a double quote only escaped. The help of
/// `pvp_t140_t140llm_objects` quoted `"[object Object]"` bare: a strict OpenMetrics parser
/// rejects the whole scrape. Escaping it would not do: in the Prometheus text format 0.0.4,
/// served from the same text, `\"` in a HELP is an invalid escape. So no help text may hold
/// a quote or a backslash at all.
#[test]
fn every_help_text_is_an_openmetrics_escaped_string() {
    let mut gw = Gateway::start(&["--metrics", "127.0.0.1:0"]);
    let m = gw.metrics_addr();
    let (status, body) = http_get(m, "/metrics");
    assert_eq!(status, 200, "{body}");
    let helps: Vec<&str> = body
        .lines()
        .filter_map(|l| l.strip_prefix("# HELP "))
        .collect();
    assert!(helps.len() > 50, "{body}");
    let bad: Vec<&&str> = helps
        .iter()
        .filter(|h| {
            let text = h.split_once(' ').map_or("", |(_, t)| t);
            !is_escaped_string(text) || text.contains(['"', '\\'])
        })
        .collect();
    assert!(
        bad.is_empty(),
        "HELP texts that are not escaped-strings: {bad:#?}"
    );
}
