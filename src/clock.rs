//! The shell's clock: wall time at start plus monotonic time since, so `now` never steps back
//! when NTP adjusts the system clock, yet envelope timestamps are real UTC.

use std::time::{Instant, SystemTime};

use crate::time::Time;

#[derive(Debug, Clone, Copy)]
pub struct Clock {
    wall0: Time,
    mono0: Instant,
}

impl Default for Clock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock {
    pub fn new() -> Self {
        Clock {
            wall0: Time::from_system(SystemTime::now()),
            mono0: Instant::now(),
        }
    }

    pub fn now(&self) -> Time {
        self.wall0.saturating_add(self.mono0.elapsed())
    }

    /// The monotonic instant at which `t` falls due.
    pub fn instant_of(&self, t: Time) -> Instant {
        self.mono0 + t.saturating_sub(self.wall0)
    }
}

/// A random seed for message ULIDs, from the standard library's per-process hash keys.
pub fn random_seed() -> u128 {
    use std::hash::{BuildHasher, Hasher};
    let a = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(Time::from_system(SystemTime::now()).0.into());
    (u128::from(a) << 64) | u128::from(h.finish())
}
