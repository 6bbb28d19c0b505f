//! Review au (session 46): the command line, the configuration file and the operator's view.

mod common;

use std::time::Duration;

use common::gateway_proc::run_briefly;

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
