//! Time as a value. The core never reads a clock: the IO shell passes `now` in (wall clock for
//! live traffic, capture timestamps for pcap replay), which is what makes replay deterministic.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Microseconds since the Unix epoch, UTC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Time(pub u64);

impl Time {
    /// Later than any time a clock gives: "no deadline", in a field that would otherwise need
    /// an `Option` (twice the size).
    pub const NEVER: Time = Time(u64::MAX);

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
        // Without the u128 of `Duration::as_micros`: deadlines are computed for every packet.
        let us = d
            .as_secs()
            .saturating_mul(1_000_000)
            .saturating_add(u64::from(d.subsec_micros()));
        Time(self.0.saturating_add(us))
    }

    /// [`Time::saturating_add`] for a delay already in microseconds.
    pub fn plus_us(self, us: u64) -> Time {
        Time(self.0.saturating_add(us))
    }

    pub fn saturating_sub(self, other: Time) -> Duration {
        Duration::from_micros(self.0.saturating_sub(other.0))
    }

    /// ISO 8601 UTC with milliseconds (`2026-11-22T19:07:12.123Z`), as pvp-spec 4.2 asks.
    pub fn to_iso8601(self) -> String {
        let mut s = String::with_capacity(24);
        self.write_iso8601(&mut s);
        s
    }

    /// Appends [`Time::to_iso8601`]'s text: every envelope carries one, so no formatter and no
    /// allocation (civil date from days: H. Hinnant's `civil_from_days`).
    pub fn write_iso8601(self, out: &mut String) {
        out.push_str(std::str::from_utf8(&self.iso8601_bytes()).unwrap_or_default());
    }

    fn iso8601_bytes(self) -> [u8; 24] {
        let ms = (self.0 / 1000).min(LAST_WRITABLE_MS);
        let (days, ms_of_day) = (ms / 86_400_000, ms % 86_400_000);
        let z = days as i64 + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z.rem_euclid(146_097);
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = doy - (153 * mp + 2) / 5 + 1;
        let month = if mp < 10 { mp + 3 } else { mp - 9 };
        let year = yoe + era * 400 + i64::from(month <= 2);
        let mut b = *b"0000-00-00T00:00:00.000Z";
        put_digits(&mut b, 0, 4, year.clamp(0, 9999) as u64);
        put_digits(&mut b, 5, 2, month as u64);
        put_digits(&mut b, 8, 2, day as u64);
        put_digits(&mut b, 11, 2, ms_of_day / 3_600_000);
        put_digits(&mut b, 14, 2, ms_of_day / 60_000 % 60);
        put_seconds(&mut b, ms_of_day % 60_000);
        b
    }
}

/// 9999-12-31T23:59:59.999Z in milliseconds, the last instant RFC 3339's four-digit year can
/// write: a later time (a capture with a wrong timestamp resolution) is written as it, never as
/// an earlier instant (clamping the year alone wrote 10000-06-15 as 9999-06-15).
const LAST_WRITABLE_MS: u64 = 253_402_300_799_999;

/// Writes `v` as `width` decimal digits ending at `at + width`.
#[inline]
fn put_digits(b: &mut [u8; 24], at: usize, width: usize, mut v: u64) {
    for i in (at..at + width).rev() {
        b[i] = b'0' + (v % 10) as u8;
        v /= 10;
    }
}

/// Writes the seconds and milliseconds (`SS.mmm`) of `ms_of_minute`.
#[inline]
fn put_seconds(b: &mut [u8; 24], ms_of_minute: u64) {
    put_digits(b, 17, 2, ms_of_minute / 1000);
    put_digits(b, 20, 3, ms_of_minute % 1000);
}

/// [`Time::write_iso8601`] remembering the last minute it wrote: within it only the seconds
/// and milliseconds differ, five digits instead of a calendar computation. Envelopes come in
/// bursts, and one speaker's chunks a few seconds apart (a sentence a chunk).
#[derive(Debug, Clone)]
pub struct Iso8601Cache {
    minute: u64,
    text: [u8; 24],
}

impl Default for Iso8601Cache {
    fn default() -> Self {
        Iso8601Cache {
            minute: 0,
            text: Time(0).iso8601_bytes(),
        }
    }
}

impl Iso8601Cache {
    /// The timestamp's 24 ASCII bytes, for a caller that assembles them with others
    /// (`pvp::Stamp`).
    #[inline]
    pub fn bytes(&mut self, t: Time) -> &[u8; 24] {
        let ms = (t.0 / 1000).min(LAST_WRITABLE_MS);
        if ms / 60_000 != self.minute {
            self.minute = ms / 60_000;
            self.text = Time(ms * 1000).iso8601_bytes();
        } else {
            put_seconds(&mut self.text, ms % 60_000);
        }
        &self.text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_writes_what_write_iso8601_writes() {
        let mut cache = Iso8601Cache::default();
        // Within a second, across seconds, minutes and days, backwards, and at the epoch.
        let times = [
            1_700_000_000_123_456u64,
            1_700_000_000_999_999,
            1_700_000_000_000_001,
            1_700_000_001_000_000,
            1_700_000_019_876_000,
            1_700_000_039_000_999,
            1_700_000_040_000_000,
            1_700_000_099_999_000,
            1_700_000_100_000_000,
            1_700_000_059_000_000,
            1_700_086_400_500_000,
            1_700_000_000_042_000,
            0,
            999,
        ];
        for t in times {
            let ours = cache.bytes(Time(t));
            assert_eq!(ours, Time(t).to_iso8601().as_bytes(), "at {t} us");
        }
    }

    #[test]
    fn formats_iso8601_utc_millis() {
        assert_eq!(
            Time::from_micros(1_700_000_000_123_456).to_iso8601(),
            "2023-11-14T22:13:20.123Z"
        );
        assert_eq!(Time(0).to_iso8601(), "1970-01-01T00:00:00.000Z");
    }

    #[test]
    fn iso8601_matches_humantime_across_centuries_and_leap_days() {
        let mut t = 0u64;
        // Steps that are not a divisor of a day, so every time of day and date is visited.
        while t < 253_402_300_799_000_000 {
            let ours = Time(t).to_iso8601();
            let theirs = humantime::format_rfc3339_millis(Time(t).to_system()).to_string();
            assert_eq!(ours, theirs, "at {t} us");
            t += 86_399_999_937 * 7;
        }
        for leap in ["2000-02-29T23:59:59.999Z", "2024-02-29T00:00:00.000Z"] {
            let st = humantime::parse_rfc3339(leap).unwrap();
            assert_eq!(Time::from_system(st).to_iso8601(), leap);
        }
    }
}
