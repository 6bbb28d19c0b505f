//! The `--spool DIR` journal, through the public `Spool::open` and the real binary with real
//! files in a directory of its own: the journal readable by its owner only, an empty spool
//! path refused, the lines a start skips counted (and a few logged), and a start that cannot
//! write its new journal leaving none of it behind.
//!
//! Found by review bb (session 47).

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use common::talk::Talk;
use prometheus_client::metrics::counter::Counter;
use pvp_t140::sink::spool::Spool;

/// A spool directory of its own, removed afterwards.
struct Dir(PathBuf);

impl Dir {
    fn new(name: &str) -> Self {
        let d =
            std::env::temp_dir().join(format!("pvp-t140-review-bb-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Dir(d)
    }
    fn journal(&self) -> PathBuf {
        self.0.join("journal.ndjson")
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn mode(path: &std::path::Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

/// Found by review bb (session 47). The journal holds the text of every transcript not yet
/// delivered, and was made with the umask's defaults (0644: readable by every user of the
/// host); each start replaced it with such a file, so even a journal its operator had made
/// private (`chmod 600`) was readable by all again after the next start. It is made readable
/// and writable by its owner only.
#[test]
fn the_journal_is_made_readable_by_its_owner_only() {
    let d = Dir::new("mode");
    let mut t = Talk::new();
    let (spool, _) = Spool::open(&d.0, Counter::default()).unwrap();
    spool.added(&t.join("a"));
    spool.added(&t.add("a", "Private words."));
    drop(spool);
    assert_eq!(mode(&d.journal()), 0o600, "a new journal");
    // Made private by hand, then a restart (which rewrites it with what is undelivered).
    std::fs::set_permissions(d.journal(), std::fs::Permissions::from_mode(0o600)).unwrap();
    let (spool, resend) = Spool::open(&d.0, Counter::default()).unwrap();
    assert_eq!(resend.len(), 3, "join, text, leave");
    drop(spool);
    assert_eq!(mode(&d.journal()), 0o600, "the journal a restart wrote");
    // A staging file a kill left behind, made by an older gateway with the defaults, is not
    // what the next journal inherits its mode from.
    let staging = d.0.join("journal.ndjson.new");
    std::fs::write(&staging, "").unwrap();
    std::fs::set_permissions(&staging, std::fs::Permissions::from_mode(0o644)).unwrap();
    drop(Spool::open(&d.0, Counter::default()).unwrap());
    assert_eq!(mode(&d.journal()), 0o600, "over a staging file left behind");
}

/// Found by review bb (session 47). A config file's `spool = ""` (a template whose variable
/// was unset) journaled into the working directory (a service's is often `/`), named nowhere
/// but in the start's log line: an empty path named no directory, and the gateway took it for
/// the one it ran in. It is an error at start naming the file's key, as `--spool ""` is
/// refused on the command line.
#[test]
fn an_empty_spool_path_in_the_config_file_is_an_error_not_the_working_directory() {
    let d = Dir::new("empty");
    let cwd = d.0.join("cwd");
    std::fs::create_dir(&cwd).unwrap();
    let config = d.0.join("gw.toml");
    std::fs::write(
        &config,
        "listen = \"127.0.0.1:0\"\nserver = \"ws://127.0.0.1:9\"\nspool = \"\"\n",
    )
    .unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_pvp-t140"))
        .arg("--config")
        .arg(&config)
        .current_dir(&cwd)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // It stops at start; one still running after this took the empty path for a directory.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            child.wait().unwrap();
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    let journaled: Vec<_> = std::fs::read_dir(&cwd)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(
        journaled.is_empty(),
        "files in the working directory: {journaled:?}"
    );
    assert!(status.is_some_and(|s| !s.success()), "it ran: {stderr}");
    assert!(stderr.contains("gw.toml:3: spool"), "{stderr}");
}

/// Found by review bb (session 47). Journal lines a start skips were logged but counted
/// nowhere: a record cut short by a kill or a full disk, and a line that is JSON but no
/// record (silently: not even logged), text among them lost. Each is counted in
/// `pvp_t140_spool_records_skipped_total`, and the whole records are still resent.
#[test]
fn journal_lines_a_start_skips_are_counted() {
    use common::gateway_proc::{Gateway, http_get, sample};
    let d = Dir::new("skipped");
    let mut t = Talk::new();
    let (j, x, cut) = (t.join("a"), t.add("a", "Whole."), t.add("a", "Cut short."));
    let cut = format!("{{\"add\":{},\"n\":2}}", cut.json());
    let journal = [
        format!("{{\"add\":{},\"n\":0}}\n", j.json()),
        format!("{{\"done\":\"{}\"}}\n", j.id()),
        format!("{{\"add\":{},\"n\":1}}\n", x.json()),
        "{\"add\":{\"not\":\"an envelope\"},\"n\":3}\n".to_owned(),
        cut[..cut.len() / 2].to_owned(),
    ]
    .concat();
    std::fs::write(d.journal(), journal).unwrap();
    let spool = d.0.to_str().unwrap();
    let mut gw = Gateway::start_for_server(
        "ws://127.0.0.1:9",
        &["--spool", spool, "--metrics", "127.0.0.1:0"],
    );
    let metrics = gw.metrics_addr();
    let body = http_get(metrics, "/metrics").1;
    assert!(gw.terminate(std::time::Duration::from_secs(20)).success());
    assert_eq!(
        sample(&body, "pvp_t140_spool_records_skipped_total"),
        Some(2.0),
        "{body}"
    );
    // The whole record is still undelivered (the server was unreachable): journaled again.
    let (spool, resend) = Spool::open(&d.0, Counter::default()).unwrap();
    assert_eq!(spool.skipped(), 0, "the journal was rewritten whole");
    let said: Vec<_> = resend
        .iter()
        .filter_map(|e| e.to_message().payload.get("content").cloned())
        .collect();
    assert_eq!(said, [serde_json::json!("Whole.")]);
}

/// Found by review bb (session 47). A start that could not write its new journal (a full
/// disk; here a file-size limit, `ulimit -f`, systemd `LimitFSIZE=`) stopped with a clear
/// error, but left the part it had written behind (`journal.ndjson.new`), holding a full
/// disk's last free pages until a later start. A compaction that fails removes what it
/// wrote; so does the start now. The old journal is left whole for the next start.
#[test]
fn a_start_that_cannot_write_its_new_journal_leaves_no_part_of_it_behind() {
    let d = Dir::new("fsize");
    let mut t = Talk::new();
    let (spool, _) = Spool::open(&d.0, Counter::default()).unwrap();
    spool.added(&t.join("a"));
    for i in 0..40 {
        spool.added(&t.add("a", &format!("Undelivered sentence number {i}.")));
    }
    drop(spool);
    let journal = std::fs::read(d.journal()).unwrap();
    assert!(journal.len() > 8 << 10);
    // 8 blocks of 512 bytes (dash's `ulimit -f`; bash's are 1 KiB): less than the journal.
    let out = std::process::Command::new("sh")
        .args(["-c", "ulimit -f 8 && exec \"$0\" \"$@\""])
        .arg(env!("CARGO_BIN_EXE_pvp-t140"))
        .args(["--listen", "127.0.0.1:0", "--server", "ws://127.0.0.1:9"])
        .arg("--spool")
        .arg(&d.0)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("--spool") && stderr.contains("journal.ndjson.new"),
        "{stderr}"
    );
    assert!(
        !d.0.join("journal.ndjson.new").exists(),
        "a part of the new journal was left behind"
    );
    assert_eq!(
        std::fs::read(d.journal()).unwrap(),
        journal,
        "the old journal is whole"
    );
}

/// Found by review bb (session 47). A start logged a warning for every journal line it
/// skipped: a journal damaged throughout, or another tool's NDJSON file where the journal
/// should be, made as many log lines as it has lines (here 5,000). The first few are logged
/// with their line numbers, then how many in all; each is still counted.
#[test]
fn a_journal_of_many_bad_lines_logs_a_few_and_counts_them_all() {
    use common::gateway_proc::{Gateway, http_get, sample};
    let d = Dir::new("flood");
    let foreign: String = (0..5000)
        .map(|i| {
            if i % 2 == 0 {
                format!("{{\"event\":\"other tool\",\"i\":{i}}}\n")
            } else {
                format!("not json {i}\n")
            }
        })
        .collect();
    std::fs::write(d.journal(), foreign).unwrap();
    let spool = d.0.to_str().unwrap();
    let mut gw = Gateway::start_for_server(
        "ws://127.0.0.1:9",
        &["--spool", spool, "--metrics", "127.0.0.1:0"],
    );
    let metrics = gw.metrics_addr();
    let body = http_get(metrics, "/metrics").1;
    assert!(gw.terminate(std::time::Duration::from_secs(20)).success());
    assert_eq!(
        sample(&body, "pvp_t140_spool_records_skipped_total"),
        Some(5000.0),
        "{body}"
    );
    let skipping = gw
        .stderr_lines()
        .into_iter()
        .filter(|l| l.contains("skipping") || l.contains("skipped"))
        .count();
    assert!(
        skipping <= 20,
        "{skipping} log lines about skipped journal lines"
    );
    assert!(
        gw.stderr_lines().iter().any(|l| l.contains("5000")),
        "how many were skipped is said"
    );
}
