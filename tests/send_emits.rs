//! Found by review x: `pvp-t140 send` as a strict emitter. What the sans-IO sender puts on the wire,
//! parsed here independently of the crate's own parsers (RFC 3550 5.1, RFC 2198 3), and run
//! through the crate's gateway where the outcome is what a user sees.

use std::net::SocketAddr;

use pvp_t140::send::{Sender, SenderConfig};
use pvp_t140::{Config, Gateway, Time};

const T0: u64 = 1_700_000_000_000; // ms

fn at(ms: u64) -> Time {
    Time::from_millis(T0 + ms)
}

fn cfg(redundancy: u8) -> SenderConfig {
    SenderConfig {
        ssrc: 0x7265_7678,
        redundancy,
        initial_seq: 0xfff0,
        initial_ts: 0xffff_f000,
        cps: None,
        ..SenderConfig::default()
    }
}

/// An RTP packet read by hand (RFC 3550 5.1).
#[derive(Debug)]
struct Rtp {
    marker: bool,
    pt: u8,
    seq: u16,
    ts: u32,
    payload: Vec<u8>,
}

fn rtp(d: &[u8]) -> Rtp {
    assert!(d.len() >= 12, "short RTP: {d:?}");
    assert_eq!(d[0], 0x80, "V=2, no padding, no extension, no CSRC");
    Rtp {
        marker: d[1] & 0x80 != 0,
        pt: d[1] & 0x7f,
        seq: u16::from_be_bytes([d[2], d[3]]),
        ts: u32::from_be_bytes([d[4], d[5], d[6], d[7]]),
        payload: d[12..].to_vec(),
    }
}

/// RFC 2198 section 3 by hand: `(redundant (pt, offset, data) oldest first, primary pt, primary)`.
type Red = (Vec<(u8, u16, Vec<u8>)>, u8, Vec<u8>);

fn red(p: &[u8]) -> Red {
    let mut i = 0;
    let mut heads = Vec::new();
    loop {
        let b = p[i];
        if b & 0x80 == 0 {
            i += 1;
            break;
        }
        let v = u32::from_be_bytes([0, p[i + 1], p[i + 2], p[i + 3]]);
        heads.push((b & 0x7f, (v >> 10) as u16, (v & 0x3ff) as usize));
        i += 4;
    }
    let primary_pt = p[i - 1] & 0x7f;
    let mut gens = Vec::new();
    for (pt, off, len) in heads {
        gens.push((pt, off, p[i..i + len].to_vec()));
        i += len;
    }
    (gens, primary_pt, p[i..].to_vec())
}

/// Runs a RED sender: `(ms, datagram)` of everything it sends, `script` pushed at its times and
/// the sender polled on its own timeouts, except that it is not polled at all between
/// `stall.0` and `stall.1` ms (the process stopped: Ctrl-Z, a debugger, a swapped-out host).
fn drive(s: &mut Sender, script: &[(u64, &str)], stall: (u64, u64)) -> Vec<(u64, Vec<u8>)> {
    let mut out = Vec::new();
    let mut next = 0;
    let mut now = 0u64;
    loop {
        while next < script.len() && script[next].0 <= now {
            s.push_text(at(now), script[next].1);
            next += 1;
        }
        while let Some(d) = s.poll_packet(at(now)) {
            out.push((now, d));
        }
        let due = s.poll_timeout().map(|t| t.as_millis() - T0);
        // Stopped: nothing is read or sent until the stall ends.
        let stopped = |t: u64| {
            if t > stall.0 && t < stall.1 {
                stall.1
            } else {
                t
            }
        };
        now = match (due.map(stopped), script.get(next).map(|s| stopped(s.0))) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => match a.or(b) {
                Some(t) => t,
                None => break,
            },
        };
        assert!(
            out.len() < 20_000,
            "the sender never goes idle: {:?}, backlog {}",
            out[out.len() - 5..]
                .iter()
                .map(|(ms, d)| (*ms, d.len()))
                .collect::<Vec<_>>(),
            s.backlog()
        );
    }
    out
}

