//! Found by review ae (session 43): the WebSocket transport under the PVP sink against hostile
//! or odd servers (a ping flood that does not read, credentials in the URL, a 2^63-byte frame,
//! secrets in trace logs, a slow large message, control characters in what the log shows,
//! answers other than 101, TLS refusals), with the real binary and raw TCP servers on
//! 127.0.0.1.

mod common;
#[path = "common/ws_recorder.rs"]
mod ws_recorder;

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

/// A server whose first connection, once its join is read, sends `bad` (a frame RFC 6455 says
/// a client must fail the connection for) and stays open; its later connections are a proper
/// WebSocket server recording text frames. The gateway must leave the bad connection, make a
/// new one, rejoin and deliver what its participant says next.
async fn recovers_from(bad: Vec<u8>, what: &str) {
    use futures_util::StreamExt;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}", listener.local_addr().unwrap());
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(usize, serde_json::Value)>();
    tokio::spawn(async move {
        let mut n = 0;
        let mut held = Vec::new();
        while let Ok((mut tcp, _)) = listener.accept().await {
            let conn = n;
            n += 1;
            if conn == 0 {
                accept_raw(&mut tcp).await;
                // The join (its header and masked payload, under 126 bytes or not).
                let mut buf = [0u8; 4096];
                let _ = tokio::time::timeout(Duration::from_millis(500), tcp.read(&mut buf)).await;
                let _ = tcp.write_all(&bad).await;
                held.push(tcp);
                continue;
            }
            let tx = tx.clone();
            tokio::spawn(async move {
                let Ok(mut ws) = tokio_tungstenite::accept_async(tcp).await else {
                    return;
                };
                while let Some(Ok(m)) = ws.next().await {
                    if let Ok(v) = serde_json::from_str(m.to_text().unwrap_or("")) {
                        let _ = tx.send((conn, v));
                    }
                }
            });
        }
    });
    let mut gw = Gateway::start_for_server(&url, &[]);
    let mut a = Sender::new(gw.listen, 9);
    a.send("First. ");
    let got = tokio::time::timeout(WAIT, async {
        loop {
            let (conn, v) = rx.recv().await.unwrap();
            if v["type"] == "session.join" {
                return conn;
            }
        }
    })
    .await;
    let Ok(conn) = got else {
        let log = gw.stderr_lines().join("\n");
        gw.kill();
        panic!("{what}: no second connection\n{log}");
    };
    assert_eq!(conn, 1, "{what}");
    a.send("Second. ");
    let said = tokio::time::timeout(WAIT, async {
        loop {
            let (_, v) = rx.recv().await.unwrap();
            if v["type"] == "context.add" && v["payload"]["content"] == "Second." {
                return;
            }
        }
    })
    .await;
    let log = gw.stderr_lines().join("\n");
    gw.kill();
    assert!(
        said.is_ok(),
        "{what}: text after the reconnect not delivered\n{log}"
    );
    assert!(!log.contains("panicked"), "{what}\n{log}");
}

