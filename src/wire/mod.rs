//! Talking to Redis: the connections, the endpoint and its TLS, the scripts with their Lua,
//! SCAN and the operators' read of one lock, and how Redis's failures are classified. Knows
//! nothing of locks beyond their keys.

pub(crate) mod access;
pub(crate) mod cluster_node;
pub(crate) mod conn;
pub(crate) mod endpoint;
pub(crate) mod fsync;
mod function_library;
mod function_names;
mod lua;
mod redis_error;
pub(crate) mod replica_ack;
pub(crate) mod scan;
mod script;
#[cfg(test)]
mod script_check;
mod script_inputs;
mod script_library;
mod script_reply;
pub(crate) mod scripts;
pub(crate) mod sentinel;
pub(crate) mod setup;
pub(crate) mod snapshot;
pub(crate) mod tls;

/// The error redis-rs makes of a reply line such as `-MOVED ...`, for the tests that
/// classify Redis's failures.
#[cfg(test)]
pub(crate) fn error_reply(line: &str) -> redis::RedisError {
    match redis::parse_redis_value(format!("-{line}\r\n").as_bytes()) {
        Ok(redis::Value::ServerError(err)) => err.into(),
        other => panic!("not an error reply: {other:?}"),
    }
}
