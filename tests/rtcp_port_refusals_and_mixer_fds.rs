//! Resource bounds: what the RTCP port's reader refuses (`--allow`, `--max-pps-per-source`) is
//! counted apart and never fills the workers' feed (a flood pushed an admitted BYE out); the
//! open-file limit covers a mixer's 32 sources and its own voice, 33 participants a stream.
//!
//! Found by review aw (session 46).

#[path = "common/core.rs"]
mod core_helpers;
use core_helpers::*;
#[path = "common/mixer.rs"]
mod mixer_helpers;
use mixer_helpers::*;

use pvp_t140::{Config, Gateway};

/// Found by review aw (session 46). A stream's participants can be 33 at once, not 32: a
/// mixer's 32 sources (RFC 9071 CSRCs, `MAX_SPEAKERS`) and the mixer's own voice, which its
/// CSRC-less packets speak with and which is made past the speaker bound
/// (`stream::new_speaker`). Each is a WebSocket connection of its own, but the open-file
/// limit was raised for 32 a stream (`fdlimit::participants_of`): under `--max-streams N`
/// with every stream such a mixer, N participants found no descriptor, and retried and
/// dropped their transcripts.
#[test]
fn the_open_file_limit_covers_every_participant_a_stream_can_have_at_once() {
    let mut gw = Gateway::new(Config::default());
    let mut seq = 0u16;
    for csrc in 1..=32u32 {
        seq += 1;
        let ts = u32::from(seq) * 300;
        gw.handle_datagram(
            at(u64::from(seq) * 10),
            addr(5000),
            &with_csrc(seq, ts, MIXER, csrc, b"Hi. "),
        );
    }
    seq += 1;
    let mut own = Vec::new();
    pvp_t140::rtp::write_packet(
        &mut own,
        false,
        98,
        seq,
        u32::from(seq) * 300,
        MIXER,
        b"Me too. ",
    );
    gw.handle_datagram(at(u64::from(seq) * 10), addr(5000), &own);
    let out = drain(&mut gw);
    let joined: std::collections::HashSet<&str> = out
        .iter()
        .filter(|e| e.kind == "session.join")
        .map(|e| e.sender.as_str())
        .collect();
    let left = out.iter().filter(|e| e.kind == "session.leave").count();
    assert_eq!((joined.len(), left), (33, 0), "joined at once: {joined:?}");
    assert!(
        pvp_t140::fdlimit::participants_of(1) >= joined.len() as u64,
        "one stream's participants: {} joined at once, the limit raised for {}",
        joined.len(),
        pvp_t140::fdlimit::participants_of(1)
    );
}

