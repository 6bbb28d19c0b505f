//! Found by review af (session 43): the README's "Usage" flag table, its "Configuration file"
//! keys and the names its "Testing" and "Benchmarks" sections give, checked against the real
//! binary's `--help`, the keys its `--config` parser accepts, and the files in the tree; the
//! `send` line's options; a warning when `--listen`'s port 65535 leaves no RTCP port.

use std::collections::BTreeSet;
use std::process::Command;

fn readme() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap()
}

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_pvp-t140"))
}

/// `(flag, default)` for every option of the gateway's `--help`, `--help` and `--version` left out.
fn help_flags() -> Vec<(String, Option<String>)> {
    let out = bin()
        .arg("--help")
        .env_remove("PVP_TOKEN")
        .output()
        .unwrap();
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout).unwrap();
    let mut flags: Vec<(String, Option<String>)> = Vec::new();
    for line in help.lines() {
        let t = line.trim_start();
        if let Some(rest) = t.strip_prefix("--") {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect();
            flags.push((format!("--{name}"), None));
        } else if let Some(i) = t.find("[default: ")
            && let Some(last) = flags.last_mut()
        {
            let d = &t[i + "[default: ".len()..];
            let d = d.split([']', ';']).next().unwrap().trim().to_owned();
            last.1 = Some(d);
        }
    }
    flags.retain(|(f, _)| f != "--help" && f != "--version");
    assert!(flags.len() > 20, "parsed --help: {flags:?}");
    let with_default = flags.iter().filter(|(_, d)| d.is_some()).count();
    assert!(with_default > 20, "parsed --help's defaults: {flags:?}");
    flags
}

/// The rows of the README's flag table ("Usage"), as lines.
fn table_rows() -> Vec<String> {
    let readme = readme();
    let usage = readme
        .split("\n## Usage")
        .nth(1)
        .unwrap()
        .split("\n### Configuration file")
        .next()
        .unwrap()
        .to_owned();
    usage
        .lines()
        .filter(|l| l.starts_with("| `--"))
        .map(str::to_owned)
        .collect()
}

/// Every option of `--help` has a row of the README's flag table (or is named in one), with the
/// default `--help` gives; every flag the table's first column names is an option of `--help`.
#[test]
fn the_flag_table_and_help_agree_on_flags_and_defaults() {
    let rows = table_rows();
    for (flag, default) in help_flags() {
        let tick = format!("`{flag}`");
        let row = rows
            .iter()
            .find(|r| r.contains(&tick))
            .unwrap_or_else(|| panic!("{flag} of --help has no row in the README's table"));
        if let Some(d) = default {
            // A row may hold two flags (`--t140-pt` / `--red-pt`, `--gate-quorum` (1)); the
            // default is the help's, written as the table writes it (`off` for `false`).
            let said = [
                d.clone(),
                if d == "false" {
                    "off".into()
                } else {
                    d.clone()
                },
            ];
            assert!(
                said.iter().any(|d| row.contains(d.as_str())),
                "{flag}: --help's default {d} is not in its README row: {row}"
            );
        }
    }
    let help: BTreeSet<String> = help_flags().into_iter().map(|(f, _)| f).collect();
    for row in &rows {
        let first = row.split('|').nth(1).unwrap();
        for part in first.split('`').skip(1).step_by(2) {
            if part.starts_with("--") {
                assert!(
                    help.contains(part),
                    "README row names {part}, not in --help"
                );
            }
        }
    }
}

