//! `wss://` with rustls: a real TLS WebSocket server with a self-signed certificate; the gateway
//! trusts it only through `--ca-file`.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::gateway_proc::{Gateway, Sender};
use futures_util::StreamExt;
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(20);

/// A minimal wss server: accepts TLS, then WebSocket, and records every text frame.
async fn wss_server() -> (u16, String, Arc<Mutex<Vec<Value>>>) {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let pem = cert.cert.pem();
    let cert_der = cert.cert.der().clone();
    let key = rustls_pki_types::PrivateKeyDer::Pkcs8(cert.signing_key.serialize_der().into());
    let config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(vec![cert_der], key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let frames = Arc::new(Mutex::new(Vec::new()));
    let sink = frames.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, sink) = (acceptor.clone(), sink.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let Ok(mut ws) = tokio_tungstenite::accept_async(tls).await else {
                    return;
                };
                while let Some(Ok(msg)) = ws.next().await {
                    if let Ok(t) = msg.to_text()
                        && let Ok(v) = serde_json::from_str(t)
                    {
                        sink.lock().unwrap().push(v);
                    }
                }
            });
        }
    });
    (port, pem, frames)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wss_with_a_private_ca_file() {
    let (port, pem, frames) = wss_server().await;
    let ca = std::env::temp_dir().join(format!("pvp-t140-ca-{}.pem", std::process::id()));
    std::fs::write(&ca, pem).unwrap();
    let url = format!("wss://localhost:{port}");

    // Trusted through --ca-file: the transcript arrives over TLS.
    let mut gw = Gateway::start_for_server(&url, &["--ca-file", ca.to_str().unwrap()]);
    Sender::new(gw.listen, 5).send("Over TLS. ");
    let deadline = Instant::now() + WAIT;
    loop {
        let got = frames.lock().unwrap().clone();
        if got
            .iter()
            .any(|e| e["type"] == "context.add" && e["payload"]["content"] == "Over TLS.")
        {
            assert_eq!(got[0]["type"], "session.join");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "nothing arrived over wss: {got:?}\n{}",
            gw.stderr_lines().join("\n")
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(gw.terminate(WAIT).success());

    // Without it the self-signed certificate is refused, and says why.
    let before = frames.lock().unwrap().len();
    let mut gw = Gateway::start(&["--listen", "127.0.0.1:0", "--server", &url]);
    Sender::new(gw.listen, 6).send("Not trusted. ");
    let line = gw.wait_stderr(WAIT, "PVP connect failed");
    assert!(line.to_lowercase().contains("certificate"), "{line}");
    assert!(gw.terminate(WAIT).success());
    assert_eq!(frames.lock().unwrap().len(), before);

    // A CA file that is not PEM is a clear startup error.
    std::fs::write(&ca, "not a certificate").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_pvp-t140"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--server",
            &url,
            "--ca-file",
            ca.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    std::fs::remove_file(&ca).ok();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--ca-file"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
