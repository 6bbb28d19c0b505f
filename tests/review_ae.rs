//! Review ae: the WebSocket transport under the PVP sink against hostile or odd servers, with
//! the real binary and raw TCP servers on 127.0.0.1.

mod common;

use std::time::Duration;

use common::gateway_proc::{Gateway, Sender};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const WAIT: Duration = Duration::from_secs(20);

/// Reads a client's HTTP upgrade request (up to its blank line) and answers 101: the request's
/// text, and the stream, now a WebSocket's server side that this test writes raw frames to.
async fn accept_raw(tcp: &mut TcpStream) -> String {
    let mut req = Vec::new();
    let mut b = [0u8; 1];
    while !req.ends_with(b"\r\n\r\n") {
        if tcp.read(&mut b).await.unwrap() == 0 {
            panic!("the client closed during its handshake");
        }
        req.push(b[0]);
    }
    let req = String::from_utf8(req).unwrap();
    let key = req
        .lines()
        .find_map(|l| {
            let (n, v) = l.split_once(':')?;
            n.eq_ignore_ascii_case("sec-websocket-key")
                .then(|| v.trim().to_owned())
        })
        .expect("a Sec-WebSocket-Key");
    let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
    let resp = format!(
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: {accept}\r\n\r\n"
    );
    tcp.write_all(resp.as_bytes()).await.unwrap();
    req
}

/// A server that floods a connection with WebSocket pings and never reads (its window
/// closes, so the gateway cannot write the pongs): the pongs the gateway owes must not pile
/// up in its memory. tungstenite queues every pong it cannot write into its write buffer,
/// unbounded unless the connection bounds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ping_flood_from_a_server_that_does_not_read_keeps_memory_bounded() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}", listener.local_addr().unwrap());
    // 96 MiB of pings, 127 bytes a frame: a pong of 131 bytes owed for each.
    const FLOOD: usize = 96 << 20;
    let server = tokio::spawn(async move {
        let (mut tcp, _) = listener.accept().await.unwrap();
        accept_raw(&mut tcp).await;
        let mut ping = vec![0x89u8, 125];
        ping.extend_from_slice(&[b'p'; 125]);
        let batch: Vec<u8> = ping
            .iter()
            .copied()
            .cycle()
            .take(ping.len() * 512)
            .collect();
        let mut sent = 0;
        while sent < FLOOD {
            tcp.write_all(&batch).await.unwrap();
            sent += batch.len();
        }
        tcp
    });
    let mut gw = Gateway::start_for_server(&url, &["--heartbeat-s", "600"]);
    let before = gw.peak_rss_kib();
    Sender::new(gw.listen, 3).send("Hello. ");
    let tcp = tokio::time::timeout(Duration::from_secs(120), server)
        .await
        .expect("the gateway read the flood")
        .unwrap();
    let grown = gw.peak_rss_kib().saturating_sub(before);
    drop(tcp);
    gw.kill();
    assert!(
        grown < 32 * 1024,
        "the gateway grew by {grown} KiB reading {} MiB of pings",
        FLOOD >> 20
    );
}

/// The first upgrade request a gateway sends to a raw server at `url` (`{addr}` in it is
/// replaced by the listener's address), for a participant that speaks once.
async fn first_request(bind: &str, url: &str) -> String {
    let listener = TcpListener::bind(bind).await.unwrap();
    let url = url.replace("{addr}", &listener.local_addr().unwrap().to_string());
    let mut gw = Gateway::start_for_server(&url, &[]);
    Sender::new(gw.listen, 4).send("Hello. ");
    let req = tokio::time::timeout(WAIT, async {
        let (mut tcp, _) = listener.accept().await.unwrap();
        accept_raw(&mut tcp).await
    })
    .await
    .expect("an upgrade request");
    let lines = gw.stderr_lines().join("\n");
    gw.kill();
    assert!(!lines.contains("secret"), "a password in the log:\n{lines}");
    req
}

/// The request line keeps the URL's path and query; the Host is the URL's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_upgrade_request_keeps_the_urls_path_and_query() {
    let req = first_request("127.0.0.1:0", "ws://{addr}/pvp/ws?room=a&x=1").await;
    assert!(
        req.starts_with("GET /pvp/ws?room=a&x=1 HTTP/1.1\r\n"),
        "{req}"
    );
    assert!(
        req.to_ascii_lowercase().contains("\r\nhost: 127.0.0.1:"),
        "{req}"
    );
}

/// An IPv6 literal host connects, with its brackets in the Host header (RFC 9110 7.2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ipv6_literal_server_is_reached() {
    if std::net::TcpListener::bind("[::1]:0").is_err() {
        eprintln!("no IPv6 loopback here; skipped");
        return;
    }
    let req = first_request("[::1]:0", "ws://{addr}/").await;
    assert!(req.starts_with("GET / HTTP/1.1\r\n"), "{req}");
    assert!(
        req.to_ascii_lowercase().contains("\r\nhost: [::1]:"),
        "{req}"
    );
}

/// `ws://user:secret@host/`: the README names this form (its password hidden in the log), so
/// its credentials are the user's for the server: sent as HTTP Basic authentication
/// (RFC 7617) with the upgrade, not dropped without a word (a server wanting them answers
/// 401 for ever), and never in the Host header or the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_in_the_server_url_are_sent_as_basic_authentication() {
    let req = first_request("127.0.0.1:0", "ws://user:secret@{addr}/").await;
    let host = req
        .lines()
        .find(|l| l.to_ascii_lowercase().starts_with("host:"))
        .unwrap();
    assert!(!host.contains('@'), "{req}");
    // base64("user:secret")
    assert!(
        req.contains("\r\nauthorization: Basic dXNlcjpzZWNyZXQ=\r\n")
            || req.contains("\r\nAuthorization: Basic dXNlcjpzZWNyZXQ=\r\n"),
        "{req}"
    );
}
