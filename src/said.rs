//! A repeated failure logged at its first and then at most once every [`SAID_EVERY`], with how
//! many since. A failure that comes as often as traffic (a participant's full queue through an
//! outage, journal writes on a full disk, a worker kept behind its RTCP feed by a flood of the
//! port) would flood a log that people read; each is counted in a metric as it happens.
//! Sans-IO: told the time as a value, the core's [`Time`](crate::Time) or the shell's
//! `Instant`.

use std::time::Duration;

/// How often a repeated failure is logged at most ([`Said`]).
pub const SAID_EVERY: Duration = Duration::from_secs(10);

/// A moment a [`Said`] is told of: the core's [`Time`](crate::Time) or an `Instant`.
pub trait Moment: Copy + PartialOrd {
    /// `d` later (saturating).
    fn after(self, d: Duration) -> Self;
}

impl Moment for crate::Time {
    fn after(self, d: Duration) -> Self {
        self.saturating_add(d)
    }
}

impl Moment for std::time::Instant {
    fn after(self, d: Duration) -> Self {
        self.checked_add(d).unwrap_or(self)
    }
}

/// When a repeated failure was last logged, and how many came since not yet said.
#[derive(Debug)]
pub struct Said<T> {
    at: Option<T>,
    unsaid: u64,
}

impl<T> Default for Said<T> {
    fn default() -> Self {
        Said {
            at: None,
            unsaid: 0,
        }
    }
}

impl<T: Moment> Said<T> {
    /// `n` more failures at `now`: `Some(count)` if a line is due, `count` the failures it
    /// stands for (these and those not logged since the last line).
    pub fn tell(&mut self, now: T, n: u64) -> Option<u64> {
        self.unsaid += n;
        if self.at.is_some_and(|t| now < t.after(SAID_EVERY)) {
            return None;
        }
        self.at = Some(now);
        Some(std::mem::take(&mut self.unsaid))
    }
}

/// A log captured in memory, for the tests that check a failure is said once, not a line each.
#[cfg(test)]
#[derive(Clone, Default)]
pub(crate) struct Logged(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

#[cfg(test)]
impl Logged {
    /// A subscriber writing here what is logged at `level` and above.
    pub(crate) fn subscriber(&self, level: tracing::Level) -> impl tracing::Subscriber + use<> {
        let l = self.clone();
        tracing_subscriber::fmt()
            .with_writer(move || l.clone())
            .with_ansi(false)
            .with_max_level(level)
            .finish()
    }

    /// All that was logged.
    pub(crate) fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }
}

#[cfg(test)]
impl std::io::Write for Logged {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::Said;

    /// The first failure is said, then one line every 10 s at most, each with the failures
    /// since the line before.
    #[test]
    fn a_repeated_failure_is_said_at_its_first_and_then_every_ten_seconds() {
        let t0 = std::time::Instant::now();
        let ms = std::time::Duration::from_millis;
        let mut said = Said::default();
        assert_eq!(said.tell(t0, 1), Some(1));
        for i in 1..1000 {
            assert_eq!(said.tell(t0 + ms(i), 1), None);
        }
        assert_eq!(said.tell(t0 + ms(9_999), 1), None);
        assert_eq!(said.tell(t0 + ms(10_000), 1), Some(1001));
        assert_eq!(said.tell(t0 + ms(10_001), 1), None);
        assert_eq!(said.tell(t0 + ms(60_000), 1), Some(2));
    }
}
