//! The engine behind the public handles: how a lock is acquired, held, renewed, handed over
//! and released. It never names a public handle: the handles call it and wrap what it
//! returns.
//!
//! From the top: [`acquire`] (the acquire loop) and [`release`] (the release decision) work on
//! a [`hold::Holder`]; [`reenter`] adds holds to one. Beneath them the waiter, the give-back,
//! the lease state, the watchdog and pub/sub actors, the local key table and the epoch; at the
//! bottom [`shared::ClientState`], the state they all reach.

pub(crate) mod acquire;
pub(crate) mod budget;
pub(crate) mod call_queue;
pub(crate) mod config;
pub(crate) mod deadlines;
pub(crate) mod ending;
pub(crate) mod epoch;
pub(crate) mod gathered;
pub(crate) mod gathered_releases;
pub(crate) mod giveback;
pub(crate) mod giveback_tracker;
pub(crate) mod hold;
pub(crate) mod lease_state;
pub(crate) mod local;
pub(crate) mod plain_release;
pub(crate) mod promotion_witness;
pub(crate) mod pubsub;
pub(crate) mod reenter;
pub(crate) mod release;
pub(crate) mod replicas;
pub(crate) mod sharded;
pub(crate) mod shared;
pub(crate) mod wait_bound;
pub(crate) mod waiter;
pub(crate) mod wake;
pub(crate) mod watchdog;

use std::sync::Arc;

use crate::engine::hold::Baton;
use crate::engine::local::LocalTable;
use crate::engine::shared::ClientState;

/// What a client's handles hold: the shared state, and the local key table in which this
/// client's tasks take turns on each key (and leave each other the lock, or a place in the
/// Redis queue).
#[derive(Debug)]
pub(crate) struct Engine {
    pub(crate) shared: Arc<ClientState>,
    pub(crate) local: LocalTable<Baton>,
}

impl Engine {
    /// The engine of a client whose shared state is `shared`.
    pub(crate) fn new(shared: ClientState) -> Self {
        Self {
            shared: Arc::new(shared),
            local: LocalTable::default(),
        }
    }
}