/// RFC 2198 section 3: a redundant block's "timestamp offset" is the offset of its data's
/// timestamp from the packet's, in a 14-bit field; RFC 4103 4.2 places generation k of a
/// packet as the primary of the packet k sequence numbers back. A block whose packet is too
/// far back for 14 bits (a sender not polled for 20 s while its redundancy was pending: the
/// process stopped with Ctrl-Z, then resumed) was sent as an *empty* block with an invented
/// offset (300, 600 ms), saying that packet carried no text. When that packet was lost, the
/// receiver takes the empty block for it: the text is gone and nothing marks the loss. A block
/// that cannot be placed must be left out (fewer generations; a receiver counts back from the
/// primary), so that the receiver sees the loss and marks it (U+FFFD, RFC 4103 5.3).
#[test]
fn a_generation_too_old_for_14_bits_is_left_out_not_sent_as_empty() {
    let mut s = Sender::new(cfg(2), at(0));
    // "Bye now." goes out at 5000 (after an idle period); the process then stops for 20 s.
    let sent = drive(
        &mut s,
        &[(0, "Hello there. "), (5000, "Bye now. ")],
        (5000, 25_000),
    );
    let pkts: Vec<(u64, Rtp)> = sent.iter().map(|(ms, d)| (*ms, rtp(d))).collect();
    let by_seq = |seq: u16| pkts.iter().find(|(_, p)| p.seq == seq).map(|(_, p)| p);
    // Every redundant block is the primary of the packet it counts back to, at that packet's
    // true timestamp offset.
    for (ms, p) in &pkts {
        assert_eq!(p.pt, 100);
        assert_eq!(p.marker, *ms == 0 || *ms == 5000, "marker at {ms} ms");
        let (gens, ppt, _) = red(&p.payload);
        assert_eq!(ppt, 98);
        let n = gens.len();
        for (k, (pt, off, data)) in gens.iter().enumerate() {
            assert_eq!(*pt, 98);
            let back = (n - k) as u16;
            let Some(q) = by_seq(p.seq.wrapping_sub(back)) else {
                assert!(data.is_empty(), "a block for a packet never sent has text");
                continue;
            };
            let (_, _, qprimary) = red(&q.payload);
            assert_eq!(data, &qprimary, "packet at {ms} ms, generation {back} back");
            assert_eq!(
                u32::from(*off),
                p.ts.wrapping_sub(q.ts),
                "packet at {ms} ms: generation {back} back says offset {off}, the packet it \
                 stands for is {} ms back",
                p.ts.wrapping_sub(q.ts)
            );
        }
    }
}

