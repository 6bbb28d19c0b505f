//! Time as a value. The core never reads a clock: the IO shell passes `now` in (wall clock for
//! live traffic, capture timestamps for pcap replay), which is what makes replay deterministic.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Microseconds since the Unix epoch, UTC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Time(pub u64);

impl Time {
    pub const fn from_micros(us: u64) -> Self {
        Time(us)
    }

    pub const fn from_millis(ms: u64) -> Self {
        Time(ms.saturating_mul(1000))
    }

    pub fn from_system(t: SystemTime) -> Self {
        Time(
            t.duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_micros() as u64),
        )
    }

    pub const fn as_millis(self) -> u64 {
        self.0 / 1000
    }

    pub fn to_system(self) -> SystemTime {
        UNIX_EPOCH + Duration::from_micros(self.0)
    }

    pub fn saturating_add(self, d: Duration) -> Time {
        Time(self.0.saturating_add(d.as_micros() as u64))
    }

    pub fn saturating_sub(self, other: Time) -> Duration {
        Duration::from_micros(self.0.saturating_sub(other.0))
    }

    /// ISO 8601 UTC with milliseconds (`2026-11-22T19:07:12.123Z`), as pvp-spec 4.2 asks.
    pub fn to_iso8601(self) -> String {
        humantime::format_rfc3339_millis(self.to_system()).to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_iso8601_utc_millis() {
        assert_eq!(
            Time::from_micros(1_700_000_000_123_456).to_iso8601(),
            "2023-11-14T22:13:20.123Z"
        );
        assert_eq!(Time(0).to_iso8601(), "1970-01-01T00:00:00.000Z");
    }
}
