//! `--metrics`: Prometheus text on /metrics with real counters, and /healthz readiness that
//! follows the PVP server.

mod common;

use std::time::{Duration, Instant};

use common::gateway_proc::{Gateway, Sender, http_get, run_briefly, sample};
use common::pvp_server::TestPvpServer;

const WAIT: Duration = Duration::from_secs(20);

#[test]
fn metrics_count_what_happened() {
    let mut gw = Gateway::start(&["--listen", "127.0.0.1:0", "--metrics", "127.0.0.1:0"]);
    let m = gw.metrics_addr();
    let mut s = Sender::new(gw.listen, 77);
    s.send("One sentence. And");
    std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .send_to(b"junk", gw.listen)
        .unwrap();
    // Counters are published once a second: poll until they show up.
    let deadline = Instant::now() + WAIT;
    let body = loop {
        let (status, body) = http_get(m, "/metrics");
        assert_eq!(status, 200);
        // The join is counted as the sink lets it out, the datagrams as the core publishes.
        if sample(&body, "pvp_t140_datagrams_total") == Some(2.0)
            && sample(&body, "pvp_t140_participants_total") == Some(1.0)
        {
            break body;
        }
        assert!(Instant::now() < deadline, "{body}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(
        sample(&body, "pvp_t140_drops_total{reason=\"rtp_too_short\"}"),
        Some(1.0)
    );
    assert_eq!(
        sample(&body, "pvp_t140_chunks_total{cause=\"sentence\"}"),
        Some(1.0)
    );
    assert_eq!(sample(&body, "pvp_t140_streams_live"), Some(1.0));
    assert_eq!(sample(&body, "pvp_t140_participants_total"), Some(1.0));
    assert_eq!(sample(&body, "pvp_t140_receive_workers_running"), Some(1.0));
    assert!(body.contains("# TYPE pvp_t140_send_latency_seconds histogram"));
    let (status, text) = http_get(m, "/healthz");
    assert_eq!(
        (status, text.trim()),
        (200, "ready: udp bound, sink stdout")
    );
    assert!(gw.terminate(WAIT).success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_follows_the_pvp_server() {
    let server = TestPvpServer::start().await;
    let url = server.url();
    let mut gw = Gateway::start(&[
        "--listen",
        "127.0.0.1:0",
        "--metrics",
        "127.0.0.1:0",
        "--server",
        &url,
    ]);
    let m = gw.metrics_addr();
    let (status, body) = tokio::task::spawn_blocking(move || http_get(m, "/healthz"))
        .await
        .unwrap();
    assert_eq!(status, 200, "{body}");
    server.stop().await;
    let deadline = Instant::now() + WAIT;
    loop {
        let (status, body) = tokio::task::spawn_blocking(move || http_get(m, "/healthz"))
            .await
            .unwrap();
        if status == 503 {
            assert!(body.contains("PVP server"), "{body}");
            break;
        }
        assert!(Instant::now() < deadline, "still {status} {body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(gw.terminate(WAIT).success());
}

/// A participant the PVP server refuses (UNAUTHORIZED) is counted on /metrics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_participant_the_server_refuses_is_counted() {
    let server = TestPvpServer::start().await;
    let url = server.url();
    let mut gw =
        Gateway::start_for_server(&url, &["--metrics", "127.0.0.1:0", "--session", "counted"]);
    let m = gw.metrics_addr();
    let mut a = Sender::new(gw.listen, 0xc0);
    a.send("Hello there. ");
    let p = a.participant();
    server
        .wait_until(WAIT, "the first sentence", |s| {
            !s.received_of_type("context.add").is_empty()
        })
        .await;
    let scrape = || async move {
        tokio::task::spawn_blocking(move || http_get(m, "/metrics").1)
            .await
            .unwrap()
    };
    let body = scrape().await;
    assert_eq!(
        sample(&body, "pvp_t140_participants_refused_total"),
        Some(0.0),
        "{body}"
    );
    let conn = server
        .received()
        .iter()
        .find(|r| r.envelope["sender"] == p.as_str())
        .unwrap()
        .conn;
    let refusal = common::pvp_server::make_envelope(
        "error",
        "counted",
        "system",
        serde_json::json!({"code": "UNAUTHORIZED", "message": "test", "recoverable": false}),
        None,
    );
    assert!(server.send_to(conn, refusal));
    gw.wait_stderr(WAIT, "refused this participant");
    let body = scrape().await;
    assert_eq!(
        sample(&body, "pvp_t140_participants_refused_total"),
        Some(1.0),
        "{body}"
    );
    assert!(
        body.contains("pvp_t140_gated_chunks_refused_total 0"),
        "{body}"
    );
    assert!(
        body.contains("pvp_t140_spool_write_errors_total 0"),
        "{body}"
    );
    assert!(gw.terminate(WAIT).success());
    server.stop().await;
    // And in the totals of the final line, where whoever reads the log finds it.
    let stopped = gw
        .stderr_lines()
        .into_iter()
        .find(|l| l.contains("\"message\":\"stopped\""))
        .expect("a stopped line");
    let v: serde_json::Value = serde_json::from_str(&stopped).unwrap();
    assert_eq!(v["fields"]["participants_refused"], 1, "{stopped}");
    assert_eq!(v["fields"]["gated_chunks_refused"], 0, "{stopped}");
}

/// A `--server` URL with a query and no path (`ws://127.0.0.1:PORT?x=1`). /healthz took its
/// host and port to end at the first `/`, so it connected to "127.0.0.1:PORT?x=1" (an invalid
/// port) and answered 503 for a server that was there. And the WebSocket handshake asked for
/// `GET ?x=1 HTTP/1.1`, a request target that is not origin-form (RFC 9112 3.2.1: it starts
/// with `/`), which an HTTP server may refuse: the URL's path is `/` when it has none (RFC 3986
/// 6.2.3), so the gateway asks for `GET /?x=1`.
#[test]
fn a_server_url_with_a_query_and_no_path_is_checked_and_asked_for_as_origin_form() {
    let request_line = handshake_request_line(|port| format!("ws://127.0.0.1:{port}?x=1"));
    assert_eq!(request_line, "GET /?x=1 HTTP/1.1\r\n");
}

/// Starts the gateway for the server URL `url(port)` of a listener on 127.0.0.1, checks that
/// /healthz finds that server reachable, sends one sentence and returns the request line of
/// the participant's WebSocket handshake.
fn handshake_request_line(url: impl Fn(u16) -> String) -> String {
    let (port, lines) = first_lines_server();
    let mut gw = Gateway::start_for_server(&url(port), &["--metrics", "127.0.0.1:0"]);
    let (status, body) = http_get(gw.metrics_addr(), "/healthz");
    assert_eq!(
        (status, body.trim()),
        (
            200,
            format!("ready: udp bound, PVP server 127.0.0.1:{port} reachable").as_str()
        )
    );
    Sender::new(gw.listen, 0x9).send("Hello. ");
    let request_line = lines
        .recv_timeout(WAIT)
        .expect("no handshake reached the server");
    gw.kill();
    request_line
}

/// A listener that takes connections and reports each one's first line: /healthz's probe
/// sends none, a participant's connection its handshake's request line.
fn first_lines_server() -> (u16, std::sync::mpsc::Receiver<String>) {
    use std::io::{BufRead, BufReader};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let (lines_tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { break };
            let tx = lines_tx.clone();
            std::thread::spawn(move || {
                let mut line = String::new();
                let _ = BufReader::new(&conn).read_line(&mut line);
                if !line.is_empty() {
                    let _ = tx.send(line);
                }
            });
        }
    });
    (port, lines)
}

/// A URL's scheme is case-insensitive (RFC 3986 3.1: "schemes are case-insensitive", and
/// canonical lowercase): `WS://host/pvp` was refused at start as not a ws:// URL. It is taken
/// as `ws://host/pvp`: /healthz checks the server and the participants connect to it.
#[test]
fn a_server_url_scheme_in_capitals_is_taken() {
    let request_line = handshake_request_line(|port| format!("WS://127.0.0.1:{port}/pvp"));
    assert_eq!(request_line, "GET /pvp HTTP/1.1\r\n");
}

/// `/healthz` answers 200 while "the PVP server accepts connections" (README "Metrics and
/// health"), whatever case the `--server` scheme is in. `WS://host/pvp`, with no port, is port
/// 80, where the participants connect; /healthz was given the URL as typed, found no ws or wss
/// scheme in `WS`, and said 503 for a server that was there: an orchestrator would keep the
/// gateway out of service (or restart it) for good.
#[test]
fn healthz_is_ready_for_a_server_url_scheme_in_capitals_without_a_port() {
    // A loopback address of its own, so port 80 is free whatever else runs here.
    let host = format!("127.{}.{}.{}", 100 + std::process::id() % 100, 31, 7);
    let listener = match std::net::TcpListener::bind((host.as_str(), 80)) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("skipped: cannot bind {host}:80 ({e})");
            return;
        }
    };
    // Holds every connection: /healthz only connects.
    std::thread::spawn(move || {
        let held: Vec<_> = listener.incoming().map_while(Result::ok).collect();
        drop(held);
    });
    let url = format!("WS://{host}/pvp");
    let mut gw = Gateway::start_for_server(&url, &["--metrics", "127.0.0.1:0"]);
    let (status, body) = http_get(gw.metrics_addr(), "/healthz");
    assert!(gw.terminate(WAIT).success());
    assert_eq!(
        (status, body.trim()),
        (
            200,
            format!("ready: udp bound, PVP server {host}:80 reachable").as_str()
        ),
        "--server {url}"
    );
}

