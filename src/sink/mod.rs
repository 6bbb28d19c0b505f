//! Where envelopes go: stdout (pvp-spec 19.4 stdio binding) or a PVP server over WebSocket
//! (19.1). Sinks never block the receive workers: a worker hands its envelopes to the bounded
//! queue in front of the sink ([`handoff`]) and moves on.

pub mod gate;
pub mod oversize;
pub mod spool;
pub mod stdout;
pub mod tls;
pub mod ws;

use std::time::Duration;

use crate::handoff;
use crate::metrics::SinkMetrics;

/// A 64-bit hash of `x` that a connection or the journal keeps in place of the strings
/// (ids, participants): 8 bytes each, two alike by chance about 1 in 2^58 among thousands.
pub(crate) fn hash64(x: impl std::hash::Hash) -> u64 {
    use std::hash::BuildHasher;
    std::hash::BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default()
        .hash_one(x)
}

/// A server URL as logs show it: a password in its user information (`ws://user:pw@host/`,
/// RFC 3986 3.2.1, which that RFC itself deprecates) is replaced by `***`. Logs are read by
/// more people than the command line. Whatever the URL's mistakes (a password with an
/// unencoded `/`, `?` or `#`, a slash missing after the scheme), everything from the
/// authority's start (after `scheme://`, else the string's start) to the last `@` is taken for
/// user information, and what follows its first `:` hidden: an `@` later in a path or query is
/// shown as `host:***@...` rather than risk a password.
pub struct ShownUrl<'a>(pub &'a str);

impl std::fmt::Display for ShownUrl<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let url = self.0;
        let Some(at) = url.rfind('@') else {
            return write_query_hidden(f, url);
        };
        let start = url
            .find("://")
            .filter(|&i| {
                let scheme = &url[..i];
                scheme.starts_with(|c: char| c.is_ascii_alphabetic())
                    && scheme
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
            })
            .map_or(0, |i| i + 3)
            .min(at);
        match url[start..at].find(':') {
            Some(colon) => {
                write!(f, "{}:***", &url[..start + colon])?;
                // An `@` in the query (`?user=a@b.example&token=...`, after a port's `:`):
                // what follows it is still the query.
                if url[..at].contains('?') {
                    write_pairs_hidden(f, &url[at..])
                } else {
                    write_query_hidden(f, &url[at..])
                }
            }
            None => write_query_hidden(f, url),
        }
    }
}

/// Query parameters whose names say they hold a secret (`?token=`, `access_token`, `api_key`,
/// `password`, `sig`, ...; a server may take its token there, as browsers' WebSocket cannot set
/// headers) are written `name=***`; the rest of `s` as it is.
fn write_query_hidden(f: &mut std::fmt::Formatter<'_>, s: &str) -> std::fmt::Result {
    let Some(q) = s.find('?') else {
        return f.write_str(s);
    };
    f.write_str(&s[..=q])?;
    write_pairs_hidden(f, &s[q + 1..])
}

/// A query (up to a `#`) as [`write_query_hidden`] writes it, then the fragment as it is.
fn write_pairs_hidden(f: &mut std::fmt::Formatter<'_>, s: &str) -> std::fmt::Result {
    let (query, fragment) = s.split_at(s.find('#').unwrap_or(s.len()));
    // Pairs are separated by `&`, or `;` as some servers also take (the older HTML form rules).
    for piece in query.split_inclusive(['&', ';']) {
        let (pair, sep) = match piece.strip_suffix(['&', ';']) {
            Some(pair) => (pair, &piece[pair.len()..]),
            None => (piece, ""),
        };
        match pair.split_once('=') {
            Some((name, _)) if secret_name(name) => write!(f, "{name}=***{sep}")?,
            _ => f.write_str(piece)?,
        }
    }
    f.write_str(fragment)
}

fn secret_name(name: &str) -> bool {
    // As the server reads it: percent-decoded (`%74oken` is `token`).
    let mut decoded = Vec::with_capacity(name.len());
    let mut bytes = name.bytes();
    while let Some(b) = bytes.next() {
        let hex = |c: u8| char::from(c).to_digit(16);
        let mut ahead = bytes.clone();
        match (b, ahead.next().and_then(hex), ahead.next().and_then(hex)) {
            (b'%', Some(h), Some(l)) => {
                decoded.push((h * 16 + l) as u8);
                bytes = ahead;
            }
            _ => decoded.push(b),
        }
    }
    let name = String::from_utf8_lossy(&decoded).to_ascii_lowercase();
    [
        "token", "pass", "pwd", "secret", "key", "auth", "sig", "cred",
    ]
    .iter()
    .any(|w| name.contains(w))
}

/// Counters every sink keeps.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SinkStats {
    pub sent: u64,
    /// Envelopes the sink took and did not deliver: refused by a WebSocket participant's own
    /// queue, or not written once stdout failed or the stop's grace ran out. Those the
    /// hand-off queue in front of the sink refused are not among them (`sink_queue_full`).
    pub dropped: u64,
}

/// A running sink: it takes the receive workers' envelopes from the hand-off queue until every
/// worker has gone.
pub enum Sink {
    /// The stdout writer thread, which reads the queue itself.
    Stdout(stdout::StdoutSink),
    /// A task moving the queue's envelopes into the WebSocket sink, then closing it.
    Ws(tokio::task::JoinHandle<SinkStats>),
}

/// Envelopes taken from the queue at most at once.
const TAKE: usize = 1024;

