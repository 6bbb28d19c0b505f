//! The fuzz targets' crash inputs replay under `cargo test` (each passes unless
//! `fuzz/README.md` lists it as failing), and `core_drive` refuses bad arguments without a
//! panic.
//!
//! Found by review ay (session 46), reading the measurement tools and their claims.

use std::collections::HashSet;
use std::path::Path;

use pvp_t140::{Gateway, Time};

/// The `gateway` fuzz target's input format and configuration (`fuzz/src/lib.rs`), so that its
/// corpus replays here, under `cargo test`, without cargo-fuzz.
#[path = "../fuzz/src/lib.rs"]
#[allow(dead_code)]
mod fuzz_input;

/// `examples/core_drive.rs`, for its argument parsing (its `main` is not run here).
#[path = "../examples/core_drive.rs"]
#[allow(dead_code)]
mod core_drive;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// A `gateway` fuzz input replayed as the target runs it, with the target's checks on
/// participants and keys: `Err` names the first broken one.
fn replay_gateway(data: &[u8]) -> Result<(), String> {
    let (cfg_byte, events) = fuzz_input::decode(data);
    let mut gw = Gateway::new(fuzz_input::config(cfg_byte));
    let mut now = Time::from_millis(1_700_000_000_000);
    let mut active: HashSet<String> = HashSet::new();
    let mut keys: HashSet<String> = HashSet::new();
    let mut check = |gw: &mut Gateway| -> Result<(), String> {
        while let Some(e) = gw.poll_output() {
            let m = e.to_message();
            let sender = m.sender.to_string();
            match m.kind.as_str() {
                "session.join" if !active.insert(sender.clone()) => {
                    return Err(format!("joined twice without leaving: {}", e.json()));
                }
                "session.leave" if !active.remove(&sender) => {
                    return Err(format!("leave without join: {}", e.json()));
                }
                "context.add" => {
                    if !active.contains(&sender) {
                        return Err(format!("context.add from a non-member: {}", e.json()));
                    }
                    let key = m.payload["key"].as_str().unwrap_or_default().to_owned();
                    if !keys.insert(key) {
                        return Err(format!("duplicate context key: {}", e.json()));
                    }
                }
                _ => {}
            }
        }
        Ok(())
    };
    for ev in &events {
        now = Time(now.0 + ev.step_us);
        if ev.timeout_first || ev.datagram.is_none() {
            gw.handle_timeout(now);
            check(&mut gw)?;
        }
        if let Some(d) = ev.datagram {
            gw.handle_datagram(now, fuzz_input::source(ev.source), d);
            check(&mut gw)?;
        }
    }
    gw.shutdown(now);
    check(&mut gw)?;
    if !active.is_empty() {
        return Err(format!("still joined after shutdown: {active:?}"));
    }
    Ok(())
}

/// A `pcap_read` fuzz input read as the target reads it: `Err` if reading panicked.
fn replay_pcap(data: &[u8]) -> Result<(), String> {
    let data = data.to_vec();
    std::panic::catch_unwind(move || {
        let _ = pvp_t140::capture::read_udp_from(std::io::Cursor::new(data), &mut |_| {});
    })
    .map_err(|p| {
        p.downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default()
    })
}

/// The inputs `fuzz/README.md`'s "Known failures" section says still fail, as
/// `corpus/TARGET/NAME`.
fn known_failures() -> Vec<(String, String)> {
    let readme = std::fs::read_to_string(root().join("fuzz/README.md")).unwrap();
    let section = readme
        .split("\n## ")
        .find(|s| s.starts_with("Known failures"))
        .unwrap_or("");
    let mut named = Vec::new();
    for part in section.split("`corpus/").skip(1) {
        let path = part.split('`').next().unwrap();
        let (target, name) = path.split_once('/').unwrap();
        named.push((target.to_owned(), name.to_owned()));
    }
    named
}

/// Found by review ay (session 46). `fuzz/README.md`'s "Known failures" said that
/// `corpus/pcap_read/crash-pcapng-pib-len8-underflow` panics and that
/// `corpus/gateway/crash-t140llm-named-id-equals-csrc-speaker` makes two participants with one
/// id, each "until" a fix that has since been made (`capture.rs` refuses pcapng blocks under 12
/// bytes; `speaker::split_named` refuses ids in the `csrc:` namespace): a reader was told the
/// fuzz smoke run fails on them. Now every `crash-*` input of both targets replays here, under
/// `cargo test` (no cargo-fuzz needed), and passes unless the README lists it as failing, and
/// what it lists fails.
#[test]
fn the_fuzz_crash_inputs_pass_unless_the_fuzz_readme_says_they_fail() {
    let known = known_failures();
    let mut replayed = 0;
    for target in ["gateway", "pcap_read"] {
        let dir = root().join("fuzz/corpus").join(target);
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if !name.starts_with("crash-") {
                continue;
            }
            let data = std::fs::read(&path).unwrap();
            let got = match target {
                "gateway" => replay_gateway(&data),
                _ => replay_pcap(&data),
            };
            replayed += 1;
            let listed = known.iter().any(|(t, n)| t == target && *n == name);
            match (listed, got) {
                (false, Err(e)) => panic!("corpus/{target}/{name} fails: {e}"),
                (true, Ok(())) => panic!(
                    "fuzz/README.md lists corpus/{target}/{name} as a known failure, but it passes"
                ),
                _ => {}
            }
        }
    }
    assert!(replayed >= 4, "{replayed} crash inputs replayed");
    for (target, name) in &known {
        assert!(
            root().join("fuzz/corpus").join(target).join(name).exists(),
            "fuzz/README.md names corpus/{target}/{name}, which does not exist"
        );
    }
}

/// Found by review ay (session 46). `core_drive` (the callgrind driver of the README's and
/// docs/performance.md's instruction counts) panicked on a bad argument (`expect(usage)`), and
/// with 0 streams divided by zero setting up its traffic (`PACKET_INTERVAL_US / streams`). Its
/// arguments are now checked, each fault said with the usage, before any traffic is made.
#[test]
fn core_drive_refuses_bad_arguments_without_a_panic() {
    let parse = |args: &[&str]| core_drive::parse(args.iter().map(|a| a.to_string()));
    for bad in [
        &["0", "plain", "10"][..],
        &["x", "plain", "10"],
        &["1", "blue", "10"],
        &["1", "red"],
        &["1", "red", "10", "sideways"],
        &["1", "red", "10", "shuffled", "lukewarm"],
        &[],
    ] {
        let e = parse(bad)
            .err()
            .unwrap_or_else(|| panic!("{bad:?} was accepted"));
        assert!(e.contains("usage: core_drive"), "{bad:?}: {e}");
    }
    let run = parse(&["10000", "red", "200000", "shuffled", "warm"]).unwrap();
    assert_eq!((run.streams, run.red, run.packets), (10_000, true, 200_000));
    assert!(run.shuffled && run.warm == Some(true));
    let run = parse(&["1", "plain", "0"]).unwrap();
    assert!(!run.shuffled && run.warm.is_none());
}
