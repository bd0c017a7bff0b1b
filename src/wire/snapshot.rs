//! One lock's keys read at one instant, for operators: a script that only reads
//! (`lua/inspect.lua`), so the holders, the queue and the server's clock agree.

use crate::keys::LockKeys;
use crate::layout;
use crate::wire::conn::Conn;
use crate::wire::script::{READS_ONLY, ScriptSpec};
use crate::wire::script_inputs::script_inputs;
use crate::wire::scripts::LockKeyNames;

script_inputs! {
    /// What a read of one lock takes.
    struct InspectInputs<'a> {
        keys {
            lock_keys: LockKeyNames<'a>,
            leader: &'a str,
        }
        args { max_waiters: u64 }
    }
}

static INSPECT: ScriptSpec<InspectInputs<'static>> =
    ScriptSpec::new("inspect.lua", include_str!("lua/inspect.lua"), &[])
        .with_function_flags(READS_ONLY);

/// The script, for the check of its Lua against its description.
#[cfg(test)]
pub(crate) fn script() -> &'static dyn crate::wire::script::Described {
    &INSPECT
}

/// One lock's keys as Redis holds them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RawLock {
    /// The server's clock when it read them, in ms.
    pub(crate) server_ms: u64,
    /// The lock hash's fields and values.
    pub(crate) fields: Vec<(String, String)>,
    /// The hash's PTTL: -2 when it does not exist.
    pub(crate) pttl_ms: i64,
    /// The last token of the block last granted from the queue, while that grant's lease lives.
    pub(crate) fence: Option<u64>,
    /// How many owners are queued.
    pub(crate) queued: u64,
    /// The first queued owners, head first: owner id, arrival (server µs), terms (empty when
    /// none are recorded).
    pub(crate) waiters: Vec<(String, u64, String)>,
    /// The last leader a singleton of this name recorded: term, since (server ms), owner.
    pub(crate) leader: Option<(u64, u64, String)>,
}

/// Reads the keys of the lock with `keys`, and at most `max_waiters` (at least one) of its
/// queue.
pub(crate) async fn read(
    conn: &mut Conn,
    keys: &LockKeys,
    max_waiters: usize,
) -> redis::RedisResult<RawLock> {
    type Reply = (u64, Vec<String>, i64, String, u64, Vec<String>, String);
    let cmd = INSPECT.command(&InspectInputs {
        lock_keys: LockKeyNames::of(keys),
        leader: keys.leader(),
        max_waiters: max_waiters.max(1) as u64,
    });
    let (server_ms, fields, pttl_ms, fence, queued, waiters, leader): Reply =
        INSPECT.lua().run(conn, &cmd).await?;
    let mut fields = fields.into_iter();
    let fields = std::iter::from_fn(|| Some((fields.next()?, fields.next()?))).collect();
    let mut waiters = waiters.into_iter();
    let waiters = std::iter::from_fn(|| {
        let (owner, arrival, terms) = (waiters.next()?, waiters.next()?, waiters.next()?);
        // A score: digits, or a double's exponent form from some servers.
        let arrival = arrival.parse::<f64>().map_or(0, |us| us.max(0.0) as u64);
        Some((owner, arrival, terms))
    })
    .collect();
    Ok(RawLock {
        server_ms,
        fields,
        pttl_ms,
        fence: layout::last_granted_token(&fence),
        queued,
        waiters,
        leader: leader_of(&leader),
    })
}

/// A leader record as `lua/record_leader.lua` writes it: `'<term> <since ms> <owner>'`.
fn leader_of(record: &str) -> Option<(u64, u64, String)> {
    let mut parts = record.splitn(3, ' ');
    let term = parts.next()?.parse().ok()?;
    let since_ms = parts.next()?.parse().ok()?;
    Some((term, since_ms, parts.next()?.to_owned()))
}