impl Sink {
    /// Starts taking from `rx`: into `ws` when given, else to stdout. `grace` bounds how long
    /// the end waits for what is still queued to go out.
    pub fn start(
        rx: handoff::Receiver,
        ws: Option<ws::WsSink>,
        metrics: SinkMetrics,
        grace: Duration,
    ) -> std::io::Result<Sink> {
        Ok(match ws {
            None => Sink::Stdout(stdout::StdoutSink::spawn(rx, metrics, grace)?),
            Some(ws) => {
                metrics.queue_depth.follow(rx.queued());
                Sink::Ws(tokio::spawn(feed_ws(rx, ws, grace)))
            }
        })
    }

    /// Waits for the sink to deliver what is queued and stop, once every worker's sender is
    /// gone.
    pub async fn finish(self) -> Result<SinkStats, String> {
        match self {
            Sink::Stdout(s) => Ok(s.close().await),
            Sink::Ws(task) => task.await.map_err(|e| format!("sink task: {e}")),
        }
    }
}

async fn feed_ws(mut rx: handoff::Receiver, mut ws: ws::WsSink, grace: Duration) -> SinkStats {
    // Whatever the workers queued since the last wake-up goes on as one batch.
    while let Some(batch) = rx.recv(TAKE).await {
        batch.into_iter().for_each(|e| ws.send(e));
    }
    ws.close(grace).await
}

#[cfg(test)]
mod tests {
    use super::ShownUrl;

    #[test]
    fn a_token_in_a_server_urls_query_is_not_shown() {
        let shown = |u: &str| ShownUrl(u).to_string();
        assert_eq!(
            shown("wss://host/pvp?session=s1&token=abc&x"),
            "wss://host/pvp?session=s1&token=***&x"
        );
        assert_eq!(
            shown("ws://h/?Access_Token=a&API_KEY=b&sig=c#frag"),
            "ws://h/?Access_Token=***&API_KEY=***&sig=***#frag"
        );
        assert_eq!(shown("ws://u:pw@h/?token=t"), "ws://u:***@h/?token=***");
        assert_eq!(shown("ws://h/?session=a"), "ws://h/?session=a");
    }

    #[test]
    fn a_password_in_a_server_url_is_not_shown() {
        let shown = |u: &str| ShownUrl(u).to_string();
        assert_eq!(
            shown("ws://user:secret@host:3000/p?x=1"),
            "ws://user:***@host:3000/p?x=1"
        );
        assert_eq!(shown("wss://user:s@cr@t@host"), "wss://user:***@host");
        assert_eq!(shown("ws://user@host/"), "ws://user@host/");
        // An `@` in a path cannot be told from a password with a `/`: hidden to be safe.
        assert_eq!(shown("ws://host:3000/a@b"), "ws://host:***@b");
        assert_eq!(shown("ws://gw:Zm9v/YmFy@host/pvp"), "ws://gw:***@host/pvp");
        assert_eq!(
            shown("user:pw@host/?next=ws://x"),
            "user:***@host/?next=ws://x"
        );
        // An `@` in a query cannot be told from one in a password with a `?`: hidden to be safe.
        assert_eq!(shown("ws://[::1]:3000?q=@"), "ws://[:***@");
        assert_eq!(
            shown("ws://gw:s3cr#tpw@host:1/pvp"),
            "ws://gw:***@host:1/pvp"
        );
        assert_eq!(
            shown("ws://gw:s3cr?tpw@host:1/pvp"),
            "ws://gw:***@host:1/pvp"
        );
        assert_eq!(shown("ws:/u:a//b@host"), "ws:***@host");
        assert_eq!(shown("ws://host:3000/p?x=1"), "ws://host:3000/p?x=1");
        assert_eq!(shown("stdout"), "stdout");
    }

    /// `--server ws:/user:pw@host` (one slash short, a typo) is refused at start with an error
    /// that prints the URL through `ShownUrl`. With no `://` it takes the authority to begin at
    /// the string's start and end at the first `/` ("ws:"), finds no `@` there and shows the
    /// password. A user expects a password kept out of the log whatever the typo around it.
    #[test]
    fn a_password_in_a_url_missing_a_slash_is_not_shown() {
        let shown = ShownUrl("ws:/user:secret@host:3000/").to_string();
        assert!(!shown.contains("secret"), "{shown}");
    }

    /// The server URL is logged at every connect, with a token in its query hidden. With a port in
    /// the URL and an `@` in the query (an e-mail address: `?user=alice@example.org&token=...`),
    /// the part up to that `@` was taken for user information and hidden, and the rest, the
    /// token included, written as it is: the token was in the log in full.
    #[test]
    fn a_token_after_an_at_sign_in_the_query_is_not_shown() {
        let shown =
            super::ShownUrl("wss://pvp.example:8443/pvp?user=alice@example.org&token=S3CRET")
                .to_string();
        assert!(!shown.contains("S3CRET"), "{shown}");
    }

    /// Servers that split a query on `;` as well as `&` (the older HTML form rules, many
    /// frameworks) and that percent-decode its names take `?session=s;token=...` and
    /// `?%74oken=...` for a token: the log showed both in full.
    #[test]
    fn a_token_after_a_semicolon_or_under_a_percent_encoded_name_is_not_shown() {
        for url in [
            "wss://pvp.example/pvp?session=s1;token=S3CRET",
            "wss://pvp.example/pvp?session=s1&%74oken=S3CRET",
            "wss://pvp.example/pvp?api%5Fkey=S3CRET",
        ] {
            let shown = super::ShownUrl(url).to_string();
            assert!(!shown.contains("S3CRET"), "{shown}");
            assert!(
                shown.contains("session=s1") || !url.contains("session"),
                "{shown}"
            );
        }
    }
}
