//! Locks of other kinds than the plain exclusive one, built on the same engine.

mod rw;

pub use rw::ReadWriteLock;
