//! A capture corrupt part-way (README "Replaying captures"): what the records before the corrupt
//! one began is flushed and left, then the error names the record (review, session 37: replay
//! returned at the error, its held text and leaves lost). The real binary on a written pcapng.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

#[path = "common/frames.rs"]
mod frames;
use frames::udp_ipv4;

/// One RTP packet.
fn rtp(pt: u8, marker: bool, seq: u16, ts: u32, ssrc: u32, payload: &[u8]) -> Vec<u8> {
    let mut p = vec![0x80, (u8::from(marker) << 7) | pt];
    p.extend_from_slice(&seq.to_be_bytes());
    p.extend_from_slice(&ts.to_be_bytes());
    p.extend_from_slice(&ssrc.to_be_bytes());
    p.extend_from_slice(payload);
    p
}

/// A little-endian pcapng block.
fn block(kind: u32, body: &[u8]) -> Vec<u8> {
    let mut body = body.to_vec();
    while !body.len().is_multiple_of(4) {
        body.push(0);
    }
    let len = (12 + body.len()) as u32;
    let mut b = kind.to_le_bytes().to_vec();
    b.extend_from_slice(&len.to_le_bytes());
    b.extend_from_slice(&body);
    b.extend_from_slice(&len.to_le_bytes());
    b
}

/// A little-endian pcapng, one raw-IP interface (microseconds), holding the Enhanced Packet
/// Blocks of (time in µs, UDP payload to 127.0.0.1:5004).
fn pcapng(packets: &[(u64, Vec<u8>)]) -> Vec<Vec<u8>> {
    let mut shb = 0x1a2b_3c4du32.to_le_bytes().to_vec();
    shb.extend_from_slice(&1u16.to_le_bytes());
    shb.extend_from_slice(&0u16.to_le_bytes());
    shb.extend_from_slice(&u64::MAX.to_le_bytes());
    let mut idb = 101u16.to_le_bytes().to_vec(); // LINKTYPE_RAW
    idb.extend_from_slice(&0u16.to_le_bytes());
    idb.extend_from_slice(&262_144u32.to_le_bytes());
    let mut blocks = vec![block(0x0a0d_0d0a, &shb), block(1, &idb)];
    for (us, payload) in packets {
        let ip = udp_ipv4([127, 0, 0, 1], 40000, [127, 0, 0, 1], 5004, payload);
        let mut epb = 0u32.to_le_bytes().to_vec();
        epb.extend_from_slice(&((us >> 32) as u32).to_le_bytes());
        epb.extend_from_slice(&(*us as u32).to_le_bytes());
        epb.extend_from_slice(&(ip.len() as u32).to_le_bytes());
        epb.extend_from_slice(&(ip.len() as u32).to_le_bytes());
        epb.extend_from_slice(&ip);
        blocks.push(block(6, &epb));
    }
    blocks
}

/// Runs `pvp-t140 replay` on `capture`: exit success, stdout envelopes, stderr.
fn replay(name: &str, capture: &[u8], args: &[&str]) -> (bool, Vec<Value>, String) {
    let path: PathBuf = std::env::temp_dir().join(format!(
        "pvp-t140-review-c-{name}-{}.pcapng",
        std::process::id()
    ));
    std::fs::write(&path, capture).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_pvp-t140"))
        .arg("replay")
        .arg(&path)
        .args(args)
        .output()
        .expect("run pvp-t140 replay");
    std::fs::remove_file(&path).ok();
    let envelopes = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    (
        out.status.success(),
        envelopes,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn of_type<'a>(envelopes: &'a [Value], kind: &str) -> Vec<&'a Value> {
    envelopes.iter().filter(|e| e["type"] == kind).collect()
}

/// A pcapng whose blocks are all whole but one in the middle is corrupt (its trailing Block
/// Total Length disagrees with its leading one: a bit flip, a bad copy) is refused as a
/// whole: "not a readable pcap/pcapng capture: NomError([], Verify)" (as if it were no
/// capture at all), exit 1. By then the
/// records before it have been fed to the core and their participant has joined on stdout,
/// but the replay never shuts the core down: the text it holds (here the unfinished sentence
/// "Hello there", waiting for its idle flush) is never written, and the participant never
/// leaves, so the NDJSON stream has a `session.join` (and "Hi.") without its `session.leave`.
///
/// README, Replaying captures: every timestamped frame moves the clock "and the replay ends at
/// the capture's last frame: the idle flushes and stream timeouts due in the time the capture
/// covers happen as they did live"; a capture that ends inside a record (`cut_short`) is
/// replayed "up to it", flushed and left "as Wireshark reads such a file" (capture.rs), and
/// Wireshark likewise shows every record before a corrupt one. The records before the
/// corrupt one must give their text and the leave, whatever the exit status says about the
/// file (it stays a failure, naming the file).
#[test]
fn a_corrupt_block_mid_capture_still_flushes_and_leaves_what_came_before() {
    let hello = rtp(98, true, 1, 0, 0x1234, b"Hi. Hello there");
    let later = rtp(98, false, 2, 3000, 0x1234, b" and more");
    let mut blocks = pcapng(&[
        (1_000_000, hello),
        (4_000_000, later.clone()),
        (4_500_000, later),
    ]);
    // The second packet's block: its trailing length no longer matches.
    let bad = blocks.len() - 2;
    let n = blocks[bad].len();
    let wrong = (n as u32 + 4).to_le_bytes();
    blocks[bad][n - 4..].copy_from_slice(&wrong);
    let (ok, envelopes, stderr) = replay("corrupt-mid", &blocks.concat(), &[]);
    assert!(
        !ok && stderr.contains("corrupt-mid"),
        "the error is still reported: {stderr}"
    );
    // And said as what it is: a corrupt record after whole ones, not a file that is no capture.
    assert!(
        stderr.contains("a corrupt record after the first 1 packet records")
            && !stderr.contains("not a readable"),
        "{stderr}"
    );
    let adds: Vec<&str> = of_type(&envelopes, "context.add")
        .iter()
        .map(|e| e["payload"]["content"].as_str().unwrap())
        .collect();
    assert_eq!(
        adds,
        ["Hi.", "Hello there"],
        "the text before the corrupt block is lost; stderr: {stderr}"
    );
    assert_eq!(of_type(&envelopes, "session.join").len(), 1, "{stderr}");
    assert_eq!(
        of_type(&envelopes, "session.leave").len(),
        1,
        "a join without its leave; stderr: {stderr}"
    );
}