/// Found by review aw (session 46). The RTCP port's reader handed every datagram it refused
/// (`--allow`, `--max-pps-per-source`) to the workers one by one, a copy of its bytes each, so
/// that the counting worker could count it: a source flooding the RTCP port over its rate (or
/// from outside every `--allow` network) filled the workers' feed of 1,024 with datagrams none
/// acts on, and pushed out the RTCP admitted before them. Here a sender's BYE, admitted, then
/// 1,500 datagrams over the rate of its source: the BYE was lost to the feed's lag
/// (`rtcp_feed_lagged`), and its stream would wait for its timeout. Refused datagrams are now
/// counted where the counting worker takes them (`udp::RtcpRefused`), each of them, and the
/// feed holds only what is admitted.
#[tokio::test(flavor = "current_thread")]
async fn a_flood_refused_at_the_rtcp_port_does_not_push_admitted_rtcp_out_of_the_feed() {
    use pvp_t140::udp;
    let socket = udp::bind_with_buffer("127.0.0.1:0".parse().unwrap(), false, 8 << 20).unwrap();
    let port = socket.local_addr().unwrap();
    let flooder = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut bye = Vec::new();
    pvp_t140::rtcp::write_rr(&mut bye, 7);
    pvp_t140::rtcp::write_bye(&mut bye, 7);
    flooder.send_to(&bye, port).unwrap();
    let mut rr = Vec::new();
    pvp_t140::rtcp::write_rr(&mut rr, 7);
    const FLOOD: u64 = 1_500;
    for _ in 0..FLOOD {
        flooder.send_to(&rr, port).unwrap();
    }
    let (tx, mut feed) = tokio::sync::broadcast::channel(udp::RTCP_FEED);
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    // A rate of 1 a second: the BYE is its source's burst, the rest over it.
    let admission = pvp_t140::admission::Admission::new(Vec::new(), 1);
    let refused = std::sync::Arc::new(udp::RtcpRefused::default());
    let reader = tokio::spawn(udp::run_rtcp_reader(
        socket,
        tx,
        stop,
        admission,
        refused.clone(),
    ));
    // Stopped at once, it reads what the socket holds before it returns.
    stop_tx.send(true).unwrap();
    reader.await.unwrap();
    // As the counting worker does at its stop (`udp::drain_rtcp_at_stop`, then the refusals).
    let mut gw = Gateway::new(Config::default());
    loop {
        match feed.try_recv() {
            Ok(d) => gw.handle_rtcp_port(at(0), d.from, &d.data, d.refused, true),
            Err(tokio::sync::broadcast::error::TryRecvError::Lagged(n)) => {
                gw.rtcp_feed_lost(at(0), n, true)
            }
            Err(_) => break,
        }
    }
    refused.take(&mut gw);
    let s = gw.stats();
    assert_eq!(s.rtcp, 1, "the admitted BYE reached the core");
    assert_eq!(
        (
            s.datagrams,
            s.drops(pvp_t140::DropReason::RateLimited),
            s.drops(pvp_t140::DropReason::RtcpFeedLagged),
            s.rtcp_feed_missed
        ),
        (FLOOD + 1, FLOOD, 0, 0),
        "every refused datagram counted, none lost to the feed"
    );
    assert_eq!(s.bytes, (bye.len() as u64) + FLOOD * rr.len() as u64);
    // Taken once: a second take counts nothing more.
    refused.take(&mut gw);
    assert_eq!(gw.stats().datagrams, FLOOD + 1);
}

/// Found by review aw (session 46), with the test above: while the reader runs (no stop), what
/// it refuses is counted for the counting worker's next take (its metrics tick), and none of it
/// takes a place in the feed.
#[tokio::test(flavor = "current_thread")]
async fn refused_rtcp_port_datagrams_are_counted_while_the_reader_runs_and_stay_out_of_the_feed() {
    use pvp_t140::udp;
    let socket = udp::bind_with_buffer("127.0.0.1:0".parse().unwrap(), false, 8 << 20).unwrap();
    let port = socket.local_addr().unwrap();
    let (tx, mut feed) = tokio::sync::broadcast::channel(udp::RTCP_FEED);
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    // Nothing from 127.0.0.1 is allowed.
    let admission = pvp_t140::admission::Admission::new(vec!["10.0.0.0/8".parse().unwrap()], 0);
    let refused = std::sync::Arc::new(udp::RtcpRefused::default());
    let reader = tokio::spawn(udp::run_rtcp_reader(
        socket,
        tx,
        stop,
        admission,
        refused.clone(),
    ));
    let flooder = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut rr = Vec::new();
    pvp_t140::rtcp::write_rr(&mut rr, 7);
    const FLOOD: u64 = 2_000;
    for _ in 0..FLOOD {
        flooder.send_to(&rr, port).unwrap();
    }
    let mut gw = Gateway::new(Config::default());
    let counted = tokio::time::timeout(std::time::Duration::from_secs(10), async {
        while gw.stats().drops(pvp_t140::DropReason::NotAllowed) < FLOOD {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            refused.take(&mut gw);
        }
    })
    .await;
    assert!(
        counted.is_ok(),
        "refused datagrams counted: {:?}",
        gw.stats()
    );
    assert!(
        matches!(
            feed.try_recv(),
            Err(tokio::sync::broadcast::error::TryRecvError::Empty)
        ),
        "nothing refused is in the feed"
    );
    stop_tx.send(true).unwrap();
    reader.await.unwrap();
    let s = gw.stats();
    assert_eq!(
        (
            s.datagrams,
            s.drops(pvp_t140::DropReason::NotAllowed),
            s.bytes
        ),
        (FLOOD, FLOOD, FLOOD * rr.len() as u64)
    );
}