/// README, "Configuration file": "`--config gateway.toml` takes every flag as a key (`-` as
/// `_`; `--role` as the list `roles`)". The keys the binary's parser accepts are those it lists
/// for an unknown one; each flag's key is among them, and each of them but the file's own
/// (`unmatched`, `stream`) is a flag.
#[test]
fn every_flag_is_a_config_key_and_every_key_a_flag() {
    let dir = std::env::temp_dir().join(format!("pvp-t140-review-af-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("unknown.toml");
    std::fs::write(&file, "session = \"x\"\nno_such_key = 1\n").unwrap();
    let out = bin()
        .arg("--config")
        .arg(&file)
        .env_remove("PVP_TOKEN")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("unknown.toml") && err.contains("line 2"),
        "{err}"
    );
    let listed = err
        .split("expected one of")
        .nth(1)
        .unwrap_or_else(|| panic!("no key list: {err}"));
    let keys: BTreeSet<String> = listed
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect();
    let key_of = |flag: &str| match flag {
        "--role" => "roles".to_owned(),
        f => f.trim_start_matches("--").replace('-', "_"),
    };
    let flags: Vec<String> = help_flags()
        .into_iter()
        .map(|(f, _)| f)
        .filter(|f| f != "--config")
        .collect();
    for flag in &flags {
        assert!(keys.contains(&key_of(flag)), "{flag} has no key: {keys:?}");
    }
    for key in &keys {
        if key == "unmatched" || key == "stream" {
            continue;
        }
        assert!(
            flags.iter().any(|f| &key_of(f) == key),
            "config key {key} is no flag"
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// README, "Testing" and "Benchmarks, load and fuzzing": the test files, benches, example and
/// fuzz targets it names exist under those names.
#[test]
fn the_named_tests_benches_and_fuzz_targets_exist() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = readme();
    for test in [
        "interop_t140llm",
        "tshark_red",
        "alloc_steady_state",
        "impairment",
    ] {
        assert!(readme.contains(test));
        assert!(
            root.join(format!("tests/{test}.rs")).exists(),
            "tests/{test}.rs"
        );
    }
    let cargo = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    for bench in ["core", "scale"] {
        assert!(readme.contains(&format!("cargo bench --bench {bench}")));
        assert!(
            cargo.contains(&format!("name = \"{bench}\"")),
            "bench {bench}"
        );
    }
    assert!(cargo.contains("name = \"loadtest\"\ntest = true"));
    let fuzz = std::fs::read_to_string(root.join("fuzz/Cargo.toml")).unwrap();
    for target in [
        "rtp_parse",
        "red_parse",
        "t140_decode",
        "pcap_read",
        "gateway",
        "batch",
        "ws_frames",
    ] {
        assert!(readme.contains(&format!("`{target}`")) || target == "gateway");
        assert!(
            fuzz.contains(&format!("name = \"{target}\"")),
            "fuzz {target}"
        );
    }
    assert!(root.join("fuzz/smoke.sh").exists() && root.join("fuzz/README.md").exists());
    assert!(root.join(".ci/run").exists());
    for f in [
        "deploy/pvp-t140.service",
        "deploy/Containerfile",
        "tools/README-pcaps.md",
    ] {
        assert!(readme.contains(f) && root.join(f).exists(), "{f}");
    }
}

mod common;
use common::gateway_proc::Gateway;

/// README, "Usage": `--rtcp` (default `true`) "also read[s] RTCP on the next port up". With
/// `--listen` on port 65535 there is none: the gateway went on reading rtcp-mux RTCP only and
/// said so nowhere but `rtcp=mux only` in its listening line, where a taken RTCP port is
/// warned. A sender's RTCP to that port (its names, its BYE) is never read, so the operator is
/// told, as for a taken port.
#[test]
fn no_port_after_65535_for_rtcp_is_warned() {
    if std::net::UdpSocket::bind("127.0.0.1:65535").is_err() {
        eprintln!("127.0.0.1:65535 is taken here; skipped");
        return;
    }
    let mut gw = Gateway::start_logging(&["--listen", "127.0.0.1:65535"], "info");
    assert_eq!(gw.listen.port(), 65535);
    gw.terminate(std::time::Duration::from_secs(10));
    let warned = gw
        .stderr_lines()
        .into_iter()
        .any(|l| l.contains("\"WARN\"") && l.contains("RTCP") && l.contains("65535"));
    assert!(warned, "no warning: {:#?}", gw.stderr_lines());
}

/// README, "Usage": the `send` line lists the sender's options. It left out `--t140-pt`,
/// `--red-pt` and `--no-bye`: a newcomer whose gateway runs with other payload types (`--compat
/// t140llm`'s 96 / 98, or `--t140-pt`) found no way in the README to make the sender match, and
/// its packets were dropped as `unknown_payload_type`.
#[test]
fn the_send_line_lists_every_option_of_send_help() {
    let out = bin().args(["send", "--help"]).output().unwrap();
    let help = String::from_utf8(out.stdout).unwrap();
    let readme = readme();
    let line = readme
        .lines()
        .find(|l| l.starts_with("pvp-t140 send "))
        .expect("the send line in Usage");
    for l in help.lines() {
        let t = l.trim_start();
        let Some(rest) = t.strip_prefix("--") else {
            continue;
        };
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
            .collect();
        if name == "help" || name == "log-format" {
            continue;
        }
        assert!(
            line.contains(&format!("[--{name}")),
            "send --{name} is not on the README's send line: {line}"
        );
    }
}