/// The same stall, as a user sees it: the packet with "Bye now." is lost, the rest arrives,
/// and the gateway must mark the loss.
#[test]
fn text_lost_before_a_stall_longer_than_14_bits_of_offset_is_marked() {
    let mut s = Sender::new(cfg(2), at(0));
    let sent = drive(
        &mut s,
        &[(0, "Hello there. "), (5000, "Bye now. ")],
        (5000, 25_000),
    );
    let source = SocketAddr::from(([192, 0, 2, 7], 5004));
    let mut gw = Gateway::new(Config::default());
    for (ms, d) in &sent {
        if *ms != 5000 {
            gw.handle_datagram(at(*ms), source, d);
        }
        gw.handle_timeout(at(*ms));
    }
    gw.handle_timeout(at(40_000));
    gw.shutdown(at(40_000));
    let mut shown = String::new();
    while let Some(e) = gw.poll_output().map(|e| e.to_message()) {
        if e.kind == "context.add" {
            shown.push_str(e.payload["content"].as_str().unwrap());
        }
    }
    assert!(shown.contains("Hello there."), "{shown:?}");
    assert!(
        shown.contains('\u{fffd}'),
        "the lost text went unmarked: {shown:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// `pvp-t140 send`'s shell (`udp::send_text`) over loopback.

/// An input that hands out what the test sends it, read by read, and ends when the test drops
/// its end: a terminal or a pipe whose writer is still there.
struct Fed(tokio::sync::mpsc::UnboundedReceiver<Vec<u8>>);

impl tokio::io::AsyncRead for Fed {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match self.0.poll_recv(cx) {
            std::task::Poll::Ready(Some(c)) => {
                buf.put_slice(&c);
                std::task::Poll::Ready(Ok(()))
            }
            std::task::Poll::Ready(None) => std::task::Poll::Ready(Ok(())),
            std::task::Poll::Pending => std::task::Poll::Pending,
        }
    }
}

fn is_rtcp(d: &[u8]) -> bool {
    d.len() >= 8 && (200..=204).contains(&d[1])
}

/// The primary text of an RTP datagram from a `send` with `--red` > 0.
fn primary_text(d: &[u8]) -> String {
    let p = rtp(d);
    String::from_utf8(red(&p.payload).2).expect("UTF-8")
}

/// A terminal in raw mode sends a lone CR for Enter, each key its own read (README: "sends each
/// new line, LF, CR LF or a lone CR, as T.140's U+2028"). The shell held back a CR that ended
/// a read until the next read, in case it brought the LF of a CR LF: so the new line of a user
/// who pressed Enter and stopped typing did not go out at all, the sender went idle without
/// it, and the receiver saw it only with the next key (or at the end of input). Real-time text
/// (RFC 4103 5.1) sends what was typed within the buffer time. A CR is a new line at once; an
/// LF that begins the next read after it is the rest of that CR LF and is dropped.
#[test]
fn a_new_line_typed_as_a_lone_cr_goes_out_without_waiting_for_the_next_key() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let rx = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let to = rx.local_addr().unwrap();
        let (feed, input) = tokio::sync::mpsc::unbounded_channel();
        let send = tokio::spawn(pvp_t140::udp::send_text(to, cfg(2), Fed(input), true));
        feed.send(b"Hello\r".to_vec()).unwrap();
        // Until the sender is idle: its text packet, then the two empty packets of its
        // redundancy tail.
        let mut rtp_pkts = Vec::new();
        let mut buf = vec![0u8; 2048];
        while rtp_pkts.len() < 3 {
            let (n, _) =
                tokio::time::timeout(std::time::Duration::from_secs(10), rx.recv_from(&mut buf))
                    .await
                    .expect("the sender sends")
                    .unwrap();
            if !is_rtcp(&buf[..n]) {
                rtp_pkts.push(buf[..n].to_vec());
            }
        }
        let shown: Vec<String> = rtp_pkts.iter().map(|d| primary_text(d)).collect();
        // Then a CR LF split across reads, and the input ends: one new line, not two.
        feed.send(b"Bye\r".to_vec()).unwrap();
        feed.send(b"\n".to_vec()).unwrap();
        drop(feed);
        send.await.unwrap().unwrap();
        let mut all = shown.concat();
        while let Ok(Ok((n, _))) = tokio::time::timeout(
            std::time::Duration::from_millis(300),
            rx.recv_from(&mut buf),
        )
        .await
        {
            if !is_rtcp(&buf[..n]) {
                all.push_str(&primary_text(&buf[..n]));
            }
        }
        assert_eq!(
            shown,
            ["\u{feff}Hello\u{2028}", "", ""],
            "the sender went idle without the new line typed"
        );
        assert_eq!(all, "\u{feff}Hello\u{2028}Bye\u{2028}");
    });
}

