//! What singleton tasks and schedules write beside their lock: a schedule's tick, claimed by
//! the holder of its lock from the server's clock, and a singleton's leader, for operators.

use crate::keys::LockKeys;
use crate::wire::conn::Conn;
use crate::wire::script::{Arg, ScriptSpec, reply_statuses};
use crate::wire::scripts::reply::run;

reply_statuses! {
    /// What a claim of a tick answers.
    tick_claim {
        /// The tick is the caller's to run.
        RUN = 1,
        /// The tick was recorded without running it, as asked.
        SETTLED = 2,
        /// The tick was claimed already.
        DONE = 3,
        /// The tick may have run before Redis lost its data: recorded, not to be run.
        UNKNOWN = 4,
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

static RECORD_LEADER: ScriptSpec<2, 2> = ScriptSpec::new(
    "record_leader.lua",
    include_str!("../lua/record_leader.lua"),
    ["LOCK", "LEADER"],
    ["OWNER", "TERM"],
    &[leader_record::ALL],
);

static CLAIM_TICK: ScriptSpec<3, 4> = ScriptSpec::new(
    "claim_tick.lua",
    include_str!("../lua/claim_tick.lua"),
    ["LOCK", "TICKS", "EPOCH"],
    ["OWNER", "PERIOD_MS", "CLAIM", "MODE"],
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
    let mode = match claim.mode {
        ClaimMode::Run => "run",
        ClaimMode::Settle => "settle",
    };
    let cmd = CLAIM_TICK.command(
        [claim.keys.hash(), claim.keys.ticks(), claim.epoch_key],
        [
            Arg::Text(claim.owner),
            Arg::Number(claim.period_ms),
            Arg::Text(claim.claim),
            Arg::Text(mode),
        ],
    );
    let reply = run(&CLAIM_TICK, conn, &cmd).await?;
    let status = match reply.status() {
        tick_claim::RUN => ClaimStatus::Run,
        tick_claim::SETTLED => ClaimStatus::Settled,
        tick_claim::DONE => ClaimStatus::Done,
        tick_claim::UNKNOWN => ClaimStatus::Unknown,
        tick_claim::REFUSED => ClaimStatus::Refused,
        _ => return Err(reply.unknown()),
    };
    Ok(TickReply {
        status,
        tick: reply.non_negative(0),
        passed: reply.non_negative(1),
        server_ms: reply.non_negative(2),
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
    let cmd = RECORD_LEADER.command(
        [keys.hash(), keys.leader()],
        [Arg::Text(owner), Arg::Number(term)],
    );
    let reply = run(&RECORD_LEADER, conn, &cmd).await?;
    match reply.status() {
        leader_record::RECORDED => Ok(true),
        leader_record::REFUSED => Ok(false),
        _ => Err(reply.unknown()),
    }
}