fn raw_frame(first: u8, mask: Option<[u8; 4]>, payload: &[u8]) -> Vec<u8> {
    let mut f = vec![first];
    let m = if mask.is_some() { 0x80 } else { 0 };
    match payload.len() {
        n if n < 126 => f.push(m | n as u8),
        n if n <= 0xffff => {
            f.push(m | 126);
            f.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            f.push(m | 127);
            f.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    match mask {
        Some(k) => {
            f.extend_from_slice(&k);
            f.extend(payload.iter().enumerate().map(|(i, b)| b ^ k[i % 4]));
        }
        None => f.extend_from_slice(payload),
    }
    f
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_breaking_the_framing_is_left_and_the_participant_goes_on() {
    let close = |code: u16, reason: &[u8]| {
        let mut p = code.to_be_bytes().to_vec();
        p.extend_from_slice(reason);
        p
    };
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (
            raw_frame(0x81, None, b"\xff\xfe not UTF-8"),
            "a text frame of invalid UTF-8",
        ),
        (raw_frame(0xc1, None, b"{}"), "a frame with RSV1 set"),
        (raw_frame(0x81, Some([1, 2, 3, 4]), b"{}"), "a masked frame"),
        (
            raw_frame(0x88, None, &close(1005, b"")),
            "a Close with code 1005",
        ),
        (
            raw_frame(0x88, None, &close(1000, &[b'r'; 200])),
            "a Close of 202 bytes",
        ),
        (
            raw_frame(0x88, None, &close(1000, &[b'r'; 1 << 20])),
            "a Close of 1 MiB",
        ),
        (raw_frame(0x83, None, b"x"), "a reserved opcode"),
        (
            {
                let mut f = vec![0x81, 127];
                f.extend_from_slice(&(1u64 << 63 | 5).to_be_bytes());
                f
            },
            "a length with its top bit set",
        ),
    ];
    for (bad, what) in cases {
        recovers_from(bad, what).await;
    }
}

/// An HTTP server that answers the upgrade with another status: the connect fails with the
/// status in its warning, and is retried with backoff, not in a tight loop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_answering_without_101_is_named_and_retried_with_backoff() {
    for status in [
        "200 OK",
        "301 Moved Permanently\r\nLocation: ws://elsewhere/",
        "404 Not Found",
        "401 Unauthorized\r\nWWW-Authenticate: Basic",
    ] {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("ws://{}/pvp", listener.local_addr().unwrap());
        let count = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let seen = count.clone();
        let answer = format!("HTTP/1.1 {status}\r\nContent-Length: 2\r\n\r\nno");
        let server = tokio::spawn(async move {
            while let Ok((mut tcp, _)) = listener.accept().await {
                seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let answer = answer.clone();
                tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    let _ = tcp.read(&mut buf).await;
                    let _ = tcp.write_all(answer.as_bytes()).await;
                });
            }
        });
        let mut gw = Gateway::start_for_server(&url, &[]);
        Sender::new(gw.listen, 2).send("Anyone? ");
        let line = gw.wait_stderr(WAIT, "PVP connect failed");
        let code = &status[..3];
        assert!(line.contains(code), "{status}: {line}");
        let first = count.load(std::sync::atomic::Ordering::SeqCst);
        tokio::time::sleep(Duration::from_secs(2)).await;
        let later = count.load(std::sync::atomic::Ordering::SeqCst);
        gw.kill();
        server.abort();
        // Waits of 50-100, 100-200, 200-400, 400-800, 800-1600 ms: at most 5 more in 2 s.
        assert!(
            later - first <= 6,
            "{status}: {} connects in 2 s",
            later - first
        );
        assert!(later > first, "{status}: not retried");
    }
}

/// A private CA, and a wss server on 127.0.0.1 whose certificate it signed for `names`, valid
/// until `until` (year): the server's port and the CA's PEM. Every text frame is sent to `tx`.
async fn wss_signed(
    names: &[&str],
    until: i32,
    tx: tokio::sync::mpsc::UnboundedSender<serde_json::Value>,
) -> (u16, String) {
    use futures_util::StreamExt;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, "review ae CA");
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let ca = rcgen::CertifiedIssuer::self_signed(ca, ca_key).unwrap();
    let mut leaf =
        rcgen::CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
            .unwrap();
    leaf.not_before = rcgen::date_time_ymd(2000, 1, 1);
    leaf.not_after = rcgen::date_time_ymd(until, 1, 1);
    let leaf_key = rcgen::KeyPair::generate().unwrap();
    let leaf_cert = leaf.signed_by(&leaf_key, &ca).unwrap();
    let key = rustls_pki_types::PrivateKeyDer::Pkcs8(leaf_key.serialize_der().into());
    let config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(vec![leaf_cert.der().clone(), ca.der().clone()], key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, tx) = (acceptor.clone(), tx.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let Ok(mut ws) = tokio_tungstenite::accept_async(tls).await else {
                    return;
                };
                while let Some(Ok(m)) = ws.next().await {
                    if let Ok(v) = serde_json::from_str(m.to_text().unwrap_or("")) {
                        let _ = tx.send(v);
                    }
                }
            });
        }
    });
    (port, ca.pem())
}

