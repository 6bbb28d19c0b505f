//! Items that never went out, so that their corrections do not either. pvp-spec 9.3: a
//! `context.update` or `context.remove` acts on an existing item, and a `context.add` that a
//! full queue (the hand-off to the sink, a participant's connection) or a gate refused does
//! not exist for the server: a backspace the speaker typed afterwards must not correct it.
//! The core cannot know (it made the item and moved on), so each place that refuses an item
//! remembers its key here. Plain data: no IO.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;

use crate::pvp::{Envelope, Kind};

/// Keys of refused items, the `most` newest. A correction only ever names its speaker's last
/// item, so an old key is rarely wanted; forgetting the oldest bounds the memory whatever the
/// refusals.
#[derive(Debug)]
pub struct RefusedItems {
    keys: HashSet<Arc<str>>,
    order: VecDeque<Arc<str>>,
    most: usize,
}

impl RefusedItems {
    pub fn new(most: usize) -> Self {
        RefusedItems {
            keys: HashSet::new(),
            order: VecDeque::new(),
            most: most.max(1),
        }
    }

    /// `e` was refused: if it is an item, its corrections are to be refused too.
    pub fn refused(&mut self, e: &Envelope) {
        if e.kind() == Kind::ContextAdd
            && let Some(key) = key_of(e)
        {
            self.insert(key);
        }
    }

    /// The item `key` was refused.
    pub fn insert(&mut self, key: String) {
        let key: Arc<str> = key.into();
        if !self.keys.insert(key.clone()) {
            return;
        }
        self.order.push_back(key);
        if self.order.len() > self.most
            && let Some(old) = self.order.pop_front()
        {
            self.keys.remove(&old);
        }
    }

    /// Whether `e` corrects a refused item (and must go the same way). Costs nothing while no
    /// item was refused; parses `e` only for a correction.
    pub fn corrects(&self, e: &Envelope) -> bool {
        matches!(e.kind(), Kind::ContextUpdate | Kind::ContextRemove)
            && !self.keys.is_empty()
            && key_of(e).is_some_and(|k| self.keys.contains(k.as_str()))
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

fn key_of(e: &Envelope) -> Option<String> {
    match e.to_message().payload.get_mut("key")?.take() {
        serde_json::Value::String(k) => Some(k),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pvp::{Builder, SenderId};
    use crate::time::Time;
    use serde_json::json;

    fn env(b: &mut Builder, kind: Kind, key: &str) -> Envelope {
        b.envelope(Time(0), SenderId::from("p"), kind, &json!({ "key": key }))
    }

    #[test]
    fn corrections_of_refused_items_only_and_the_oldest_forgotten() {
        let mut b = Builder::new("s".into(), None, 1);
        let mut r = RefusedItems::new(2);
        assert!(!r.corrects(&env(&mut b, Kind::ContextUpdate, "k1")));
        r.refused(&env(&mut b, Kind::ContextAdd, "k1"));
        r.refused(&env(&mut b, Kind::ContextUpdate, "k9"));
        assert!(r.corrects(&env(&mut b, Kind::ContextUpdate, "k1")));
        assert!(r.corrects(&env(&mut b, Kind::ContextRemove, "k1")));
        assert!(!r.corrects(&env(&mut b, Kind::ContextAdd, "k1")));
        assert!(!r.corrects(&env(&mut b, Kind::ContextUpdate, "k9")));
        r.insert("k2".into());
        r.insert("k3".into());
        assert!(!r.corrects(&env(&mut b, Kind::ContextUpdate, "k1")));
        assert!(r.corrects(&env(&mut b, Kind::ContextUpdate, "k2")));
        assert!(r.corrects(&env(&mut b, Kind::ContextUpdate, "k3")));
    }
}
