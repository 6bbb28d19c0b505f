//! Where streams live: a slab of fixed-size pages. Growing adds a page and never moves a live
//! stream (a `Vec` doubling would copy every stream, tens of megabytes at 100,000 streams, in
//! the middle of the receive loop), and what is allocated but unused is at most one page.
//! Slots of removed entries are reused, so ids stay small and dense.

/// Entries per page.
const PAGE: usize = 256;

#[derive(Debug)]
pub struct Slab<T> {
    pages: Vec<Box<[Option<T>]>>,
    /// Slots ever handed out (the high-water mark).
    used: usize,
    free: Vec<u32>,
}

impl<T> Default for Slab<T> {
    fn default() -> Self {
        Slab {
            pages: Vec::new(),
            used: 0,
            free: Vec::new(),
        }
    }
}

impl<T> Slab<T> {
    /// Stores `value` and returns its slot.
    pub fn insert(&mut self, value: T) -> u32 {
        let slot = match self.free.pop() {
            Some(s) => s as usize,
            None => {
                if self.used == self.pages.len() * PAGE {
                    self.pages.push((0..PAGE).map(|_| None).collect());
                }
                self.used += 1;
                self.used - 1
            }
        };
        self.pages[slot / PAGE][slot % PAGE] = Some(value);
        slot as u32
    }

    pub fn get(&self, slot: u32) -> Option<&T> {
        let s = slot as usize;
        self.pages.get(s / PAGE)?[s % PAGE].as_ref()
    }

    pub fn get_mut(&mut self, slot: u32) -> Option<&mut T> {
        let s = slot as usize;
        self.pages.get_mut(s / PAGE)?[s % PAGE].as_mut()
    }

    /// Takes the entry out; its slot is reused by a later insert.
    pub fn remove(&mut self, slot: u32) -> Option<T> {
        let s = slot as usize;
        let taken = self.pages.get_mut(s / PAGE)?[s % PAGE].take();
        if taken.is_some() {
            self.free.push(slot);
        }
        taken
    }

    /// Live entries in slot order.
    pub fn iter(&self) -> impl Iterator<Item = (u32, &T)> {
        self.pages
            .iter()
            .flat_map(|p| p.iter())
            .enumerate()
            .filter_map(|(i, e)| e.as_ref().map(|e| (i as u32, e)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_reused_and_entries_never_move() {
        let mut s = Slab::default();
        let ids: Vec<u32> = (0..PAGE as u32 * 2 + 3).map(|i| s.insert(i)).collect();
        assert_eq!(ids, (0..PAGE as u32 * 2 + 3).collect::<Vec<_>>());
        let first = s.get(0).unwrap() as *const u32;
        assert_eq!(s.remove(5), Some(5));
        assert_eq!(s.remove(5), None);
        assert_eq!(s.get(5), None);
        assert_eq!(s.insert(99), 5);
        for i in 0..PAGE as u32 * 3 {
            s.insert(i);
        }
        // Growth added pages; the first entry is where it was.
        assert_eq!(first, s.get(0).unwrap() as *const u32);
        *s.get_mut(1).unwrap() = 7;
        assert_eq!(
            s.iter().take(3).collect::<Vec<_>>(),
            [(0, &0), (1, &7), (2, &2)]
        );
        assert_eq!(s.get(u32::MAX), None);
        assert_eq!(s.remove(u32::MAX), None);
    }
}