/// A `--server` URL whose port the URI type cannot read (beyond 65535) was taken as one with no
/// port: the participants connected to port 80, and /healthz to the text after the colon. It
/// is refused at start, naming the URL; so is one without a host.
#[test]
fn a_server_url_with_no_usable_port_or_host_is_refused_at_start() {
    for (url, expect) in [
        ("ws://127.0.0.1:99999/", "the port is not 0-65535"),
        ("ws://:3000/", "no host"),
        ("ws://", "no host"),
        ("wss:///pvp", "no host"),
    ] {
        let run = run_briefly(
            &["--listen", "127.0.0.1:0", "--server", url],
            Duration::from_secs(10),
        );
        let want = format!("--server {url}: {expect}");
        assert!(
            matches!(&run, Some((false, err)) if err.contains(&want)),
            "{url}: {run:?}"
        );
    }
}

/// A `--server` password is not shown in the log ("a server URL's password is not logged").
/// A generated password often has a `/` in it (base64): `ws://gw:Zm9v/YmFy@host/pvp`, not
/// percent-encoded, is refused at start, rightly, but the error line prints the URL whole:
/// `ShownUrl` takes the authority to end at the first `/`, finds no `@` before it and hides
/// nothing. A user who pasted a password into the URL expects the refusal to keep it hidden,
/// as every other line does.
#[test]
fn a_refused_server_url_does_not_show_a_password_with_a_slash() {
    let url = "ws://gw:Zm9v/YmFy@127.0.0.1:1/pvp";
    let run = run_briefly(
        &["--listen", "127.0.0.1:0", "--server", url],
        Duration::from_secs(10),
    );
    let Some((false, err)) = run else {
        panic!("not refused at start: {run:?}");
    };
    assert!(
        !err.contains("Zm9v") && !err.contains("YmFy"),
        "the password is in the log: {err}"
    );
}

