//! The guarded write: a holder's writes, run in one script only while it holds the lock.

use crate::keys::LockKeys;
use crate::wire::conn::Conn;
use crate::wire::script::ScriptSpec;
use crate::wire::script_inputs::{Arg, script_inputs};
use crate::wire::script_reply::reply_statuses;

reply_statuses! {
    /// What a guarded write answers.
    guarded {
        /// Every write ran.
        APPLIED = 1,
        /// The owner does not hold the lock (or holds it only to read): nothing was written.
        REFUSED = 0,
    }
}

script_inputs! {
    /// What a guarded write takes once: the lock, and the trace it leaves (`written`,
    /// kept `written_ms`).
    struct GuardedWriteInputs<'a> {
        keys {
            lock: &'a str,
            written: &'a str,
        }
        args {
            owner: &'a str,
            written_ms: u64,
        }
    }
}

script_inputs! {
    /// What a guarded write takes per command: its key, its name and how many of the
    /// arguments after the items' ones are its own.
    struct WriteItem<'a> {
        keys { key: &'a str }
        args {
            command: &'a str,
            arg_count: u64,
        }
    }
}

static GUARDED_WRITE: ScriptSpec<GuardedWriteInputs<'static>, WriteItem<'static>> =
    ScriptSpec::new(
        "guarded_write.lua",
        include_str!("../lua/guarded_write.lua"),
        &[guarded::ALL],
    )
    .with_rest();

#[cfg(test)]
pub(super) fn all() -> Vec<&'static dyn crate::wire::script::Described> {
    vec![&GUARDED_WRITE]
}

/// One write command whose first argument is its key: `name key args…`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WriteCommand {
    pub(crate) name: String,
    pub(crate) key: String,
    pub(crate) args: Vec<Vec<u8>>,
}

/// The trace a guarded write leaves where it may run twice: its key, and how long it is
/// kept (0: no trace, on one server).
#[derive(Debug, Clone, Copy)]
pub(crate) struct WriteTrace<'a> {
    pub(crate) key: &'a str,
    pub(crate) ms: u64,
}

/// Runs `writes` in one script if `owner` holds the lock with `keys` to write, once however
/// often the script is sent (`trace`); returns whether it did (otherwise nothing was
/// written).
pub(crate) async fn write_if_held(
    conn: &mut Conn,
    keys: &LockKeys,
    owner: &str,
    writes: &[WriteCommand],
    trace: WriteTrace<'_>,
) -> redis::RedisResult<bool> {
    let items: Vec<WriteItem<'_>> = writes
        .iter()
        .map(|write| WriteItem {
            key: &write.key,
            command: &write.name,
            arg_count: u64::try_from(write.args.len()).unwrap_or(u64::MAX),
        })
        .collect();
    let rest: Vec<Arg<'_>> = writes
        .iter()
        .flat_map(|write| write.args.iter().map(|arg| Arg::Bytes(arg)))
        .collect();
    let inputs = GuardedWriteInputs {
        lock: keys.hash(),
        written: trace.key,
        owner,
        written_ms: trace.ms,
    };
    let cmd = GUARDED_WRITE.command_with_rest(&inputs, &items, &rest);
    let reply = GUARDED_WRITE.run(conn, &cmd).await?;
    match reply.status() {
        guarded::APPLIED => Ok(true),
        guarded::REFUSED => Ok(false),
        _ => Err(reply.unknown()),
    }
}