/// A terminal in raw mode gives Ctrl-C and Ctrl-D as the bytes ETX and EOT, not as SIGINT and
/// the end of input (README: either ends the input there). They went out as text, which a
/// receiver drops as controls, and the sender went on reading: nothing typed could end the
/// session. The input here stays open; the sender must end at the key, send what came before
/// it and nothing after, and its BYE.
#[test]
fn ctrl_c_or_ctrl_d_typed_in_a_raw_terminal_ends_the_input() {
    for key in [b'\x03', b'\x04'] {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let rx = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
            let to = rx.local_addr().unwrap();
            let (feed, input) = tokio::sync::mpsc::unbounded_channel();
            let send = tokio::spawn(pvp_t140::udp::send_text(to, cfg(0), Fed(input), true));
            feed.send([b"Bye".as_slice(), &[key], b" not this"].concat())
                .unwrap();
            tokio::time::timeout(std::time::Duration::from_secs(10), send)
                .await
                .expect("the input ended at the key, with the input still open")
                .unwrap()
                .unwrap();
            let mut text = String::new();
            let mut bye = false;
            let mut buf = vec![0u8; 2048];
            while let Ok(Ok((n, _))) = tokio::time::timeout(
                std::time::Duration::from_millis(300),
                rx.recv_from(&mut buf),
            )
            .await
            {
                match is_rtcp(&buf[..n]) {
                    true => pvp_t140::rtcp::parse(&buf[..n], &mut |e| {
                        bye |= matches!(e, pvp_t140::rtcp::RtcpEvent::Bye { .. })
                    })
                    .then_some(())
                    .expect("a valid RTCP compound"),
                    false => {
                        text.push_str(std::str::from_utf8(&rtp(&buf[..n]).payload).expect("UTF-8"))
                    }
                }
            }
            assert_eq!(text, "\u{feff}Bye", "key {key:#x}");
            assert!(bye, "a BYE after key {key:#x}");
            drop(feed);
        });
    }
}

// ---------------------------------------------------------------------------------------------
// Invariants over random typing, checked on the wire by hand.

