//! Review A (session 37) of cf481b7 (forget_evicted by the BYE's address; a live mixer's
//! SDES names for unheard sources carry `via`) and 2917420 (`send`'s second signal, stdout
//! busy /healthz). The sans-IO core driven directly.

use pvp_t140::pvp::Message as Envelope;
use pvp_t140::{Config, Gateway};

#[path = "common/core.rs"]
mod core_helpers;
use core_helpers::*;

#[path = "common/mixer.rs"]
mod mixer_helpers;
use mixer_helpers::*;

/// A stream's own compound RTCP: an empty RR, then an SDES with its CNAME and NAME.
fn own_sdes(ssrc: u32, cname: &str, name: Option<&str>) -> Vec<u8> {
    let mut d = Vec::new();
    pvp_t140::rtcp::write_rr(&mut d, ssrc);
    pvp_t140::rtcp::write_sdes(&mut d, ssrc, cname, name);
    d
}

/// The `session.join` names of the speakers whose id ends with `suffix`.
fn join_names(out: &[Envelope], suffix: &str) -> Vec<String> {
    out.iter()
        .filter(|e| e.kind == "session.join" && e.sender.ends_with(suffix))
        .map(|e| {
            e.payload["participant"]["name"]
                .as_str()
                .unwrap_or("")
                .to_owned()
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// 1. A mixer's forwarded BYE for its source ends the eviction record of another port's stream
//    whose SSRC equals that CSRC (the host fallback of forget_evicted).
// ---------------------------------------------------------------------------------------------

/// Caller P (SSRC 5, port 6000) opens with its BOM. Mixer M (SSRC 9, port 4000) opens with
/// its source 7's BOM. Junk streams (SSRCs 100-102, port 5000) evict both (limit 3; records
/// kept). If `bye`, M forwards its source 5's BYE from its RTCP port 4001 (an RR of M, then
/// BYE 5: RFC 3550 6.6, 7.3). Then P comes back: "Hello. " in its packet 2. Returns P's text
/// and all envelopes' content.
fn caller_after_mixer_forwards_bye(bye: bool) -> (String, Vec<(String, String)>) {
    let mut gw = Gateway::new(Config {
        max_streams: 3,
        ..Config::default()
    });
    gw.handle_datagram(at(0), addr(6000), &t140(1, 5, "\u{feff}"));
    gw.handle_datagram(
        at(10),
        addr(4000),
        &red_csrc(1, 1000, 7, &[], "\u{feff}".as_bytes()),
    );
    gw.handle_datagram(at(50), addr(5000), &t140(1, 100, ""));
    gw.handle_datagram(at(1_100), addr(5000), &t140(1, 101, ""));
    gw.handle_datagram(at(1_110), addr(5000), &t140(1, 102, ""));
    assert_eq!(gw.stats().evicted, 2, "P and M are evicted");
    if bye {
        gw.handle_datagram(at(1_300), addr(4001), &mixer_bye(5));
    }
    gw.handle_datagram(at(1_400), addr(6000), &t140(2, 5, "Hello. "));
    run_timers(&mut gw, 8_000);
    let out = drain(&mut gw);
    (
        text_of_exactly(&out, "t140:00000005@127.0.0.1:6000"),
        events_of(&out, ""),
    )
}

/// README "RTCP": a report (and a BYE) is for a stream of the host on another port only "for
/// the compound's sender (its first SSRC) ... not for the SSRCs it reports for others, such as
/// a mixer's sources"; README "Stream limit": a BYE ends "the record of the BYE's address or
/// the port below; of another port of the host only when there is none". Mixer M's forwarded
/// BYE for its source 5 would not end caller P (port 6000, SSRC 5) were P live
/// (`rtcp_stream_of_host` asks `sender == ssrc`), but with P evicted `forget_evicted` falls
/// back to the whole host for any SSRC, the compound's sender or not, and ends P's record: P's
/// next packet is read as a new stream's whose head was lost (a false U+FFFD, or its text
/// lost), the very harm cf481b7 removed for the mixer's own SSRC.
#[test]
fn a_mixers_forwarded_source_bye_does_not_end_another_ports_record_with_that_ssrc() {
    let (control, all) = caller_after_mixer_forwards_bye(false);
    assert_eq!(
        control, "Hello.",
        "control: P comes back where it stood: {all:?}"
    );
    let (after, all) = caller_after_mixer_forwards_bye(true);
    assert_eq!(
        after, "Hello.",
        "mixer M's BYE for its source 5 ended caller P's eviction record: {all:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// 2. A plain endpoint with two SSRCs: its first stream's BYE forgets its second SSRC's name.
// ---------------------------------------------------------------------------------------------

/// An endpoint (port 4000) sends stream 1 ("Hello. "), never a mixer (no CSRC). Its compound
/// from 4001 carries an RR and SDES for SSRC 1 and an SDES for SSRC 2 ("Bob"), the stream it
/// starts next (RFC 3550 6.1 / RFC 8108: an endpoint with several SSRCs reports them in one
/// compound). If `bye`, stream 1's own BYE comes (its stream ends). Then SSRC 2 says "Hi. ".
/// Returns the names SSRC 2 joins with.
fn second_ssrc_of_plain_endpoint(bye: bool) -> Vec<String> {
    let mut gw = Gateway::new(Config::default());
    gw.handle_datagram(at(0), addr(4000), &t140(1, 1, "Hello. "));
    let mut d = own_sdes(1, "ep@host", Some("Bob"));
    pvp_t140::rtcp::write_sdes(&mut d, 2, "ep@host", Some("Bob"));
    gw.handle_datagram(at(100), addr(4001), &d);
    if bye {
        gw.handle_datagram(at(2_000), addr(4001), &stream_bye(1));
    }
    run_timers(&mut gw, 5_000);
    gw.handle_datagram(at(5_000), addr(4000), &t140(1, 2, "Hi. "));
    run_timers(&mut gw, 12_000);
    join_names(&drain(&mut gw), "t140:00000002@127.0.0.1:4000")
}

/// README "Stream limit": SDES names are kept for a later stream's join "as a name that came
/// before a stream's first packet ... unless a BYE came (a mixer's BYE forgets its sources'
/// names too)". cf481b7 gives such a name `via` = the compound's live stream whenever that
/// stream has not heard the SSRC, without asking whether the stream is a mixer at all. Stream
/// 1 never carried a CSRC; its BYE ends only SSRC 1 (RFC 3550 6.6: "the SSRC/CSRC
/// identifiers" listed), yet it forgets SSRC 2's name, and SSRC 2 joins nameless (before
/// cf481b7 it joined as "Bob").
#[test]
fn a_plain_streams_bye_does_not_forget_its_endpoints_other_ssrcs_early_name() {
    assert_eq!(
        second_ssrc_of_plain_endpoint(false),
        ["Bob"],
        "control: SSRC 2 takes its early name"
    );
    assert_eq!(
        second_ssrc_of_plain_endpoint(true),
        ["Bob"],
        "stream 1's own BYE forgot the name SSRC 2's SDES gave before its first packet"
    );
}

// ---------------------------------------------------------------------------------------------
// 3. --workers N, RTCP on the port above: the live mixer's BYE forgets the name its SDES gave
//    an unheard source only on the worker that holds the mixer.
// ---------------------------------------------------------------------------------------------

/// Mixer M (SSRC 9, port 4000) sends its source 7's "Hello. " (never evicted). Its compound
/// from 4001 names its source 5 ("Carol"), not heard yet; later M's own BYE comes from 4001.
/// Then a stream of SSRC 5 from another port of the host (4100) says "Hi. ". With `workers`
/// 2, M's RTP is on worker 0 and the 4100 stream on worker 1; the RTCP port's datagrams reach
/// both (`handle_rtcp_port`, worker 0 counting), as `udp` feeds them. Returns the names the
/// 4100 stream joins with.
fn direct_source_after_live_mixers_bye(workers: usize) -> Vec<String> {
    let mut w: Vec<Gateway> = (0..workers)
        .map(|_| Gateway::new(Config::default()))
        .collect();
    let last = workers - 1;
    let mut sdes = Vec::new();
    pvp_t140::rtcp::write_rr(&mut sdes, MIXER);
    pvp_t140::rtcp::write_sdes(&mut sdes, 5, "carol@host", Some("Carol"));
    w[0].handle_datagram(at(0), addr(4000), &red_csrc(1, 1000, 7, &[], b"Hello. "));
    for (i, gw) in w.iter_mut().enumerate() {
        gw.handle_rtcp_port(at(100), addr(4001), &sdes, None, i == 0);
    }
    w[0].handle_datagram(at(200), addr(4000), &red_csrc(2, 1300, 7, &[], b"Yes. "));
    for (i, gw) in w.iter_mut().enumerate() {
        gw.handle_rtcp_port(at(2_000), addr(4001), &stream_bye(MIXER), None, i == 0);
    }
    for gw in w.iter_mut() {
        run_timers(gw, 5_000);
    }
    w[last].handle_datagram(at(5_000), addr(4100), &t140(1, 5, "Hi. "));
    let mut out = Vec::new();
    for gw in w.iter_mut() {
        run_timers(gw, 12_000);
        out.extend(drain(gw));
    }
    join_names(&out, "t140:00000005@127.0.0.1:4100")
}

/// README "Stream limit": "an SDES a live mixer's compound gives a source it has not heard
/// yet: the mixer's BYE forgets it"; README "Scaling out": RTCP on the separate port "is
/// handed to every worker, each acting on it for its own streams" (the same rules as one
/// worker). cf481b7 gives such a name `via` only on the worker holding the live mixer; every
/// other worker keeps it as an early name with no `via` (it finds no live mixer, nor an
/// evicted one), and the mixer's BYE, which ends no stream there, does not forget it
/// (`forget_evicted` retains a via-less name of another id). So with `--workers 2` a stream of
/// SSRC 5 from another port of the host, hashed to the other worker, still joins as "Carol",
/// where one worker joins it nameless.
#[test]
fn with_two_workers_a_live_mixers_bye_forgets_its_unheard_sources_name_as_one_worker_does() {
    let one = direct_source_after_live_mixers_bye(1);
    let two = direct_source_after_live_mixers_bye(2);
    assert_eq!(one.len(), 1, "the 4100 stream joins once: {one:?}");
    assert_ne!(
        one,
        ["Carol"],
        "control: one worker forgot the name at the mixer's BYE"
    );
    assert_eq!(
        two, one,
        "with two workers the other worker kept the mixer's source's name past the mixer's BYE"
    );
}

// ---------------------------------------------------------------------------------------------
// 4. `pvp-t140 send`: one stop that delivers SIGTERM and SIGHUP together counts as two
//    signals and gives up the text read.
// ---------------------------------------------------------------------------------------------

/// README (send): "Ctrl-C on the sender ends its input as the input's end does (what it read,
/// the redundancy and the BYE still go out); so do SIGTERM and SIGHUP"; src/main.rs
/// `UntilInterrupt`: "A supervisor's stop or a closed terminal ends it as Ctrl-C does". One
/// stop often comes as two different signals at once: systemd's `SendSIGHUP=yes` sends SIGHUP
/// "immediately after" KillSignal (SIGTERM); a closed terminal's shell resends SIGHUP to its
/// jobs and the kernel sends another at the shell's exit. `UntilInterrupt::stdin`'s counting
/// task counts any two signals (of different kinds they are never coalesced), so such a stop
/// is taken as the second, impatient signal: the text read and not yet paced out is given up
/// ("interrupted again", `unsent=N`), and the receiver never gets it. Here 20 characters at
/// `--cps 10` (two seconds); the real binary, a UDP receiver on 127.0.0.1, polled until the
/// BYE with a 20 s timeout.
#[test]
fn a_single_stop_sending_sigterm_and_sighup_together_still_sends_what_was_read() {
    use std::io::{BufRead, Write};
    use std::time::Duration;
    let rx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    rx.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let to = rx.local_addr().unwrap().to_string();
    let mut child = std::process::Command::new("env")
        .args([
            "--default-signal=INT,TERM,HUP",
            env!("CARGO_BIN_EXE_pvp-t140"),
        ])
        .args(["send", "--to", &to, "--red", "0", "--cps", "10"])
        .env("RUST_LOG", "info")
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let input = "abcdefghijklmnopqrst";
    stdin.write_all(input.as_bytes()).unwrap();
    stdin.flush().unwrap();
    let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let log_w = log.clone();
    let logger = std::thread::spawn(move || {
        for line in stderr.lines().map_while(Result::ok) {
            log_w.lock().unwrap().push(line);
        }
    });
    let is_rtcp = |d: &[u8]| d.len() >= 8 && (200..=204).contains(&d[1]);
    let has_bye = |d: &[u8]| {
        let mut rest = d;
        while rest.len() >= 4 {
            if rest[1] == 203 {
                return true;
            }
            let len = (usize::from(u16::from_be_bytes([rest[2], rest[3]])) + 1) * 4;
            rest = &rest[len.min(rest.len())..];
        }
        false
    };
    let mut buf = [0u8; 2048];
    let mut got: Vec<Vec<u8>> = Vec::new();
    // The first packet: the signals are caught from before it.
    loop {
        let n = rx.recv(&mut buf).expect("the first packet");
        got.push(buf[..n].to_vec());
        if !is_rtcp(&buf[..n]) {
            break;
        }
    }
    // One stop: SIGTERM, then SIGHUP at once (systemd SendSIGHUP=yes).
    let pid = child.id().to_string();
    std::process::Command::new("sh")
        .args(["-c", "kill -TERM \"$1\"; kill -HUP \"$1\"", "sh", &pid])
        .status()
        .unwrap();
    while !got.last().is_some_and(|d| is_rtcp(d) && has_bye(d)) {
        let n = rx
            .recv(&mut buf)
            .unwrap_or_else(|e| panic!("the BYE: {e}; log: {:#?}", log.lock().unwrap()));
        got.push(buf[..n].to_vec());
    }
    let status = child.wait().unwrap();
    drop(stdin);
    logger.join().unwrap();
    assert!(status.success(), "{status}");
    let text: String = got
        .iter()
        .filter(|d| !is_rtcp(d))
        .map(|d| {
            let cc = usize::from(d[0] & 0x0f);
            String::from_utf8_lossy(&d[12 + 4 * cc..]).into_owned()
        })
        .collect();
    assert_eq!(
        text.trim_start_matches('\u{feff}'),
        input,
        "one stop (SIGTERM + SIGHUP) gave up the text read; log: {:#?}",
        log.lock().unwrap()
    );
}
