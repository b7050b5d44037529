//! The slots of host connections in their handshake ([`crate::host_gate`]). A flood of
//! connections that never prove the key must neither hold more of the agent than its slots
//! nor keep the shim out: when every slot is taken, a new connection takes the oldest one's,
//! whose handshake ends at once. The shim proves its key one round trip after its connection
//! is accepted, so a flood would have to open [`SLOTS`] connections within that round trip
//! to push it out; a connection that waits for its proof is soon the oldest, and goes first.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

/// Connections in their handshake at once, for each class ([`crate::host_gate`]: reserved
/// source ports, the rest). Each costs the agent a task and a few hundred bytes.
pub const SLOTS: usize = 256;

/// One class's slots.
pub struct Slots {
    capacity: usize,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    next: u64,
    /// The handshakes in their slots, oldest first, each with what ends it.
    taken: VecDeque<(u64, oneshot::Sender<()>)>,
}

/// A connection's slot: given back when dropped.
pub struct Slot {
    id: u64,
    slots: Arc<Slots>,
    ended: oneshot::Receiver<()>,
}

impl Slots {
    pub fn new(capacity: usize) -> Arc<Self> {
        Arc::new(Slots {
            capacity: capacity.max(1),
            inner: Mutex::new(Inner::default()),
        })
    }

    /// A slot for a new connection, and whether the oldest handshake was ended for it
    /// (every slot was taken).
    pub fn take(self: &Arc<Self>) -> (Slot, bool) {
        let (end, ended) = oneshot::channel();
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        // Dropping its sender ends the oldest handshake ([`Slot::taken_over`]).
        let evicted = inner.taken.len() >= self.capacity && inner.taken.pop_front().is_some();
        let id = inner.next;
        inner.next += 1;
        inner.taken.push_back((id, end));
        let slot = Slot {
            id,
            slots: self.clone(),
            ended,
        };
        (slot, evicted)
    }

    /// How many slots are taken.
    #[cfg(test)]
    pub fn taken(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .taken
            .len()
    }
}

impl Slot {
    /// Resolves when a newer connection has taken this slot.
    pub async fn taken_over(&mut self) {
        let _ = (&mut self.ended).await;
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut inner = self.slots.inner.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(at) = inner.taken.iter().position(|(id, _)| *id == self.id) {
            inner.taken.remove(at);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    async fn is_taken_over(slot: &mut Slot) -> bool {
        tokio::time::timeout(Duration::from_millis(10), slot.taken_over())
            .await
            .is_ok()
    }

    #[tokio::test]
    async fn a_new_connection_takes_the_oldest_slot_when_all_are_taken() {
        let slots = Slots::new(2);
        let (mut first, evicted) = slots.take();
        assert!(!evicted);
        let (mut second, evicted) = slots.take();
        assert!(!evicted);
        let (mut third, evicted) = slots.take();
        assert!(evicted);
        assert!(is_taken_over(&mut first).await);
        assert!(!is_taken_over(&mut second).await);
        assert!(!is_taken_over(&mut third).await);
        assert_eq!(slots.taken(), 2);
        // The one taken over gives back nothing more when it goes.
        drop(first);
        assert_eq!(slots.taken(), 2);
    }

    #[tokio::test]
    async fn a_slot_given_back_is_free_for_the_next() {
        let slots = Slots::new(2);
        let (mut first, _) = slots.take();
        let (second, _) = slots.take();
        drop(second);
        assert_eq!(slots.taken(), 1);
        let (_third, evicted) = slots.take();
        assert!(!evicted);
        assert!(!is_taken_over(&mut first).await);
    }

    #[tokio::test]
    async fn a_flood_pushes_out_only_what_is_older_than_its_last_slots() {
        let slots = Slots::new(SLOTS);
        let (mut shims, _) = slots.take();
        let flood: Vec<_> = (0..SLOTS - 1).map(|_| slots.take().0).collect();
        assert!(!is_taken_over(&mut shims).await);
        let (_one_more, evicted) = slots.take();
        assert!(evicted);
        assert!(is_taken_over(&mut shims).await);
        assert_eq!(slots.taken(), SLOTS);
        drop(flood);
        assert_eq!(slots.taken(), 1);
    }
}