/// Random scripts (words and pastes, with combining marks, emoji, new lines and backspaces,
/// typed at random moments, some exactly on the sender's ticks), for every `--red` and a few
/// `cps`: what the sender emits keeps RFC 3550 5.1 (sequence +1, timestamps on the 1000 Hz
/// clock, strictly increasing), RFC 2198 3 (each generation the primary of the packet it counts
/// back to, at its true offset), RFC 4103 5.1/5.2 (packets of a transmission a buffer time
/// apart; the marker on the first packet and on the first after the idle period only), 6 (no
/// more than `cps` characters in any second), T.140 (one BOM, first) and the datagram bound.
#[test]
fn random_typing_keeps_every_rule_on_the_wire() {
    let pieces = [
        "a",
        "Hello",
        " ",
        "world. ",
        "e\u{301}",
        "日本語",
        "😀",
        "👩\u{200d}💻",
        "\u{2028}",
        "\u{8}",
        "x",
    ];
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut rnd = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    for round in 0..120 {
        let red_n = (round % 4) as u8;
        let cps = [None, Some(30), Some(7), Some(1)][(round / 4 % 4) as usize];
        let mut s = Sender::new(SenderConfig { cps, ..cfg(red_n) }, at(0));
        // The script: (ms, text); some on multiples of 300 (the sender's ticks).
        let mut script: Vec<(u64, String)> = Vec::new();
        let mut t = 0;
        for _ in 0..(5 + rnd(30)) {
            t += match rnd(5) {
                0 => 0,
                1 => 300 * (1 + rnd(4)),
                2 => rnd(400),
                3 => 1000 + rnd(3000),
                // A pause longer than RED's 14-bit offset reaches.
                _ => 16_000 + rnd(10_000),
            };
            let mut text = String::new();
            // Pastes only where `cps` lets them out in minutes, not hours.
            let paste = rnd(10) == 0 && cps.is_none_or(|c| c >= 30);
            let n = if paste { 200 + rnd(900) } else { 1 + rnd(6) };
            for _ in 0..n {
                text.push_str(pieces[rnd(pieces.len() as u64) as usize]);
            }
            script.push((t, text));
        }
        let typed: String = script.iter().map(|(_, t)| t.as_str()).collect();
        let refs: Vec<(u64, &str)> = script.iter().map(|(t, s)| (*t, s.as_str())).collect();
        // Some rounds stop the process for up to 16 s (Ctrl-Z) somewhere in the script.
        let stall = match rnd(3) {
            0 => {
                let from = rnd(t + 1);
                (from, from + 1000 + rnd(15_000))
            }
            _ => (u64::MAX, u64::MAX),
        };
        let sent = drive(&mut s, &refs, stall);
        let ctx = format!("round {round}, red {red_n}, cps {cps:?}, stall {stall:?}");
        let pkts: Vec<(u64, Rtp)> = sent.iter().map(|(ms, d)| (*ms, rtp(d))).collect();
        let primaries: Vec<Vec<u8>> = pkts
            .iter()
            .map(|(_, p)| {
                if red_n == 0 {
                    p.payload.clone()
                } else {
                    red(&p.payload).2
                }
            })
            .collect();
        let mut shown = String::new();
        for (i, (ms, p)) in pkts.iter().enumerate() {
            assert!(sent[i].1.len() <= 1200, "{ctx}: {} bytes", sent[i].1.len());
            assert_eq!(p.seq, cfg(0).initial_seq.wrapping_add(i as u16), "{ctx}");
            assert_eq!(
                p.ts,
                cfg(0).initial_ts.wrapping_add(*ms as u32),
                "{ctx}: at {ms}"
            );
            assert_eq!(p.pt, if red_n == 0 { 98 } else { 100 }, "{ctx}");
            let text = std::str::from_utf8(&primaries[i]).expect("whole UTF-8 characters");
            assert_eq!(
                text.starts_with('\u{feff}'),
                i == 0,
                "{ctx}: BOM at packet {i}"
            );
            shown.push_str(text);
            if i > 0 {
                let prev = pkts[i - 1].0;
                if !p.marker {
                    assert!(
                        ms - prev >= 300,
                        "{ctx}: unmarked packet {} ms after",
                        ms - prev
                    );
                }
            } else {
                assert!(p.marker, "{ctx}: the first packet is marked");
            }
            if red_n > 0 {
                let (gens, ppt, _) = red(&p.payload);
                assert_eq!(ppt, 98);
                // Every generation, but those with text too far back for the 14-bit offset.
                let n = gens.len();
                assert!(n <= usize::from(red_n), "{ctx}");
                if n < usize::from(red_n) {
                    let left_out = p.ts.wrapping_sub(pkts[i - n - 1].1.ts);
                    assert!(
                        left_out > 0x3fff,
                        "{ctx}: packet {i} left out {left_out} ms back"
                    );
                    assert!(!primaries[i - n - 1].is_empty(), "{ctx}: packet {i}");
                }
                for (k, (pt, off, data)) in gens.iter().enumerate() {
                    assert_eq!(*pt, 98);
                    let back = gens.len() - k;
                    if back > i {
                        assert!(data.is_empty(), "{ctx}");
                        continue;
                    }
                    assert_eq!(data, &primaries[i - back], "{ctx}: packet {i} gen {back}");
                    if data.is_empty() && p.ts.wrapping_sub(pkts[i - back].1.ts) > 0x3fff {
                        // An empty block for a packet too far back: no offset can say it.
                        continue;
                    }
                    assert_eq!(
                        u32::from(*off),
                        p.ts.wrapping_sub(pkts[i - back].1.ts),
                        "{ctx}: packet {i} gen {back}"
                    );
                }
            }
        }
        assert_eq!(shown, format!("\u{feff}{typed}"), "{ctx}");
        // RFC 4103 5.2: after text, at most `tail` empty packets before the next text (exactly
        // `tail` at the end), and a marked packet only after a whole tail.
        let tail = usize::from(red_n.max(1));
        let mut empties = 0;
        for (i, prim) in primaries.iter().enumerate() {
            if pkts[i].1.marker && i > 0 {
                assert_eq!(
                    empties, tail,
                    "{ctx}: marked packet {i} before its tail ended"
                );
            }
            if prim.is_empty() {
                empties += 1;
                assert!(empties <= tail, "{ctx}: empty packet {i} past the tail");
            } else {
                empties = 0;
            }
        }
        assert_eq!(empties, tail, "{ctx}: the tail at the end");
        // cps: characters (BOM aside) in any one-second window.
        if let Some(cps) = cps {
            for (i, (ms, _)) in pkts.iter().enumerate() {
                let used: usize = (0..=i)
                    .filter(|j| pkts[*j].0 + 1000 > *ms)
                    .map(|j| {
                        std::str::from_utf8(&primaries[j])
                            .unwrap()
                            .trim_start_matches('\u{feff}')
                            .chars()
                            .count()
                    })
                    .sum();
                assert!(
                    used as u32 <= cps,
                    "{ctx}: {used} characters in the second to {ms}"
                );
            }
        }
    }
}

