//! Cross-check against Wireshark: for every conformant RED capture in `pcaps/`, tshark's
//! RFC 2198 dissector and our parser must agree on every RED packet's blocks (payload type,
//! timestamp offset, length and bytes). Debian's tshark has no T.140 dissector, so the text
//! itself is checked by the replay tests; this pins the RED layer to an independent parser.
//!
//! `#[ignore]`d in a plain `cargo test` (it needs tshark); `.ci/run` installs tshark and runs it
//! with `--ignored`, where a missing tshark fails loudly.

use std::path::{Path, PathBuf};
use std::process::Command;

use pvp_t140::capture::read_udp;
use pvp_t140::red::RedPayload;
use pvp_t140::rtp::RtpPacket;

const RED_PT: u8 = 100;

/// One RED packet as a list of blocks `(pt, offset, len, hex)`, primary last with offset 0.
type Blocks = Vec<(u8, u16, usize, String)>;

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn ours(path: &Path) -> Vec<(u16, Blocks)> {
    let mut out = Vec::new();
    read_udp(path, |d| {
        let Ok(p) = RtpPacket::parse(&d.payload) else {
            return;
        };
        if p.payload_type != RED_PT {
            return;
        }
        let red = RedPayload::parse(p.payload).expect("conformant capture parses");
        assert!(
            !red.was_newest_first(),
            "{}: seq {} is not in age order",
            path.display(),
            p.sequence
        );
        let mut blocks: Blocks = red
            .redundant_blocks()
            .map(|b| (b.payload_type, b.ts_offset, b.data.len(), hex(b.data)))
            .collect();
        let prim = red.primary();
        blocks.push((prim.payload_type, 0, prim.data.len(), hex(prim.data)));
        out.push((p.sequence, blocks));
    })
    .expect("read capture");
    out
}

fn theirs(path: &Path) -> Vec<(u16, Blocks)> {
    let out = Command::new("tshark")
        .arg("-r")
        .arg(path)
        .args([
            "-d",
            "udp.port==5004,rtp",
            "-d",
            &format!("rtp.pt=={RED_PT},rtp_rfc2198"),
        ])
        .args([
            "-Y",
            &format!("rtp.p_type=={RED_PT}"),
            "-T",
            "fields",
            "-E",
            "separator=|",
        ])
        .args([
            "-e",
            "rtp.seq",
            "-e",
            "rtp.p_type",
            "-e",
            "rtp.timestamp-offset",
        ])
        .args(["-e", "rtp.block-length", "-e", "rtp.payload"])
        .output()
        .expect("tshark is not installed: this cross-check needs it (.ci/run installs it)");
    assert!(
        out.status.success(),
        "tshark failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let list = |s: &str| -> Vec<String> {
        s.split(',')
            .filter(|x| !x.is_empty())
            .map(str::to_owned)
            .collect()
    };
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|line| {
            let f: Vec<&str> = line.split('|').collect();
            let seq: u16 = f[0].parse().unwrap();
            // p_type: the RTP header's, then one per block header (primary last).
            let pts: Vec<u8> = list(f[1])
                .iter()
                .skip(1)
                .map(|x| x.parse().unwrap())
                .collect();
            let offs: Vec<u16> = list(f[2]).iter().map(|x| x.parse().unwrap()).collect();
            let lens: Vec<usize> = list(f[3]).iter().map(|x| x.parse().unwrap()).collect();
            // payload: the whole RTP payload, then one per block; empty blocks are "<MISSING>".
            let data: Vec<String> = list(f[4])
                .into_iter()
                .skip(1)
                .map(|x| if x == "<MISSING>" { String::new() } else { x })
                .collect();
            assert_eq!(pts.len(), offs.len() + 1, "{line}");
            assert_eq!(data.len(), pts.len(), "{line}");
            let mut blocks: Blocks = (0..offs.len())
                .map(|i| (pts[i], offs[i], lens[i], data[i].clone()))
                .collect();
            let last = data.last().unwrap().clone();
            blocks.push((*pts.last().unwrap(), 0, last.len() / 2, last));
            (seq, blocks)
        })
        .collect()
}

fn conformant_red_captures() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("pcaps");
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            // t140llm is not RFC 2198; malformed.pcap is broken on purpose.
            (name.ends_with(".pcap") || name.ends_with(".pcapng"))
                && !name.starts_with("t140llm_")
                && !name.starts_with("malformed")
        })
        .filter(|p| !ours(p).is_empty())
        .collect();
    v.sort();
    v
}

#[test]
#[ignore = "needs tshark; .ci/run installs it and runs this"]
fn our_red_parser_agrees_with_wireshark_on_every_conformant_capture() {
    let captures = conformant_red_captures();
    assert!(!captures.is_empty(), "no RED captures found in pcaps/");
    let mut packets = 0;
    for path in &captures {
        let (a, b) = (ours(path), theirs(path));
        assert_eq!(a, b, "{}", path.display());
        packets += a.len();
    }
    eprintln!(
        "tshark agrees on {packets} RED packets in {} captures",
        captures.len()
    );
}
