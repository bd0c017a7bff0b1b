//! Vouches for the promotions this client saw (see `wire/lua/lib/promotion.lua`). A promoted
//! master keeps a previous replication id forever, and Redis keeps no time of the promotion,
//! so a scope whose epoch it never had (a new prefix, an unused slot) cannot tell a lease
//! lost in the promotion from none at all. This task looks at every master now and then;
//! once it has seen a promoted master under the same replication id for the lease limit, by
//! this process's monotonic clock, every lease granted before that promotion has run out,
//! and it writes so in the witness of every scope (every slot of a cluster) that master
//! serves. A missing epoch then starts no quarantine there; a promotion nobody has seen for
//! that long still does.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::error::{ErrorKind, Result};
use crate::scopes::Placement;
use crate::wire::conn::Connections;
use crate::wire::scan;
use crate::wire::scripts::{Promotion, witness_promotion};

/// The shortest and longest pause between two looks at the masters: a quarter of the lease
/// limit in between, so that a promotion is vouched for soon after the lease limit.
const SHORTEST_PAUSE: Duration = Duration::from_millis(250);
const LONGEST_PAUSE: Duration = Duration::from_secs(15);

/// Witnesses written at once, as the operators' waiver does.
const CONCURRENCY: usize = 256;

/// Handle on the task; it ends when the handle is dropped or stopped.
#[derive(Debug)]
pub(crate) struct PromotionWitness {
    stop: Mutex<Option<oneshot::Sender<()>>>,
}

impl PromotionWitness {
    /// Spawns the task on the current runtime, for clients whose leases are at most
    /// `lease_limit`.
    pub(crate) fn start(
        connections: Arc<Connections>,
        placement: Arc<Placement>,
        lease_limit: Duration,
    ) -> Self {
        let (stop, stopped) = oneshot::channel();
        let task = WitnessTask {
            connections,
            placement,
            lease_limit,
            first_seen: HashMap::new(),
            vouched: String::new(),
            unwritten: Vec::new(),
        };
        tokio::spawn(async move {
            tokio::select! {
                _ = stopped => {}
                () = task.run() => {}
            }
        });
        Self {
            stop: Mutex::new(Some(stop)),
        }
    }

    /// Ends the task.
    pub(crate) fn stop(&self) {
        self.stop.lock().expect("promotion witness").take();
    }
}

struct WitnessTask {
    connections: Arc<Connections>,
    placement: Arc<Placement>,
    lease_limit: Duration,
    /// When this client first saw each promoted master's current replication id.
    first_seen: HashMap<String, Instant>,
    /// The replication ids seen for the lease limit, sorted and joined by commas.
    vouched: String,
    /// The scopes whose witness is still to be written for `vouched`.
    unwritten: Vec<u16>,
}

impl WitnessTask {
    async fn run(mut self) {
        let pause = (self.lease_limit / 4).clamp(SHORTEST_PAUSE, LONGEST_PAUSE);
        loop {
            match self.look().await {
                Ok(promoted) => self.learn(promoted),
                Err(err) if err.kind() == ErrorKind::AccessDenied => {
                    tracing::warn!(
                        %err,
                        "the promotion witness is not granted (~tower-redis-lock:promoted* in \
                         the ACL): after a failover, a new prefix or an unused slot waits out \
                         the restart quarantine"
                    );
                    return;
                }
                Err(err) => tracing::debug!(%err, "promotion witness: no look at the masters"),
            }
            if !self.vouched.is_empty() && !self.unwritten.is_empty() {
                self.write().await;
            }
            tokio::time::sleep(pause).await;
        }
    }

    /// The replication id of every promoted master, asked through a witness each serves
    /// (a script about a key, so that a cluster client follows a failover's redirection).
    async fn look(&self) -> Result<Vec<String>> {
        let nodes = self
            .connections
            .run("", |mut conn| async move { scan::nodes(&mut conn).await })
            .await?;
        let mut promoted = Vec::new();
        for scope in nodes {
            match self.witness(scope).await? {
                Promotion::None => {}
                Promotion::Seen(id) | Promotion::Vouched(id) => promoted.push(id),
            }
        }
        Ok(promoted)
    }

    /// Learns which promoted masters have been seen for the lease limit. An id is seen from
    /// the answer's arrival (the promotion came before it), and forgotten once no master
    /// shows it.
    fn learn(&mut self, promoted: Vec<String>) {
        let now = Instant::now();
        self.first_seen.retain(|id, _| promoted.contains(id));
        for id in promoted {
            self.first_seen.entry(id).or_insert(now);
        }
        let mut vouched: Vec<&str> = self
            .first_seen
            .iter()
            .filter(|(_, seen)| now.duration_since(**seen) >= self.lease_limit)
            .map(|(id, _)| id.as_str())
            .collect();
        vouched.sort_unstable();
        if vouched.iter().any(|id| !self.vouched.contains(id)) {
            // Which slots a newly vouched master serves is not known here: all of them.
            self.unwritten = self.placement.scopes().collect();
        }
        self.vouched = vouched.join(",");
    }

    /// Looks at the promotion of the server of `scope`'s witness, vouching for it there.
    async fn witness(&self, scope: u16) -> Result<Promotion> {
        let witness = &self.placement.scope_keys(scope).promotion_witness;
        let (settled, vouched_ms) = (&self.vouched, self.lease_limit.as_millis() as u64);
        self.connections
            .run(witness, |mut conn| async move {
                witness_promotion(&mut conn, witness, settled, vouched_ms).await
            })
            .await
    }

    /// Writes the witness of every scope still unwritten; keeps those that failed (a master
    /// down, a slot migrating) for the next round.
    async fn write(&mut self) {
        let unwritten = std::mem::take(&mut self.unwritten);
        let this = &*self;
        let failed: Vec<u16> = futures_util::stream::iter(unwritten)
            .map(|scope| async move {
                match this.witness(scope).await {
                    Ok(_) => None,
                    // Refused by the ACL (granted for the look, not for this slot's key).
                    Err(err) if err.kind() == ErrorKind::AccessDenied => None,
                    Err(err) => {
                        tracing::debug!(%err, scope, "promotion witness: not written");
                        Some(scope)
                    }
                }
            })
            .buffer_unordered(CONCURRENCY)
            .filter_map(std::future::ready)
            .collect()
            .await;
        self.unwritten = failed;
    }
}
