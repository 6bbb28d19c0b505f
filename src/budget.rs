//! The stream limit (`--max-streams`) of the whole gateway. With `--workers N` each receive
//! worker has a core of its own, and a bound checked per core let the gateway take N times the
//! limit: N times the participants the open-file limit was raised for ([`crate::fdlimit`]),
//! where README's flag table promises that streams beyond the limit are refused. So the cores
//! share one count of live streams, an atomic claimed when a stream opens and given back when
//! it ends: no lock, and nothing on the packet path of a stream that exists. A core made by
//! [`crate::Gateway::new`] has a budget of its own, so the sans-IO core alone stays
//! deterministic.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Live streams against their bound, shared by the cores it is cloned to.
#[derive(Debug, Clone)]
pub struct StreamBudget {
    live: Arc<AtomicUsize>,
    max: usize,
}

impl StreamBudget {
    pub fn new(max: usize) -> Self {
        StreamBudget {
            live: Arc::default(),
            max,
        }
    }

    /// The bound.
    pub fn max(&self) -> usize {
        self.max
    }

    /// Streams live in every core sharing the budget.
    pub fn live(&self) -> usize {
        self.live.load(Ordering::Relaxed)
    }

    /// Room for one more stream, taken if there is. A count only (no data passes through it):
    /// relaxed ordering is enough for the bound to hold.
    fn try_claim(&self) -> bool {
        self.live
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < self.max).then_some(n + 1)
            })
            .is_ok()
    }

    fn release(&self, n: usize) {
        let before = self.live.fetch_sub(n, Ordering::Relaxed);
        debug_assert!(before >= n, "released {n} of {before} live streams");
    }
}

/// One core's share of a [`StreamBudget`]: the streams it claimed. What it still holds when
/// dropped goes back (a worker that failed or panicked must not keep its streams' room from
/// the others).
#[derive(Debug)]
pub struct Claims {
    budget: StreamBudget,
    held: usize,
}

impl Claims {
    pub fn new(budget: StreamBudget) -> Self {
        Claims { budget, held: 0 }
    }

    /// Streams this core claimed and has not given back.
    pub fn held(&self) -> usize {
        self.held
    }

    /// Claims room for a stream about to open; false at the bound.
    pub fn claim(&mut self) -> bool {
        let ok = self.budget.try_claim();
        self.held += usize::from(ok);
        ok
    }

    /// Gives back the room of a stream that ended.
    pub fn release(&mut self) {
        debug_assert!(self.held > 0, "a stream released twice");
        self.held -= 1;
        self.budget.release(1);
    }
}

impl Drop for Claims {
    fn drop(&mut self) {
        self.budget.release(self.held);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cores_sharing_a_budget_take_its_bound_between_them() {
        let budget = StreamBudget::new(3);
        let (mut a, mut b) = (Claims::new(budget.clone()), Claims::new(budget.clone()));
        assert!(a.claim() && b.claim() && a.claim());
        assert!(
            !b.claim() && !a.claim(),
            "the bound is the budget's, not each core's"
        );
        assert_eq!((a.held(), b.held(), budget.live()), (2, 1, 3));
        a.release();
        assert!(b.claim());
        assert!(!a.claim());
        // A core that goes away gives back what it held.
        drop(b);
        assert_eq!(budget.live(), 1);
        drop(a);
        assert_eq!(budget.live(), 0);
    }
}
