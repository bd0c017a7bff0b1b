//! The per-process key table: the tasks of one client that want the same key queue here in
//! FIFO order, so only the head of each queue talks to Redis.
//!
//! A task holds its key's turn from the moment it is at the head until its lock is released
//! in Redis or handed to the next task, so a later task can never overtake a release. The
//! turn carries a baton from each task to the next (a lock still held in Redis, or a place in
//! the Redis queue). Entries exist only while some task holds or awaits the key; a baton left
//! in an entry nobody wants any more is dropped with it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{Mutex as FifoMutex, OwnedMutexGuard};

struct Entry<B> {
    queue: Arc<FifoMutex<B>>,
    /// Tasks holding or awaiting this key's turn.
    tickets: usize,
}

// Keyed by the lock's shared hash name: taking a turn copies no key.
type Entries<B> = Arc<Mutex<HashMap<Arc<str>, Entry<B>>>>;

pub(crate) struct LocalTable<B> {
    entries: Entries<B>,
}

impl<B> Default for LocalTable<B> {
    fn default() -> Self {
        Self {
            entries: Arc::default(),
        }
    }
}

impl<B> std::fmt::Debug for LocalTable<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalTable")
            .field("keys", &self.len())
            .finish()
    }
}

/// The right to talk to Redis about one key, for this client, and the baton the previous
/// task left. Dropping it lets the next task in the queue go.
pub(crate) struct LocalTurn<B> {
    // Dropped before the ticket, so the ticket's clean-up sees the entry unused.
    turn: OwnedMutexGuard<B>,
    ticket: Ticket<B>,
}

impl<B> std::fmt::Debug for LocalTurn<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalTurn")
            .field("key", &self.ticket.key)
            .finish_non_exhaustive()
    }
}

/// A place in a key's queue; removes the key's entry when the last place goes.
struct Ticket<B> {
    entries: Entries<B>,
    key: Arc<str>,
}

impl<B: Default> LocalTable<B> {
    fn ticket(&self, key: &Arc<str>) -> (Ticket<B>, Arc<FifoMutex<B>>) {
        let mut entries = self.entries.lock().expect("local table");
        let entry = entries.entry(key.clone()).or_insert_with(|| Entry {
            queue: Arc::default(),
            tickets: 0,
        });
        entry.tickets += 1;
        let queue = entry.queue.clone();
        let ticket = Ticket {
            entries: self.entries.clone(),
            key: key.clone(),
        };
        (ticket, queue)
    }

    /// Waits for this key's turn (FIFO among this client's tasks). Cancel-safe: dropping the
    /// future leaves the queue.
    pub(crate) async fn turn(&self, key: &Arc<str>) -> LocalTurn<B> {
        let (ticket, queue) = self.ticket(key);
        LocalTurn {
            turn: queue.lock_owned().await,
            ticket,
        }
    }

    /// The key's turn if nobody in this client holds it or is ahead in its queue.
    pub(crate) fn try_turn(&self, key: &Arc<str>) -> Option<LocalTurn<B>> {
        let (ticket, queue) = self.ticket(key);
        Some(LocalTurn {
            turn: queue.try_lock_owned().ok()?,
            ticket,
        })
    }
}

impl<B> LocalTable<B> {
    /// How many keys this client holds or awaits.
    pub(crate) fn len(&self) -> usize {
        self.entries.lock().expect("local table").len()
    }
}

impl<B> LocalTurn<B> {
    /// The baton: what the previous task left for the next.
    pub(crate) fn baton(&mut self) -> &mut B {
        &mut self.turn
    }

    /// Whether other tasks of this client wait for this key.
    pub(crate) fn others_waiting(&self) -> bool {
        let entries = self.ticket.entries.lock().expect("local table");
        entries
            .get(&*self.ticket.key)
            .is_some_and(|entry| entry.tickets > 1)
    }
}

impl<B> Drop for Ticket<B> {
    fn drop(&mut self) {
        let unused = {
            let mut entries = self.entries.lock().expect("local table");
            let last = entries.get_mut(&*self.key).is_some_and(|entry| {
                entry.tickets -= 1;
                entry.tickets == 0
            });
            if last {
                entries.remove(&*self.key)
            } else {
                None
            }
        };
        // A baton left behind is dropped here, outside the table's mutex.
        drop(unused);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn turns_are_fifo_and_entries_vanish_when_unused() {
        let table = Arc::new(LocalTable::<()>::default());
        let k = key("k");
        let first = table.turn(&k).await;
        assert!(!first.others_waiting());
        assert!(table.try_turn(&k).is_none());
        assert!(table.try_turn(&key("other")).is_some());

        let (order_tx, mut order_rx) = tokio::sync::mpsc::unbounded_channel();
        let mut waiters = Vec::new();
        for i in 0..3 {
            let (queued, order_tx, k) = (table.clone(), order_tx.clone(), k.clone());
            waiters.push(tokio::spawn(async move {
                let _turn = queued.turn(&k).await;
                order_tx.send(i).unwrap();
            }));
            // Let waiter i join the queue before waiter i + 1 is spawned.
            while tickets(&table, "k") < 2 + i {
                tokio::task::yield_now().await;
            }
        }
        assert!(first.others_waiting());
        drop(first);
        for waiter in waiters {
            waiter.await.unwrap();
        }
        drop(order_tx);
        let mut order = Vec::new();
        while let Some(i) = order_rx.recv().await {
            order.push(i);
        }
        assert_eq!(order, vec![0, 1, 2]);
        assert_eq!(table.len(), 0);
    }

    #[tokio::test]
    async fn the_baton_passes_to_the_next_task_and_is_dropped_when_nobody_is_left() {
        let table = Arc::new(LocalTable::<Option<Arc<()>>>::default());
        let k = key("k");
        let baton = Arc::new(());
        let mut first = table.turn(&k).await;
        let (queued, next_key) = (table.clone(), k.clone());
        let next = tokio::spawn(async move { queued.turn(&next_key).await.baton().take() });
        while tickets(&table, "k") < 2 {
            tokio::task::yield_now().await;
        }
        *first.baton() = Some(baton.clone());
        drop(first);
        let received = next
            .await
            .unwrap()
            .expect("the baton reached the next task");
        assert!(Arc::ptr_eq(&received, &baton));

        // Left in an entry that nobody awaits: dropped with the entry.
        let mut last = table.turn(&k).await;
        *last.baton() = Some(received);
        drop(last);
        assert_eq!(Arc::strong_count(&baton), 1);
        assert_eq!(table.len(), 0);
    }

    #[tokio::test]
    async fn a_cancelled_wait_leaves_no_entry() {
        let table = LocalTable::<()>::default();
        let k = key("k");
        let held = table.turn(&k).await;
        let waiting = tokio::time::timeout(std::time::Duration::from_millis(10), table.turn(&k));
        assert!(waiting.await.is_err());
        assert!(!held.others_waiting());
        drop(held);
        assert_eq!(table.len(), 0);
    }

    fn key(name: &str) -> Arc<str> {
        name.into()
    }

    fn tickets<B>(table: &LocalTable<B>, key: &str) -> usize {
        table
            .entries
            .lock()
            .unwrap()
            .get(key)
            .map_or(0, |entry| entry.tickets)
    }
}
