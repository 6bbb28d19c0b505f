//! A dual-stack listener (`--listen [::]:PORT`): the kernel reports IPv4 senders as v4-mapped
//! IPv6 addresses (`[::ffff:127.0.0.1]:4000`). The gateway must take them as the IPv4 senders
//! they are: an IPv4 `--allow` network admits them, and their participant id and source URI
//! are the ones an IPv4 listener gives.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::gateway_proc::{Gateway, Sender};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(20);

#[test]
fn an_ipv4_sender_to_a_dual_stack_listener_is_known_by_its_ipv4_address() {
    let mut gw = Gateway::start(&["--listen", "[::]:0", "--allow", "127.0.0.0/8"]);
    assert!(gw.listen.is_ipv6(), "listening on {}", gw.listen);
    let to = SocketAddr::from(([127, 0, 0, 1], gw.listen.port()));
    let mut sender = Sender::new(to, 0x4444);
    sender.send("Hello over IPv4. ");

    let line = gw.wait_stdout(WAIT, "\"context.add\"");
    let add: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(add["payload"]["content"], "Hello over IPv4.");
    // `t140:00004444@127.0.0.1:PORT`, not `...@[::ffff:127.0.0.1]:PORT`.
    assert_eq!(add["sender"], sender.participant());
    assert_eq!(
        add["payload"]["source"],
        format!("rtp://{}?ssrc=0x00004444", sender.local_addr())
    );
    let join = gw.wait_stdout(WAIT, "\"session.join\"");
    let join: Value = serde_json::from_str(&join).unwrap();
    assert_eq!(
        join["payload"]["participant"]["metadata"]["source"],
        sender.local_addr().to_string()
    );
    assert!(gw.terminate(WAIT).success());
    // Admitted by the IPv4 allow list: nothing was refused.
    gw.assert_stderr_lacks("\"not_allowed\"");
}
