//! What singleton tasks and schedules write beside their lock: a schedule's tick, claimed by
//! the holder of its lock from the server's clock, and a singleton's leader, for operators.

use crate::keys::LockKeys;
use crate::wire::conn::Conn;
use crate::wire::script::ScriptSpec;
use crate::wire::script_inputs::{Arg, OneArg, script_inputs};
use crate::wire::script_reply::reply_statuses;

reply_statuses! {
    /// What a claim of a tick answers.
    tick_claim {
        /// The tick is the caller's to run.
        RUN = 1 => ClaimValues {
            /// The server's ms over the period.
            tick: u64,
            /// The ticks passed over since the last one claimed.
            passed: u64,
            server_ms: u64,
        },
        /// The tick was recorded without running it, as asked.
        SETTLED = 2 => ClaimValues,
        /// The tick was claimed already.
        DONE = 3 => ClaimValues,
        /// The tick may have run before Redis lost its data: recorded, not to be run.
        UNKNOWN = 4 => ClaimValues,
        /// The owner does not hold the lock: nothing was recorded.
        REFUSED = 0,
    }
}

reply_statuses! {
    /// What a record of the leader answers.
    leader_record {
        /// The leader was recorded.
        RECORDED = 1,
        /// The owner does not hold the lock: nothing was recorded.
        REFUSED = 0,
    }
}

script_inputs! {
    /// What a record of the leader takes.
    struct RecordLeaderInputs<'a> {
        keys {
            lock: &'a str,
            leader: &'a str,
        }
        args {
            owner: &'a str,
            term: u64,
        }
    }
}

script_inputs! {
    /// What a claim of a tick takes.
    struct ClaimTickInputs<'a> {
        keys {
            lock: &'a str,
            ticks: &'a str,
            epoch: &'a str,
        }
        args {
            owner: &'a str,
            period_ms: u64,
            claim: &'a str,
            mode: ClaimMode,
        }
    }
}

static RECORD_LEADER: ScriptSpec<RecordLeaderInputs<'static>> = ScriptSpec::new(
    "record_leader.lua",
    include_str!("../lua/record_leader.lua"),
    &[leader_record::ALL],
);

static CLAIM_TICK: ScriptSpec<ClaimTickInputs<'static>> = ScriptSpec::new(
    "claim_tick.lua",
    include_str!("../lua/claim_tick.lua"),
    &[tick_claim::ALL],
);

#[cfg(test)]
pub(super) fn all() -> Vec<&'static dyn crate::wire::script::Described> {
    vec![&CLAIM_TICK, &RECORD_LEADER]
}

/// Whether a claim runs the tick it finds, or records it without running it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ClaimMode {
    Run,
    Settle,
}

/// As the claim script names it.
impl OneArg for ClaimMode {
    fn arg(&self) -> Arg<'_> {
        Arg::Text(match self {
            ClaimMode::Run => "run",
            ClaimMode::Settle => "settle",
        })
    }
}

/// What a claim found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ClaimStatus {
    Run,
    Settled,
    Done,
    Unknown,
    Refused,
}

/// A claim's answer: its status, the tick (the server's ms over the period), the ticks passed
/// over since the last one claimed, and the server's time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TickReply {
    pub(crate) status: ClaimStatus,
    pub(crate) tick: u64,
    pub(crate) passed: u64,
    pub(crate) server_ms: u64,
}

/// The names of one claim: the lock's keys, its scope's epoch key and the claim's own id.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TickClaim<'a> {
    pub(crate) keys: &'a LockKeys,
    pub(crate) epoch_key: &'a str,
    pub(crate) owner: &'a str,
    pub(crate) claim: &'a str,
    pub(crate) period_ms: u64,
    pub(crate) mode: ClaimMode,
}

/// Claims the current tick of the schedule whose lock `claim.owner` holds.
pub(crate) async fn claim_tick(
    conn: &mut Conn,
    claim: TickClaim<'_>,
) -> redis::RedisResult<TickReply> {
    let cmd = CLAIM_TICK.command(&ClaimTickInputs {
        lock: claim.keys.hash(),
        ticks: claim.keys.ticks(),
        epoch: claim.epoch_key,
        owner: claim.owner,
        period_ms: claim.period_ms,
        claim: claim.claim,
        mode: claim.mode,
    });
    let reply = CLAIM_TICK.run(conn, &cmd).await?;
    let status = match reply.status() {
        tick_claim::RUN => ClaimStatus::Run,
        tick_claim::SETTLED => ClaimStatus::Settled,
        tick_claim::DONE => ClaimStatus::Done,
        tick_claim::UNKNOWN => ClaimStatus::Unknown,
        tick_claim::REFUSED => ClaimStatus::Refused,
        _ => return Err(reply.unknown()),
    };
    // A refusal gives no values: 0 each.
    let tick_claim::ClaimValues {
        tick,
        passed,
        server_ms,
    } = reply.values()?;
    Ok(TickReply {
        status,
        tick,
        passed,
        server_ms,
    })
}

/// Records `owner`, which holds the lock with `keys` in the term `term`, as the leader since
/// now by the server's clock; returns whether it held the lock.
pub(crate) async fn record_leader(
    conn: &mut Conn,
    keys: &LockKeys,
    owner: &str,
    term: u64,
) -> redis::RedisResult<bool> {
    let cmd = RECORD_LEADER.command(&RecordLeaderInputs {
        lock: keys.hash(),
        leader: keys.leader(),
        owner,
        term,
    });
    let reply = RECORD_LEADER.run(conn, &cmd).await?;
    match reply.status() {
        leader_record::RECORDED => Ok(true),
        leader_record::REFUSED => Ok(false),
        _ => Err(reply.unknown()),
    }
}