/// README (Configuration file): speakers that a mapping rule gives one participant id "are one
/// participant: it joins with the first of them". The metric counted every speaker's join,
/// the one held back too: two senders mapped to "room" made one `session.join` on stdout and
/// `pvp_t140_participants_total 2`.
#[test]
fn participants_total_counts_one_participant_for_speakers_mapped_to_one_id() {
    let cfg =
        std::env::temp_dir().join(format!("pvp-t140-metrics-room-{}.toml", std::process::id()));
    std::fs::write(
        &cfg,
        "[[stream]]\nsource = \"127.0.0.1\"\nparticipant = \"room\"\n",
    )
    .unwrap();
    let mut gw = Gateway::start(&[
        "--config",
        cfg.to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
        "--metrics",
        "127.0.0.1:0",
    ]);
    let m = gw.metrics_addr();
    let mut a = Sender::new(gw.listen, 0xa);
    let mut b = Sender::new(gw.listen, 0xb);
    a.send("First speaker. ");
    gw.wait_stdout(WAIT, "First speaker.");
    b.send("Second speaker. ");
    // Once its text is on stdout, the sink has passed (or held back) its join; the core's
    // counters are published once a second: wait for both chunks there too.
    gw.wait_stdout(WAIT, "Second speaker.");
    let deadline = Instant::now() + WAIT;
    let body = loop {
        let (_, body) = http_get(m, "/metrics");
        if sample(&body, "pvp_t140_chunks_total{cause=\"sentence\"}") == Some(2.0) {
            break body;
        }
        assert!(Instant::now() < deadline, "{body}");
        std::thread::sleep(Duration::from_millis(100));
    };
    let joins = gw
        .stdout_lines()
        .iter()
        .filter(|l| l.contains("\"type\":\"session.join\""))
        .count();
    assert!(gw.terminate(WAIT).success());
    std::fs::remove_file(&cfg).ok();
    assert_eq!(joins, 1, "one participant joins");
    assert_eq!(
        sample(&body, "pvp_t140_participants_total"),
        Some(1.0),
        "{body}"
    );
}

/// Stalled metrics clients do not starve participants of descriptors: 150 clients that send
/// half a request line and stop, under a soft open-file limit of 128, and the sentence of a
/// sender that speaks afterwards still reaches the PVP server. The endpoint serves at most
/// `metrics::MAX_CONNECTIONS` clients at once and closes one that stalls
/// (`metrics::CLIENT_TIMEOUT`). A review found every stalled client held a descriptor for good
/// (review, session 33).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_metrics_clients_do_not_starve_participants_of_descriptors() {
    use std::io::Write;
    let server = common::pvp_server::TestPvpServer::start().await;
    let url = server.url();
    let mut gw = Gateway::start_with_fd_limit(
        128,
        &[
            "--listen",
            "127.0.0.1:0",
            "--server",
            &url,
            "--max-streams",
            "10",
            "--metrics",
            "127.0.0.1:0",
        ],
    );
    let m = gw.metrics_addr();
    let mut stalled = Vec::new();
    for _ in 0..150 {
        let mut s = std::net::TcpStream::connect(m).unwrap();
        // Half a request line, then nothing.
        let _ = s.write_all(b"GET /metrics HTTP/1.1\r\n");
        stalled.push(s);
    }
    // Let the endpoint accept what it will.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut s = Sender::new(gw.listen, 0x51a1);
    s.send("Still heard despite the scrapers. ");
    server
        .wait_until(
            Duration::from_secs(45),
            "the sentence at the PVP server",
            |s| !s.received_of_type("context.add").is_empty(),
        )
        .await;
    drop(stalled);
    assert!(gw.terminate(WAIT).success());
}
