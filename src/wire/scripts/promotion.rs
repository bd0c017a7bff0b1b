//! The script that looks at a server's promotion and vouches for it (see
//! `lua/lib/promotion.lua`): it tells under which replication id a promoted master serves,
//! and writes its witness when its caller saw that id on a master for the lease limit.

use crate::wire::conn::Conn;
use crate::wire::script::ScriptSpec;
use crate::wire::script_inputs::script_inputs;
use crate::wire::script_reply::reply_statuses;

reply_statuses! {
    /// What a look at a promotion answers, before the replication id.
    promotion {
        /// No master with a previous replication id (an empty id).
        NOT_PROMOTED = 0 => Served { replication_id: String },
        /// A promoted master, under a replication id its caller did not vouch for.
        SEEN = 1 => Served,
        /// A promoted master under a replication id its caller vouched for, as its witness
        /// now says.
        VOUCHED = 2 => Served,
    }
}

script_inputs! {
    /// What a look at a promotion takes.
    struct WitnessInputs<'a> {
        keys { witness: &'a str }
        args {
            settled: &'a str,
            vouched_ms: u64,
        }
    }
}

static PROMOTION_WITNESS: ScriptSpec<WitnessInputs<'static>> = ScriptSpec::new(
    "promotion_witness.lua",
    include_str!("../lua/promotion_witness.lua"),
    &[promotion::ALL],
);

#[cfg(test)]
pub(super) fn all() -> Vec<&'static dyn crate::wire::script::Described> {
    vec![&PROMOTION_WITNESS]
}

/// What the server of a witness is to its promotion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Promotion {
    /// It was never promoted (or is no master).
    None,
    /// A promoted master under this replication id, which the caller did not vouch for.
    Seen(String),
    /// A promoted master under this replication id, which its witness now vouches for.
    Vouched(String),
}

/// Looks at the promotion of the server of `witness`, and vouches there for `vouched_ms` when
/// it serves under a replication id of `settled` (comma-separated).
pub(crate) async fn witness_promotion(
    conn: &mut Conn,
    witness: &str,
    settled: &str,
    vouched_ms: u64,
) -> redis::RedisResult<Promotion> {
    let cmd = PROMOTION_WITNESS.command(&WitnessInputs {
        witness,
        settled,
        vouched_ms,
    });
    let reply = PROMOTION_WITNESS.run(conn, &cmd).await?;
    let promotion::Served { replication_id } = reply.values()?;
    match reply.status() {
        promotion::NOT_PROMOTED => Ok(Promotion::None),
        promotion::SEEN => Ok(Promotion::Seen(replication_id)),
        promotion::VOUCHED => Ok(Promotion::Vouched(replication_id)),
        _ => Err(reply.unknown()),
    }
}