/// wss with `--ca-file` of the CA that signed the server's certificate: delivered when the
/// certificate names the host and is valid; a hostname mismatch and an expired certificate
/// fail the connect with the reason in the warning, and are retried, the process up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wss_certificates_a_ca_file_trusts_or_refuses_with_the_reason() {
    for (names, until, host, want) in [
        (&["localhost"][..], 4000, "localhost", None),
        (&["127.0.0.1"][..], 4000, "127.0.0.1", None),
        (&["other.example"][..], 4000, "localhost", Some("name")),
        (&["localhost"][..], 2001, "localhost", Some("expired")),
    ] {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let (port, pem) = wss_signed(names, until, tx).await;
        let ca = std::env::temp_dir().join(format!(
            "pvp-t140-review-ae-ca-{}-{port}.pem",
            std::process::id()
        ));
        std::fs::write(&ca, pem).unwrap();
        let url = format!("wss://{host}:{port}/");
        let mut gw = Gateway::start_for_server(&url, &["--ca-file", ca.to_str().unwrap()]);
        Sender::new(gw.listen, 5).send("Over TLS. ");
        match want {
            None => {
                let got = tokio::time::timeout(WAIT, async {
                    loop {
                        let v: serde_json::Value = rx.recv().await.unwrap();
                        if v["type"] == "context.add" {
                            return v;
                        }
                    }
                })
                .await;
                let log = gw.stderr_lines().join("\n");
                assert!(got.is_ok(), "{names:?} as {host}: nothing arrived\n{log}");
            }
            Some(reason) => {
                let line = gw.wait_stderr(WAIT, "PVP connect failed");
                assert!(
                    line.to_lowercase().contains(reason),
                    "{names:?} until {until} as {host}: {line}"
                );
                assert!(rx.try_recv().is_err());
            }
        }
        assert!(gw.terminate(WAIT).success());
        std::fs::remove_file(&ca).ok();
    }
}

/// The README: a password in `--server` and a query parameter named like a secret are logged
/// as `***`. So at every log level: tungstenite (its `log` records reach the gateway's log)
/// traces the whole upgrade request, its request line's query and its headers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_log_level_shows_the_servers_secrets() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let url = format!("ws://user:secret1@{addr}/pvp?token=secret2&room=a");
    let mut gw = Gateway::start_logging(&["--listen", "127.0.0.1:0", "--server", &url], "trace");
    Sender::new(gw.listen, 4).send("Hello. ");
    let req = tokio::time::timeout(WAIT, async {
        let (mut tcp, _) = listener.accept().await.unwrap();
        let req = accept_raw(&mut tcp).await;
        // The join, read, then the connection held a moment.
        let mut buf = [0u8; 4096];
        let _ = tokio::time::timeout(Duration::from_millis(500), tcp.read(&mut buf)).await;
        req
    })
    .await
    .expect("an upgrade request");
    assert!(req.contains("token=secret2"), "{req}");
    let _ = gw.wait_stderr(WAIT, "session.join");
    let lines = gw.stderr_lines().join("\n");
    gw.kill();
    assert!(lines.contains("Doing handshake round"), "traced:\n{lines}");
    // base64("user:secret1") too.
    for secret in ["secret1", "secret2", "dXNlcjpzZWNyZXQx"] {
        assert!(
            !lines.contains(secret),
            "{secret} in the log:\n{}",
            lines
                .lines()
                .filter(|l| l.contains(secret))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
}

/// A password with an unescaped `@` (`ws://user:p@ss@host/`, which the log hides as
/// `user:***@host`): the host is what follows the last `@`, so no part of the password goes
/// in the Host header (to the server, and any proxy's logs); it goes whole in the
/// Authorization header.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_with_an_at_sign_stays_out_of_the_host_header() {
    let req = first_request("127.0.0.1:0", "ws://user:p@secret@{addr}/").await;
    let host = req
        .lines()
        .find(|l| l.to_ascii_lowercase().starts_with("host:"))
        .unwrap();
    assert!(!host.contains('@') && !host.contains("secret"), "{req}");
    // base64("user:p@secret")
    assert!(req.contains("Basic dXNlcjpwQHNlY3JldA==\r\n"), "{req}");
}

