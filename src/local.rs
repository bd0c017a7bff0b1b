//! The per-process key table: the tasks of one client that want the same key queue here in
//! FIFO order, so only the head of each queue talks to Redis.
//!
//! A task holds its key's turn from the moment it is at the head until its lock is released
//! in Redis, so a later task can never overtake a release. Entries exist only while some task
//! holds or awaits the key.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{Mutex as FifoMutex, OwnedMutexGuard};

type Entry = Arc<FifoMutex<()>>;

#[derive(Debug, Default)]
pub(crate) struct LocalTable {
    entries: Arc<Mutex<HashMap<String, Entry>>>,
}

/// The right to talk to Redis about one key, for this client. Dropping it lets the next
/// task in the queue go.
#[derive(Debug)]
pub(crate) struct LocalTurn {
    // Dropped before the ticket, so the ticket's clean-up sees the entry unused.
    _turn: OwnedMutexGuard<()>,
    _ticket: Ticket,
}

/// A place in a key's queue; removes the key's entry when the last place goes.
#[derive(Debug)]
struct Ticket {
    entries: Arc<Mutex<HashMap<String, Entry>>>,
    key: String,
    entry: Option<Entry>,
}

impl LocalTable {
    fn ticket(&self, key: &str) -> Ticket {
        let mut entries = self.entries.lock().expect("local table");
        let entry = entries.entry(key.to_owned()).or_default().clone();
        Ticket {
            entries: self.entries.clone(),
            key: key.to_owned(),
            entry: Some(entry),
        }
    }

    /// Waits for this key's turn (FIFO among this client's tasks). Cancel-safe: dropping the
    /// future leaves the queue.
    pub(crate) async fn turn(&self, key: &str) -> LocalTurn {
        let ticket = self.ticket(key);
        let entry = ticket.entry.clone().expect("fresh ticket");
        let turn = entry.lock_owned().await;
        LocalTurn {
            _turn: turn,
            _ticket: ticket,
        }
    }

    /// The key's turn if nobody in this client holds or awaits it.
    pub(crate) fn try_turn(&self, key: &str) -> Option<LocalTurn> {
        let ticket = self.ticket(key);
        let entry = ticket.entry.clone().expect("fresh ticket");
        let turn = entry.try_lock_owned().ok()?;
        Some(LocalTurn {
            _turn: turn,
            _ticket: ticket,
        })
    }

    /// How many keys this client holds or awaits.
    pub(crate) fn len(&self) -> usize {
        self.entries.lock().expect("local table").len()
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut entries = self.entries.lock().expect("local table");
        drop(self.entry.take());
        // Clones are only made under this mutex, so a count of one means only the table's.
        if entries
            .get(&self.key)
            .is_some_and(|entry| Arc::strong_count(entry) == 1)
        {
            entries.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn turns_are_fifo_and_entries_vanish_when_unused() {
        let table = LocalTable::default();
        let first = table.turn("k").await;
        assert!(table.try_turn("k").is_none());
        assert!(table.try_turn("other").is_some());

        let (order_tx, mut order_rx) = tokio::sync::mpsc::unbounded_channel();
        let table = Arc::new(table);
        let mut waiters = Vec::new();
        for i in 0..3 {
            let (queued, order_tx) = (table.clone(), order_tx.clone());
            waiters.push(tokio::spawn(async move {
                let _turn = queued.turn("k").await;
                order_tx.send(i).unwrap();
            }));
            // Let waiter i join the queue before waiter i + 1 is spawned: the table, the held
            // turn and its ticket count three, and each queued waiter adds its ticket and its
            // pending lock.
            while table_queue_len(&table, "k") < 3 + 2 * (i + 1) {
                tokio::task::yield_now().await;
            }
        }
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
    async fn a_cancelled_wait_leaves_no_entry() {
        let table = LocalTable::default();
        let held = table.turn("k").await;
        let waiting = tokio::time::timeout(std::time::Duration::from_millis(10), table.turn("k"));
        assert!(waiting.await.is_err());
        drop(held);
        assert_eq!(table.len(), 0);
    }

    fn table_queue_len(table: &LocalTable, key: &str) -> usize {
        table
            .entries
            .lock()
            .unwrap()
            .get(key)
            .map_or(0, Arc::strong_count)
    }
}
