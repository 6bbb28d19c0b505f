//! A WebSocket server's side written by hand, frame by frame: for tests of a server that
//! answers no ping, reads nothing, or closes in ways a library server would not.

#![allow(dead_code)]

/// Reads a client's HTTP upgrade request and answers 101: the stream is then a WebSocket's
/// server side this test reads and writes raw frames on (so it answers no ping unless told).
pub async fn accept_raw(tcp: &mut tokio::net::TcpStream) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut req = Vec::new();
    let mut b = [0u8; 1];
    while !req.ends_with(b"\r\n\r\n") {
        assert_ne!(
            tcp.read(&mut b).await.unwrap(),
            0,
            "closed in its handshake"
        );
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
        .unwrap();
    let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
    let resp = format!(
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: {accept}\r\n\r\n"
    );
    tcp.write_all(resp.as_bytes()).await.unwrap();
}

/// One (masked) client frame: its opcode and unmasked payload; `None` at the end.
pub async fn read_frame(r: &mut tokio::net::TcpStream) -> Option<(u8, Vec<u8>)> {
    use tokio::io::AsyncReadExt;
    let mut h = [0u8; 2];
    r.read_exact(&mut h).await.ok()?;
    let len = match h[1] & 0x7f {
        126 => u64::from(r.read_u16().await.ok()?),
        127 => r.read_u64().await.ok()?,
        n => u64::from(n),
    };
    let mut mask = [0u8; 4];
    if h[1] & 0x80 != 0 {
        r.read_exact(&mut mask).await.ok()?;
    }
    let mut p = vec![0u8; len as usize];
    r.read_exact(&mut p).await.ok()?;
    for (i, b) in p.iter_mut().enumerate() {
        *b ^= mask[i % 4];
    }
    Some((h[0] & 0x0f, p))
}

/// A server frame (unmasked, final) of `opcode` with `payload` (under 64 KiB).
pub async fn write_frame(w: &mut tokio::net::TcpStream, opcode: u8, payload: &[u8]) {
    use tokio::io::AsyncWriteExt;
    let mut f = vec![0x80 | opcode];
    if payload.len() < 126 {
        f.push(payload.len() as u8);
    } else {
        f.push(126);
        f.extend_from_slice(&(payload.len() as u16).to_be_bytes());
    }
    f.extend_from_slice(payload);
    w.write_all(&f).await.unwrap();
}

/// Every text frame the test's connections read: (connection number, envelope).
pub type Frames = tokio::sync::mpsc::UnboundedReceiver<(usize, serde_json::Value)>;

/// The next text frame any connection read (20 s at most).
pub async fn next(rx: &mut Frames) -> (usize, serde_json::Value) {
    tokio::time::timeout(std::time::Duration::from_secs(20), rx.recv())
        .await
        .expect("a frame within 20 s")
        .unwrap()
}

/// "conn type content" of a frame.
pub fn shown((conn, v): &(usize, serde_json::Value)) -> String {
    format!(
        "{conn} {} {}",
        v["type"].as_str().unwrap_or(""),
        v["payload"]["content"].as_str().unwrap_or("")
    )
}
