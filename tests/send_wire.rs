//! The sender (`pvp-t140 send`: `send::Sender`, `udp::send_text`, the RTCP it builds)
//! against its wire formats, RFC 4103, RFC 2198, RFC 3550 and T.140. Datagrams are sent to a
//! real 127.0.0.1 socket and parsed here, by hand.

use std::time::Duration;

use pvp_t140::send::SenderConfig;

fn cfg(ssrc: u32, redundancy: u8) -> SenderConfig {
    SenderConfig {
        ssrc,
        redundancy,
        initial_seq: 7,
        initial_ts: 1000,
        cps: None,
        ..SenderConfig::default()
    }
}

/// Every datagram that `udp::send_text` sends for each of `inputs` (run at once, each with its
/// own config), in the order received.
fn send_all(inputs: Vec<(SenderConfig, Vec<u8>)>) -> Vec<Vec<u8>> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let rx = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let to = rx.local_addr().unwrap();
        let sessions = inputs.into_iter().map(|(cfg, input)| async move {
            pvp_t140::udp::send_text(to, cfg, &input[..], true)
                .await
                .expect("session")
        });
        futures_join(sessions.collect()).await;
        let mut got = Vec::new();
        let mut buf = vec![0u8; 65_536];
        while let Ok(Ok((n, _))) =
            tokio::time::timeout(Duration::from_millis(200), rx.recv_from(&mut buf)).await
        {
            got.push(buf[..n].to_vec());
        }
        got
    })
}

/// Runs the futures concurrently on this task (no extra dependency).
async fn futures_join<F: std::future::Future>(fs: Vec<F>) {
    let mut fs: Vec<_> = fs.into_iter().map(Box::pin).collect();
    let mut done = vec![false; fs.len()];
    std::future::poll_fn(|cx| {
        for (i, f) in fs.iter_mut().enumerate() {
            if !done[i] && f.as_mut().poll(cx).is_ready() {
                done[i] = true;
            }
        }
        if done.iter().all(|d| *d) {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await
}

/// RTCP on the RTP port (RFC 5761 4): the second octet is 200-204.
fn is_rtcp(d: &[u8]) -> bool {
    d.len() >= 8 && (200..=204).contains(&d[1])
}

/// The primary T140block of an RTP datagram: the whole payload of a `text/t140` packet (PT 98),
/// the block after the RED headers and redundant blocks of a `text/red` one (PT 100).
fn primary(d: &[u8]) -> Vec<u8> {
    assert_eq!(d[0] >> 6, 2, "RTP version 2");
    let payload = &d[12..];
    match d[1] & 0x7f {
        98 => payload.to_vec(),
        100 => {
            let mut i = 0;
            let mut skip = 0;
            while payload[i] & 0x80 != 0 {
                let v = u32::from_be_bytes([0, payload[i + 1], payload[i + 2], payload[i + 3]]);
                skip += (v & 0x3ff) as usize;
                i += 4;
            }
            payload[i + 1 + skip..].to_vec()
        }
        pt => panic!("payload type {pt}"),
    }
}

/// `(ssrc, cname)` of every SDES CNAME item in a compound RTCP packet.
fn cnames(d: &[u8]) -> Vec<(u32, String)> {
    let mut out = Vec::new();
    let mut rest = d;
    while rest.len() >= 4 {
        let len = (usize::from(u16::from_be_bytes([rest[2], rest[3]])) + 1) * 4;
        if rest[1] == 202 {
            let count = usize::from(rest[0] & 0x1f);
            let mut pos = 4;
            for _ in 0..count {
                let ssrc = u32::from_be_bytes(rest[pos..pos + 4].try_into().unwrap());
                pos += 4;
                while rest[pos] != 0 {
                    let n = usize::from(rest[pos + 1]);
                    if rest[pos] == 1 {
                        let name = String::from_utf8(rest[pos + 2..pos + 2 + n].to_vec()).unwrap();
                        out.push((ssrc, name));
                    }
                    pos += 2 + n;
                }
                pos = (pos + 1).next_multiple_of(4);
            }
        }
        rest = &rest[len.min(rest.len())..];
    }
    out
}

/// T.140 (and RFC 4103 3) let a session's text begin with one U+FEFF (BOM), which the sender
/// puts first itself. A UTF-8 file saved with a BOM (Windows Notepad's default for years) then
/// went out as two: `EF BB BF EF BB BF Hi`, the second a ZERO WIDTH NO-BREAK SPACE in the text
/// that a receiver which drops only a leading BOM keeps, and a character counted against the
/// receiver's `cps`. What should happen: the input's own leading BOM is the one the session
/// starts with, sent once.
#[test]
fn an_input_that_starts_with_a_bom_sends_one_bom() {
    for red in [0u8, 2] {
        let got = send_all(vec![(cfg(0x0bad_b0b0, red), b"\xef\xbb\xbfHi\n".to_vec())]);
        let text: Vec<u8> = got
            .iter()
            .filter(|d| !is_rtcp(d))
            .flat_map(|d| primary(d))
            .collect();
        assert_eq!(
            String::from_utf8(text).unwrap(),
            "\u{feff}Hi\u{2028}",
            "red={red}"
        );
    }
}

/// RFC 3550 6.5.1: "Like the SSRC identifier, the CNAME identifier SHOULD also be unique among
/// all participants within one RTP session"; a CNAME shared by two SSRCs says they are one
/// participant's streams (to be synchronized, RFC 7022 4). Two `pvp-t140 send` processes on one
/// host (two captioning pipelines, one for each speaker) said `pvp-t140@127.0.0.1` alike: the
/// gateway named both participants alike, and a mapping rule's `rtcp_name` could not tell them
/// apart. Each CNAME now carries its SSRC.
#[test]
fn two_senders_on_one_host_do_not_share_a_cname() {
    let got = send_all(vec![
        (cfg(0x1111_1111, 2), b"one\n".to_vec()),
        (cfg(0x2222_2222, 2), b"two\n".to_vec()),
    ]);
    let mut names: Vec<(u32, String)> = got
        .iter()
        .filter(|d| is_rtcp(d))
        .flat_map(|d| cnames(d))
        .collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), 2, "one CNAME a sender: {names:?}");
    assert_ne!(names[0].1, names[1].1, "{names:?}");
}
