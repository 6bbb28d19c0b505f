//! The command line refuses what cannot work (a `--server` on port 0, a `--listen` on a
//! multicast group) and takes a flag given again after the container entrypoint's.
//!
//! Found by review au (session 46).

mod common;

use std::time::Duration;

use common::gateway_proc::{Gateway, http_get, run_briefly};

/// A configuration file of this test process's own, in the temporary directory.
fn write(name: &str, text: &str) -> std::path::PathBuf {
    let p = std::env::temp_dir().join(format!("pvp-t140-au-{}-{name}.toml", std::process::id()));
    std::fs::write(&p, text).unwrap();
    p
}

/// Found by review au (session 46). A `--server` URL on port 0 (`ws://127.0.0.1:0/pvp`, a
/// template's port left unfilled) was taken: no server listens on port 0, every participant's
/// connect was refused and retried for as long as the gateway ran, its transcripts queued and
/// then dropped, and the start said nothing. It is refused at start with exit status 1, naming
/// the URL, on the command line and in the configuration file (with the file's line).
#[test]
fn a_server_url_on_port_0_is_refused_at_start() {
    let url = "ws://127.0.0.1:0/pvp";
    let run = run_briefly(
        &["--listen", "127.0.0.1:0", "--server", url],
        Duration::from_secs(10),
    );
    assert!(
        matches!(&run, Some((false, err)) if err.contains(&format!("--server {url}: port 0"))),
        "{run:?}"
    );
    let file = write("port0", &format!("session = \"s\"\nserver = \"{url}\"\n"));
    let run = run_briefly(
        &[
            "--listen",
            "127.0.0.1:0",
            "--config",
            file.to_str().unwrap(),
        ],
        Duration::from_secs(10),
    );
    let _ = std::fs::remove_file(&file);
    let want = format!("{}:2: server: {url}: port 0", file.display());
    assert!(
        matches!(&run, Some((false, err)) if err.contains(&want)),
        "{run:?}"
    );
}

/// Found by review au (session 46). A flag given twice was refused ("cannot be used multiple
/// times"), so the container's entrypoint (deploy/Containerfile: `--listen 0.0.0.0:5004
/// --metrics 0.0.0.0:9464 --log-format json`) could not be overridden from `docker run IMAGE
/// --listen ...`: the container exited at start. Now the last value given is taken, as the
/// JSON-mode check of the raw arguments (`json_logs_asked`) already read them, and the
/// repeatable `--role` and `--allow` still add up.
#[test]
fn a_flag_given_again_after_the_containers_entrypoint_takes_its_place() {
    let entrypoint = [
        "--listen",
        "0.0.0.0:5004",
        "--metrics",
        "0.0.0.0:9464",
        "--log-format",
        "json",
    ];
    let mut args = entrypoint.to_vec();
    args.extend([
        "--listen",
        "127.0.0.1:0",
        "--metrics",
        "127.0.0.1:0",
        "--rtcp",
        "false",
        "--role",
        "driver",
        "--role",
        "observer",
        "--allow",
        "127.0.0.1",
        "--allow",
        "10.0.0.0/8",
    ]);
    let mut gw = Gateway::start(&args);
    assert!(gw.listen.ip().is_loopback(), "{}", gw.listen);
    let metrics = gw.metrics_addr();
    assert!(
        metrics.ip().is_loopback() && metrics.port() != 9464,
        "{metrics}"
    );
    assert_eq!(http_get(metrics, "/healthz").0, 200);
    let mut s = common::gateway_proc::Sender::new(gw.listen, 0xa0);
    s.send("Hello there. ");
    let join = gw.wait_stdout(Duration::from_secs(20), "session.join");
    assert!(gw.terminate(Duration::from_secs(20)).success());
    let join: serde_json::Value = serde_json::from_str(&join).unwrap();
    assert_eq!(
        join["payload"]["participant"]["roles"],
        serde_json::json!(["driver", "observer"]),
        "{join}"
    );
}

/// Found by review au (session 46). `--listen 239.255.0.1:5004` (a multicast group) was bound
/// and the gateway said it was listening, but it never joins a group, so it read nothing,
/// however much was sent to the group, and said nothing. It is refused at start with exit
/// status 1, naming the flag, or the file's line for a `listen` from `--config`.
#[test]
fn a_multicast_listen_address_is_refused_at_start() {
    for listen in ["239.255.0.1:0", "[ff02::1]:0", "[::ffff:239.255.0.1]:0"] {
        let run = run_briefly(&["--listen", listen], Duration::from_secs(10));
        let want = format!("--listen {listen}: a multicast group");
        assert!(
            matches!(&run, Some((false, err)) if err.contains(&want)),
            "{listen}: {run:?}"
        );
    }
    let file = write("multicast", "session = \"s\"\nlisten = \"239.255.0.1:0\"\n");
    let run = run_briefly(
        &["--config", file.to_str().unwrap()],
        Duration::from_secs(10),
    );
    let _ = std::fs::remove_file(&file);
    let want = format!(
        "{}:2: listen 239.255.0.1:0: a multicast group",
        file.display()
    );
    assert!(
        matches!(&run, Some((false, err)) if err.contains(&want)),
        "{run:?}"
    );
}

/// `--listen`, `--metrics` and their configuration file keys take numeric addresses only (a
/// host name may name several, `localhost` both 127.0.0.1 and ::1, and a listener binds one).
/// `--listen localhost:5004` was refused with the standard library's "invalid socket address
/// syntax" alone, which did not say what would do; now the error says (session 47), as `send
/// --to`'s did.
#[test]
fn a_host_name_for_an_address_is_refused_saying_what_will_do() {
    let hint =
        "an address and port, as 127.0.0.1:5004 or [::1]:5004 (a host name is not looked up)";
    for flag in ["--listen", "--metrics"] {
        let run = run_briefly(&[flag, "localhost:5004"], Duration::from_secs(10));
        assert!(
            matches!(&run, Some((false, err)) if err.contains(hint) && err.contains(flag)),
            "{flag}: {run:?}"
        );
    }
    for key in ["listen", "metrics"] {
        let file = write(key, &format!("{key} = \"localhost:5004\"\n"));
        let run = run_briefly(
            &["--config", file.to_str().unwrap()],
            Duration::from_secs(10),
        );
        let _ = std::fs::remove_file(&file);
        assert!(
            matches!(&run, Some((false, err)) if err.contains(hint) && err.contains("line 1")),
            "{key}: {run:?}"
        );
    }
}