/// The RTCP of `send` over loopback, read by hand (RFC 3550 6.1, 6.4.1, 6.5, 6.6): a compound
/// of a report first, then an SDES with a CNAME, each length the words it has, an SDES chunk's
/// items ended by a null octet and padded to 32 bits; the SR's counts those of the RTP that
/// came before it, its NTP time the wall clock's, and its RTP timestamp on the same clock as
/// the packets' (1000 Hz, same offset); the BYE compound last.
#[test]
fn send_rtcp_read_by_hand() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let rx = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let to = rx.local_addr().unwrap();
        let (feed, input) = tokio::sync::mpsc::unbounded_channel();
        let c = SenderConfig {
            name: Some("Ada Lovelace".into()),
            ..cfg(2)
        };
        let send = tokio::spawn(pvp_t140::udp::send_text(to, c, Fed(input), true));
        feed.send(b"Hello there.\n".to_vec()).unwrap();
        let now_ms = || {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_millis() as i64
        };
        // (arrival ms, datagram) until the first report.
        let mut got: Vec<(i64, Vec<u8>)> = Vec::new();
        let mut buf = vec![0u8; 2048];
        loop {
            let (n, _) =
                tokio::time::timeout(std::time::Duration::from_secs(10), rx.recv_from(&mut buf))
                    .await
                    .expect("a report within 10 s")
                    .unwrap();
            got.push((now_ms(), buf[..n].to_vec()));
            if is_rtcp(&buf[..n]) {
                break;
            }
        }
        drop(feed);
        send.await.unwrap().unwrap();
        while let Ok(Ok((n, _))) = tokio::time::timeout(
            std::time::Duration::from_millis(300),
            rx.recv_from(&mut buf),
        )
        .await
        {
            got.push((now_ms(), buf[..n].to_vec()));
        }
        let ssrc = cfg(2).ssrc;
        let rtcp: Vec<&(i64, Vec<u8>)> = got.iter().filter(|(_, d)| is_rtcp(d)).collect();
        assert!(rtcp.len() >= 2, "a report and the BYE");
        for (k, (arrived, d)) in rtcp.iter().enumerate() {
            // Walk the compound.
            let mut types = Vec::new();
            let mut i = 0;
            while i < d.len() {
                assert_eq!(d[i] >> 6, 2, "version 2");
                assert_eq!(d[i] & 0x20, 0, "no padding");
                let count = d[i] & 0x1f;
                let pt = d[i + 1];
                let len = (usize::from(u16::from_be_bytes([d[i + 2], d[i + 3]])) + 1) * 4;
                assert!(i + len <= d.len(), "length within the datagram");
                let body = &d[i..i + len];
                assert_eq!(u32::from_be_bytes(body[4..8].try_into().unwrap()), ssrc);
                match pt {
                    200 => {
                        assert_eq!((count, len), (0, 28), "SR, no report blocks");
                        let w = |o: usize| u32::from_be_bytes(body[o..o + 4].try_into().unwrap());
                        let ntp_ms = (i64::from(w(8)) - 2_208_988_800) * 1000
                            + ((i64::from(w(12)) * 1000) >> 32);
                        assert!(
                            (ntp_ms - arrived).abs() < 1000,
                            "NTP time {ntp_ms} against arrival {arrived}"
                        );
                        // Counts: the RTP that arrived before this compound.
                        let before: Vec<&Vec<u8>> = got
                            .iter()
                            .take_while(|(_, g)| g != d)
                            .map(|(_, g)| g)
                            .filter(|g| !is_rtcp(g))
                            .collect();
                        assert_eq!(w(20) as usize, before.len(), "packet count");
                        let octets: usize = before.iter().map(|g| g.len() - 12).sum();
                        assert_eq!(w(24) as usize, octets, "octet count");
                        // The RTP timestamp: the last packet's plus the wall time since.
                        let (last_at, last) = got
                            .iter()
                            .take_while(|(_, g)| g != d)
                            .filter(|(_, g)| !is_rtcp(g))
                            .last()
                            .unwrap();
                        let ts_gap = w(16).wrapping_sub(rtp(last).ts) as i32;
                        let wall_gap = (ntp_ms - last_at) as i32;
                        assert!(
                            (ts_gap - wall_gap).abs() < 200,
                            "SR RTP time {ts_gap} ms after the last packet's, {wall_gap} ms of \
                             NTP time"
                        );
                    }
                    201 => assert_eq!((count, len), (0, 8), "an empty RR"),
                    202 => {
                        assert_eq!(count, 1, "one chunk");
                        // Items after the SSRC until a null, then padding to 32 bits.
                        let mut j = 8;
                        let mut items = Vec::new();
                        while body[j] != 0 {
                            let n = usize::from(body[j + 1]);
                            items.push((
                                body[j],
                                String::from_utf8(body[j + 2..j + 2 + n].to_vec()),
                            ));
                            j += 2 + n;
                        }
                        assert!(body[j..].iter().all(|b| *b == 0), "null and padding");
                        assert!(len - j <= 4, "no more than one word of nulls");
                        assert_eq!(items[0].0, 1, "CNAME first");
                        assert_eq!(
                            items[0].1.as_deref().unwrap(),
                            format!("pvp-t140-{ssrc:08x}@127.0.0.1")
                        );
                        assert_eq!(items[1], (2, Ok("Ada Lovelace".to_string())));
                    }
                    203 => {
                        assert_eq!((count, len), (1, 8), "BYE for one source, no reason");
                        assert_eq!(k, rtcp.len() - 1, "the BYE is the last compound");
                        assert!(
                            std::ptr::eq(rtcp[k], got.last().unwrap()),
                            "and the last datagram"
                        );
                    }
                    other => panic!("unexpected RTCP type {other}"),
                }
                types.push(pt);
                i += len;
            }
            assert!(matches!(types[0], 200 | 201), "a report first: {types:?}");
            assert_eq!(types[1], 202, "then the SDES: {types:?}");
        }
    });
}