/// A server that hangs (reads nothing more and sends nothing, its TCP connection up: a blocked
/// event loop, a host gone without a FIN) after a participant's join: what the participant says
/// meanwhile is written into the socket, and after `--server-silence-s` the connection is left
/// and made again. The text written into the abandoned connection, never answered by the pong
/// to the ping written behind it, goes again after the rejoin. It was lost (up to the silence's
/// length of transcript, 90 s by default) until session 44: found by review ae (session 43).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_written_to_a_server_that_then_fell_silent_is_sent_again_after_the_reconnect() {
    use common::talk::Talk;
    use futures_util::StreamExt;
    use pvp_t140::sink::ws::{WsConfig, WsSink};
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}", listener.local_addr().unwrap());
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(usize, serde_json::Value)>();
    tokio::spawn(async move {
        let mut n = 0;
        let mut hung = Vec::new();
        while let Ok((tcp, _)) = listener.accept().await {
            let (conn, tx) = (n, tx.clone());
            n += 1;
            let Ok(mut ws) = tokio_tungstenite::accept_async(tcp).await else {
                continue;
            };
            if conn == 0 {
                // The join, then nothing: neither read nor written.
                if let Some(Ok(m)) = ws.next().await {
                    let _ = tx.send((conn, serde_json::from_str(m.to_text().unwrap()).unwrap()));
                }
                hung.push(ws);
                continue;
            }
            tokio::spawn(async move {
                while let Some(Ok(m)) = ws.next().await {
                    if let Ok(v) = serde_json::from_str(m.to_text().unwrap_or("")) {
                        let _ = tx.send((conn, v));
                    }
                }
            });
        }
    });
    let cfg = WsConfig {
        heartbeat: Duration::from_secs(1),
        silence: Duration::from_secs(2),
        ..ws_recorder::config(url)
    };
    let mut sink = WsSink::new(cfg);
    let mut talk = Talk::new();
    let p = "t140:0000beef@127.0.0.1:40000";
    sink.send(talk.join(p));
    let next = async |rx: &mut tokio::sync::mpsc::UnboundedReceiver<(usize, serde_json::Value)>| {
        tokio::time::timeout(WAIT, rx.recv())
            .await
            .expect("a frame")
            .unwrap()
    };
    assert_eq!(next(&mut rx).await.1["type"], "session.join");
    sink.send(talk.add(p, "Said while the server hung."));
    let mut seen = Vec::new();
    let got = tokio::time::timeout(WAIT, async {
        loop {
            let (conn, v) = rx.recv().await.unwrap();
            seen.push(format!("{conn} {}", v["type"]));
            if v["type"] == "context.add" {
                return (conn, v);
            }
        }
    })
    .await;
    sink.close(Duration::from_millis(500)).await;
    let Ok((conn, v)) = got else {
        panic!("the text never reached the server; it read: {seen:?}");
    };
    assert_eq!(conn, 1);
    assert_eq!(v["payload"]["content"], "Said while the server hung.");
}

/// The other side of the test above: text the server was seen to read (it answered the ping the
/// connection writes behind text) is not sent again when the connection is lost after, so a
/// server that closes (a restart, a proxy's idle timeout) is not handed it twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_a_server_answered_a_ping_behind_is_not_sent_again_after_a_reconnect() {
    use common::talk::Talk;
    use futures_util::{SinkExt, StreamExt};
    use pvp_t140::sink::ws::WsSink;
    use tokio_tungstenite::tungstenite::Message;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}", listener.local_addr().unwrap());
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(usize, serde_json::Value)>();
    tokio::spawn(async move {
        let mut n = 0;
        while let Ok((tcp, _)) = listener.accept().await {
            let (conn, tx) = (n, tx.clone());
            n += 1;
            let Ok(mut ws) = tokio_tungstenite::accept_async(tcp).await else {
                continue;
            };
            tokio::spawn(async move {
                let mut texts = 0;
                while let Some(Ok(m)) = ws.next().await {
                    match m {
                        Message::Text(t) => {
                            texts += 1;
                            let _ = tx.send((conn, serde_json::from_str(t.as_str()).unwrap()));
                        }
                        // The first connection, once it has the join and the text and the
                        // ping behind them: the pong (queued as the ping was read), then a
                        // Close.
                        Message::Ping(_) if conn == 0 && texts == 2 => {
                            ws.flush().await.unwrap();
                            let _ = ws.close(None).await;
                            return;
                        }
                        _ => {}
                    }
                }
            });
        }
    });
    let cfg = ws_recorder::config(url);
    let metrics = cfg.metrics.clone();
    let mut sink = WsSink::new(cfg);
    let mut talk = Talk::new();
    let p = "t140:0000beef@127.0.0.1:40000";
    sink.send(talk.join(p));
    sink.send(talk.add(p, "Read, and answered."));
    let mut seen = Vec::new();
    let mut next = async || {
        let (conn, v) = tokio::time::timeout(WAIT, rx.recv())
            .await
            .unwrap_or_else(|_| panic!("a frame; the server read {seen:?}"))
            .unwrap();
        seen.push(format!("{conn} {} {}", v["type"], v["payload"]["content"]));
        (conn, v["type"].as_str().unwrap().to_owned(), v)
    };
    assert_eq!(next().await.1, "session.join");
    let (conn, kind, v) = next().await;
    assert_eq!((conn, kind.as_str()), (0, "context.add"));
    assert_eq!(v["payload"]["content"], "Read, and answered.");
    // The rejoin on the second connection, then only what was said after it.
    let (conn, kind, _) = next().await;
    assert_eq!((conn, kind.as_str()), (1, "session.join"));
    sink.send(talk.add(p, "Said after the reconnect."));
    let (conn, kind, v) = next().await;
    assert_eq!((conn, kind.as_str()), (1, "context.add"));
    assert_eq!(v["payload"]["content"], "Said after the reconnect.");
    assert_eq!(metrics.unread_resent.get(), 0);
    sink.close(Duration::from_millis(500)).await;
}

