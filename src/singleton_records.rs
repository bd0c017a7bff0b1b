//! What singleton tasks and schedules write in Redis under their lock: a schedule's tick,
//! claimed from the server's clock (what a [`Schedule`](crate::singleton::Schedule) asks each
//! tick), and a singleton's leader since when, for `lockctl`.

use std::time::Duration;

use crate::engine::hold::Holder;
use crate::engine::replicas;
use crate::error::Result;
use crate::wire::scripts::record_leader as record_leader_script;
use crate::wire::scripts::{self, TickClaim};

pub(crate) use crate::wire::scripts::{ClaimMode, ClaimStatus, TickReply};

/// Claims the current tick of a schedule of `period` whose lock `holder` holds. Each claim
/// has an id of its own, so a claim sent twice (a cluster's resend) gets its first answer.
/// With [`min_replicas_acked`](crate::LockClientBuilder::min_replicas_acked), a tick is
/// given to run once the replicas asked for have its record, so a failover does not forget it.
pub(crate) async fn claim_tick(
    holder: &Holder,
    period: Duration,
    mode: ClaimMode,
) -> Result<TickReply> {
    let acquisition = &holder.acquisition;
    let shared = &acquisition.shared;
    shared.ensure_running()?;
    let keys = &acquisition.keys;
    let epoch_key = shared.scope_keys(keys).epoch_key.as_str();
    let claim = format!("{:016x}", rand::random::<u64>());
    let period_ms = u64::try_from(period.as_millis()).unwrap_or(u64::MAX).max(1);
    let reply = shared
        .connections
        .run(keys.hash(), |mut conn| {
            let claim = TickClaim {
                keys,
                epoch_key,
                owner: &acquisition.owner,
                claim: &claim,
                period_ms,
                mode,
            };
            async move { scripts::claim_tick(&mut conn, claim).await }
        })
        .await?;
    if matches!(reply.status, ClaimStatus::Run | ClaimStatus::Settled) {
        replicas::acknowledged_what(shared, keys, "tick claim").await?;
    }
    Ok(reply)
}

/// Records `holder` as its singleton's leader since now (the server's clock), for operators;
/// returns whether it still held the lock.
pub(crate) async fn record_leader(holder: &Holder) -> Result<bool> {
    let acquisition = &holder.acquisition;
    let shared = &acquisition.shared;
    shared.ensure_running()?;
    let keys = &acquisition.keys;
    let (owner, term) = (&acquisition.owner, holder.token);
    shared
        .connections
        .run(keys.hash(), |mut conn| async move {
            record_leader_script(&mut conn, keys, owner, term).await
        })
        .await
}