/// Runs `udp::send_text` over loopback on `reads` (one read each) and hands every datagram to a
/// gateway: the transcript it makes (`context.add` contents joined).
fn send_to_gateway(reads: &[&[u8]]) -> String {
    let (got, _) = send_over_loopback(reads);
    let source = SocketAddr::from(([127, 0, 0, 1], 40_000));
    let mut gw = Gateway::new(Config::default());
    for (i, d) in got.iter().enumerate() {
        gw.handle_datagram(at(i as u64 * 300), source, d);
    }
    gw.shutdown(at(60_000));
    let mut shown = Vec::new();
    while let Some(e) = gw.poll_output().map(|e| e.to_message()) {
        if e.kind == "context.add" {
            shown.push(e.payload["content"].as_str().unwrap().to_owned());
        }
    }
    shown.join(" ")
}

/// Runs `udp::send_text` over loopback on `reads` (one read each): the datagrams it sent, and
/// its counts.
fn send_over_loopback(reads: &[&[u8]]) -> (Vec<Vec<u8>>, pvp_t140::send::SenderStats) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let rx = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let to = rx.local_addr().unwrap();
        let (feed, input) = tokio::sync::mpsc::unbounded_channel();
        for r in reads {
            feed.send(r.to_vec()).unwrap();
        }
        drop(feed);
        let stats = pvp_t140::udp::send_text(to, cfg(2), Fed(input), true)
            .await
            .unwrap();
        let mut got = Vec::new();
        let mut buf = vec![0u8; 2048];
        while let Ok(Ok((n, _))) = tokio::time::timeout(
            std::time::Duration::from_millis(300),
            rx.recv_from(&mut buf),
        )
        .await
        {
            got.push(buf[..n].to_vec());
        }
        (got, stats)
    })
}

