//! Review bb (session 47): the `--spool DIR` journal, through the public `Spool::open` with
//! real files in a directory of its own.

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