/// Reads a client's (masked) frames from `r` and hands on each text payload.
async fn client_texts(
    mut r: tokio::io::ReadHalf<TcpStream>,
    tx: tokio::sync::mpsc::UnboundedSender<serde_json::Value>,
) {
    loop {
        let mut h = [0u8; 2];
        if r.read_exact(&mut h).await.is_err() {
            return;
        }
        let len = match h[1] & 0x7f {
            126 => u64::from(r.read_u16().await.unwrap()),
            127 => r.read_u64().await.unwrap(),
            n => u64::from(n),
        };
        let mut mask = [0u8; 4];
        if h[1] & 0x80 != 0 {
            r.read_exact(&mut mask).await.unwrap();
        }
        let mut p = vec![0u8; len as usize];
        if r.read_exact(&mut p).await.is_err() {
            return;
        }
        for (i, b) in p.iter_mut().enumerate() {
            *b ^= mask[i % 4];
        }
        if h[0] & 0x0f == 1
            && let Ok(v) = serde_json::from_slice(&p)
        {
            let _ = tx.send(v);
        }
    }
}

/// A server sending a large message over a slow link (another member's inline image in its
/// history, say): its bytes keep coming for longer than `--server-silence-s`, but no whole
/// frame does. The README: the connection is left after the silence "with nothing at all from
/// the server". Bytes of a frame still arriving are something: the connection must not be
/// left, and the frame after the large one is answered on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_message_arriving_slowly_is_no_silence() {
    use common::talk::Talk;
    use pvp_t140::sink::ws::{WsConfig, WsSink};
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}", listener.local_addr().unwrap());
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<serde_json::Value>();
    let (conns_tx, mut conns) = tokio::sync::mpsc::unbounded_channel::<usize>();
    tokio::spawn(async move {
        let mut n = 0;
        while let Ok((mut tcp, _)) = listener.accept().await {
            let conn = n;
            n += 1;
            let _ = conns_tx.send(conn);
            if conn > 0 {
                continue;
            }
            let tx = tx.clone();
            tokio::spawn(async move {
                accept_raw(&mut tcp).await;
                let (r, mut w) = tokio::io::split(tcp);
                tokio::spawn(client_texts(r, tx));
                tokio::time::sleep(Duration::from_millis(200)).await;
                // 2 MiB of text in one frame, 40 KiB every 100 ms: about 5 s.
                let size: u64 = 2 << 20;
                let mut head = vec![0x81, 127];
                head.extend_from_slice(&size.to_be_bytes());
                if w.write_all(&head).await.is_err() {
                    return;
                }
                let piece = vec![b' '; 40 << 10];
                let mut left = size as usize;
                while left > 0 {
                    let n = left.min(piece.len());
                    if w.write_all(&piece[..n]).await.is_err() {
                        return;
                    }
                    left -= n;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                let ping = serde_json::json!({
                    "v": 1, "id": "01J0000000000000000000PVNG", "ts": "2026-01-01T00:00:00Z",
                    "session": "s", "sender": "system", "type": "heartbeat.ping", "payload": {}
                })
                .to_string();
                let mut f = vec![0x81, 126];
                f.extend_from_slice(&(ping.len() as u16).to_be_bytes());
                f.extend_from_slice(ping.as_bytes());
                let _ = w.write_all(&f).await;
                tokio::time::sleep(Duration::from_secs(30)).await;
            });
        }
    });
    let cfg = WsConfig {
        heartbeat: Duration::from_secs(1),
        silence: Duration::from_secs(2),
        ..ws_recorder::config(url)
    };
    let mut sink = WsSink::new(cfg);
    let mut talk = Talk::new();
    let p = "t140:0000cafe@127.0.0.1:40000";
    sink.send(talk.join(p));
    let answered = tokio::time::timeout(WAIT, async {
        loop {
            let v = rx.recv().await.unwrap();
            if v["type"] == "heartbeat.pong" {
                return;
            }
        }
    })
    .await;
    sink.close(Duration::from_millis(500)).await;
    let mut made = Vec::new();
    while let Ok(c) = conns.try_recv() {
        made.push(c);
    }
    assert_eq!(
        made,
        [0],
        "the connection was left while the message arrived"
    );
    assert!(
        answered.is_ok(),
        "the ping after the large message was not answered"
    );
}

