//! Talking to Redis: the connections, the endpoint and its TLS, the scripts with their Lua,
//! SCAN and the operators' read of one lock, and how Redis's failures are classified. Knows
//! nothing of locks beyond their keys.

pub(crate) mod access;
pub(crate) mod cluster_node;
pub(crate) mod conn;
pub(crate) mod endpoint;
mod lua;
mod migration;
mod redis_error;
pub(crate) mod replica_ack;
pub(crate) mod scan;
mod script;
#[cfg(test)]
mod script_check;
pub(crate) mod scripts;
pub(crate) mod sentinel;
pub(crate) mod snapshot;
pub(crate) mod tls;