/// T.140 (section 6) names the controls a sender may use: BS, U+2028, BEL, SGR and INT. A
/// coloured log piped into `send` (`ESC [ K` to clear a line, `ESC ( B`, NUL) went on the wire
/// byte for byte, though no receiver shows it and receivers differ on it: strict in what it
/// emits, the sender leaves them out, counts them, and keeps the SGR and a tab as a space.
#[test]
fn controls_t140_has_not_are_left_out_of_the_wire_and_counted() {
    let (got, stats) = send_over_loopback(&[
        b"\x1b[1mbold\x1b[0m\x1b[K \x1b(Bplain\x00\tend.\x1b",
        b"[2J\x1b[31",
        b"mred.",
    ]);
    let wire: String = (got.iter())
        .filter(|d| !is_rtcp(d))
        .map(|d| primary_text(d))
        .collect();
    assert_eq!(wire, "\u{feff}\x1b[1mbold\x1b[0m plain end.\x1b[31mred.");
    assert_eq!(stats.left_out, 4, "ESC [ K, ESC ( B, NUL and ESC [ 2 J");
}

/// A terminal in raw mode, which `send` reads (README: it sends a lone CR for Enter, taken as a
/// new line), sends DEL (0x7F) for the Backspace key: xterm, GNOME Terminal, macOS Terminal,
/// the Linux console all do by default (`stty -a`: `erase = ^?`). T.140's erase is BS
/// (U+0008); DEL is no T.140 function, and receivers drop it as a control (this gateway does,
/// README "a tab is a space; backspace U+0008 erases"). Sent as it was, the user's correction
/// was lost: "Helo<Backspace>lo" showed as "Helolo". The sender maps DEL to BS, as it maps a
/// CR to T.140's new line.
#[test]
fn a_raw_terminals_backspace_key_erases_at_the_receiver() {
    let shown = send_to_gateway(&[b"Helo", b"\x7f", b"lo there.\r"]);
    assert_eq!(shown, "Hello there.");
}

/// RFC 3550 5.1: the timestamp is the clock's (1000 Hz here, RFC 4103 3), and the SR says
/// which wall time it stands for (6.4.1). The sender keeps two packets in the same
/// millisecond apart by one tick; it took "not after the last packet's, modulo 2^32 the
/// nearer way round" for such a collision, so after more than 2^31 ms (24.9 days) with no RTP
/// (a captioning pipeline left open over a quiet month, its RTCP going on) every packet was
/// stamped one tick after the last, 300 ms apart on the wire and 1 ms apart in their stamps,
/// and far from what its sender reports said of the clock.
#[test]
fn timestamps_stay_on_the_clock_after_a_month_without_rtp() {
    let mut s = Sender::new(cfg(0), at(0));
    let mut sent = drive(&mut s, &[(0, "a")], (u64::MAX, u64::MAX));
    let month = 30 * 24 * 3600 * 1000u64;
    sent.extend(drive_from(
        &mut s,
        month,
        &[(month, "b"), (month + 100, "c")],
    ));
    for (ms, d) in &sent {
        assert_eq!(
            rtp(d).ts,
            cfg(0).initial_ts.wrapping_add(*ms as u32),
            "the packet at {ms} ms: {:?}",
            sent.iter()
                .map(|(ms, d)| (*ms, rtp(d).ts))
                .collect::<Vec<_>>()
        );
    }
}

/// [`drive`] from `start` ms on, with no stall.
fn drive_from(s: &mut Sender, start: u64, script: &[(u64, &str)]) -> Vec<(u64, Vec<u8>)> {
    let mut out = Vec::new();
    let mut next = 0;
    let mut now = start;
    loop {
        while next < script.len() && script[next].0 <= now {
            s.push_text(at(now), script[next].1);
            next += 1;
        }
        while let Some(d) = s.poll_packet(at(now)) {
            out.push((now, d));
        }
        let due = s.poll_timeout().map(|t| t.as_millis() - T0);
        now = match (due, script.get(next).map(|s| s.0)) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => match a.or(b) {
                Some(t) => t,
                None => return out,
            },
        };
    }
}