static LOGS: std::sync::Mutex<Vec<u8>> = std::sync::Mutex::new(Vec::new());

struct LogWriter;

impl std::io::Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        LOGS.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The gateway's default log format is text, a line an event. A server's Close reason is
/// logged as it came: one with a newline in it (a hostile or broken server) wrote a line of
/// the server's own making into the gateway's log, a forged `ERROR` line, say.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_close_reason_cannot_write_a_log_line_of_its_own() {
    use common::talk::Talk;
    use futures_util::{SinkExt, StreamExt};
    use pvp_t140::sink::ws::WsSink;
    use tokio_tungstenite::tungstenite::Message;
    use tokio_tungstenite::tungstenite::protocol::CloseFrame;
    use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
    let _ = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_ansi(false)
        .with_writer(|| LogWriter)
        .try_init();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            tokio::spawn(async move {
                let Ok(mut ws) = tokio_tungstenite::accept_async(tcp).await else {
                    return;
                };
                let Some(Ok(_join)) = ws.next().await else {
                    return;
                };
                let close = CloseFrame {
                    code: CloseCode::Policy,
                    reason: "bye\n2026-01-01T00:00:00Z ERROR FORGED by the server".into(),
                };
                let _ = ws.send(Message::Close(Some(close))).await;
                while let Some(Ok(_)) = ws.next().await {}
            });
        }
    });
    let cfg = ws_recorder::config(url);
    let mut sink = WsSink::new(cfg);
    let mut talk = Talk::new();
    let p = "t140:0000f0f0@127.0.0.1:40000";
    sink.send(talk.join(p));
    let deadline = tokio::time::Instant::now() + WAIT;
    while !String::from_utf8_lossy(&LOGS.lock().unwrap()).contains("FORGED") {
        assert!(tokio::time::Instant::now() < deadline, "no close logged");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    sink.close(Duration::from_millis(300)).await;
    let logs = String::from_utf8_lossy(&LOGS.lock().unwrap()).into_owned();
    let forged: Vec<&str> = logs
        .lines()
        .filter(|l| l.starts_with("2026-01-01"))
        .collect();
    assert!(forged.is_empty(), "{logs}");
}

/// A server's heartbeat.ping cut into three fragments with WebSocket pings between them (RFC
/// 6455 5.4: control frames may come between a message's fragments): read whole, and answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fragmented_ping_with_control_frames_between_is_answered() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}", listener.local_addr().unwrap());
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<serde_json::Value>();
    tokio::spawn(async move {
        let (mut tcp, _) = listener.accept().await.unwrap();
        accept_raw(&mut tcp).await;
        let (r, mut w) = tokio::io::split(tcp);
        tokio::spawn(client_texts(r, tx));
        tokio::time::sleep(Duration::from_millis(200)).await;
        let ping = serde_json::json!({
            "v": 1, "id": "01J0000000000000000000PVNG", "ts": "2026-01-01T00:00:00Z",
            "session": "s", "sender": "system", "type": "heartbeat.ping", "payload": {}
        })
        .to_string();
        let b = ping.as_bytes();
        let (a, rest) = b.split_at(10);
        let (m, z) = rest.split_at(20);
        let mut out = raw_frame(0x01, None, a);
        out.extend(raw_frame(0x89, None, b"p1"));
        out.extend(raw_frame(0x00, None, m));
        out.extend(raw_frame(0x8a, None, b"unsolicited pong"));
        out.extend(raw_frame(0x89, None, b""));
        out.extend(raw_frame(0x80, None, z));
        let _ = w.write_all(&out).await;
        tokio::time::sleep(Duration::from_secs(30)).await;
    });
    let mut gw = Gateway::start_for_server(&url, &["--session", "s"]);
    Sender::new(gw.listen, 8).send("Hello. ");
    let answered = tokio::time::timeout(WAIT, async {
        loop {
            let v = rx.recv().await.unwrap();
            if v["type"] == "heartbeat.pong" {
                return v;
            }
        }
    })
    .await;
    let log = gw.stderr_lines().join("\n");
    gw.kill();
    let v = answered.unwrap_or_else(|_| panic!("no pong\n{log}"));
    assert_eq!(v["ref"], "01J0000000000000000000PVNG", "{v}");
}
