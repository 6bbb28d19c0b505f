//! Seeds `fuzz/corpus/<target>/` from the real captures in `pcaps/` (`t140llm*` ones are
//! replayed in t140llm compat mode):
//!
//! * `pcap_read`: the capture files themselves;
//! * `rtp_parse`: UDP payloads (distinct, at most 16);
//! * `red_parse`: RTP payloads of RED (PT 100) packets (at most 10);
//! * `t140_decode`: a T.140 text payload, and each stream's whole text, with a few cut points;
//! * `gateway`: each capture as a sequence of events (datagrams, sources, time steps).
//!
//! `cargo run --manifest-path fuzz/Cargo.toml --example make_corpus` (from the repository root;
//! files are named by content, so reruns add nothing new).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use pvp_t140::capture::read_udp;
use pvp_t140::red::RedPayload;
use pvp_t140::rtp::RtpPacket;
use pvp_t140_fuzz::{CONFIG_STANDARD, CONFIG_T140LLM, encode_datagram};

const RED_PT: u8 = 100;
const T140_PT: u8 = 98;

fn write(dir: &Path, data: &[u8]) {
    // Stable content names (not a cryptographic hash: only to dedupe).
    let mut h = DefaultHasher::new();
    data.hash(&mut h);
    fs::write(dir.join(format!("seed-{:016x}", h.finish())), data).expect("write seed");
}

/// At most `n` of `items`, spread evenly.
fn sample(items: BTreeSet<Vec<u8>>, n: usize) -> Vec<Vec<u8>> {
    let len = items.len();
    let step = len.div_ceil(n).max(1);
    items.into_iter().step_by(step).collect()
}

fn main() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let corpus = root.join("fuzz/corpus");
    let dirs: HashMap<&str, PathBuf> = [
        "rtp_parse",
        "red_parse",
        "t140_decode",
        "pcap_read",
        "gateway",
    ]
    .into_iter()
    .map(|t| (t, corpus.join(t)))
    .collect();
    for d in dirs.values() {
        fs::create_dir_all(d).expect("mkdir");
    }
    let mut captures: Vec<PathBuf> = fs::read_dir(root.join("pcaps"))
        .expect("pcaps/")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "pcap" || e == "pcapng"))
        .collect();
    captures.sort();

    let mut rtp = BTreeSet::new();
    let mut red = BTreeSet::new();
    let mut t140 = BTreeSet::new();
    for cap in &captures {
        let name = cap.file_name().expect("name");
        fs::copy(cap, dirs["pcap_read"].join(name)).expect("copy");
        let t140llm = name.to_string_lossy().starts_with("t140llm");
        let mut events = vec![if t140llm {
            CONFIG_T140LLM
        } else {
            CONFIG_STANDARD
        }];
        let mut sources: BTreeMap<SocketAddr, u8> = BTreeMap::new();
        let mut texts: BTreeMap<(SocketAddr, u32), Vec<u8>> = BTreeMap::new();
        let mut last = None;
        read_udp(cap, |d| {
            let n = sources.len() as u8;
            let idx = *sources.entry(d.source).or_insert(if d.source.is_ipv6() {
                4 + n % 4
            } else {
                n % 4
            });
            let step = last.map_or(0, |t: pvp_t140::Time| d.time.0.saturating_sub(t.0));
            last = Some(d.time);
            encode_datagram(&mut events, idx, step, &d.payload);
            rtp.insert(d.payload.clone());
            if let Ok(p) = RtpPacket::parse(&d.payload) {
                if p.payload_type == RED_PT {
                    red.insert(p.payload.to_vec());
                    if let Ok(r) = RedPayload::parse(p.payload) {
                        texts
                            .entry((d.source, p.ssrc))
                            .or_default()
                            .extend_from_slice(r.primary().data);
                    }
                } else if p.payload_type == T140_PT {
                    // Head 0: no cut points, chunk size 1.
                    t140.insert([&[0u8][..], p.payload].concat());
                    texts
                        .entry((d.source, p.ssrc))
                        .or_default()
                        .extend_from_slice(p.payload);
                }
            }
        })
        .unwrap_or_else(|e| {
            eprintln!("{}: {e} (seeded up to the error)", cap.display());
            Default::default()
        });
        write(&dirs["gateway"], &events);
        for text in texts.into_values() {
            // Head: 3 cut points, chunk size 32.
            let cuts = [1u8, 2, 5];
            t140.insert([&[3 | 31 << 3][..], &cuts, &text].concat());
        }
    }
    for (dir, set, n) in [
        ("rtp_parse", rtp, 16),
        ("red_parse", red, 10),
        ("t140_decode", t140, 12),
    ] {
        for s in sample(set, n) {
            write(&dirs[dir], &s);
        }
    }
}
