//! Runs lock operations for `scripts/redis-work.sh`, which runs Redis under callgrind and
//! counts the instructions Redis executes during them: Redis's own work per operation, a
//! figure that does not move with the load on a shared machine as wall-clock times do.
//!
//! ```text
//! redis_work --redis URL [--cluster] \
//!     --workload uncontended|group-commit|one-at-a-time|hand-over|peer|peer-one-at-a-time \
//!     --rounds N
//! ```
//!
//! With `--cluster`, `URL` is a node of a Redis Cluster that serves every slot, and the lock
//! clients are cluster clients (`LockClient::builder_cluster`). The program gives every slot
//! its epoch first (a cluster that just started, as an operator gives one known to be new).
//!
//! - `uncontended`: one client; per round, 16 tasks each acquire and release a lock of their
//!   own at once (16 operations).
//! - `group-commit`: `uncontended` with a client whose calls that come while one is in flight
//!   go out together (`LockClientBuilder::group_commit`).
//! - `one-at-a-time`: one client, one task; per round, it acquires and releases a lock that
//!   nobody else takes (1 operation): nothing to share a call with.
//! - `hand-over`: two clients (two instances) take turns on one lock; per round, one waits
//!   queued in Redis while the other releases, so the release grants it (1 operation).
//! - `peer`: the simplest lock of the fast-path bench (`SET NX PX`, and a compare-and-delete
//!   release: what rslock sends), 16 at once per round on one connection (16 operations).
//! - `peer-one-at-a-time`: the same lock, one acquire and release per round (1 operation).
//!
//! The program connects and warms up (scripts loaded, epoch learned) first, prints `ready`
//! and waits for a line on stdin; then resets the server's command statistics, runs its
//! rounds, shuts its clients down, prints `done <operations> <commands Redis ran>` (scripts'
//! own included, the statistics' reset and read left out) and waits for another line (or the
//! end of input) before it exits. The caller's count thus holds the rounds and one shutdown,
//! which the difference between a run of N rounds and one of 3N cancels.

#[path = "commandstats.rs"]
mod commandstats;
#[path = "../../benches/shared/simplest_lock.rs"]
mod simplest_lock;

use std::error::Error;
use std::time::Duration;

use futures_util::future::{join_all, try_join_all};
use redis::aio::MultiplexedConnection;
use tokio::io::{AsyncBufReadExt, BufReader, Lines, Stdin};
use tower_redis_lock::{Lock, LockClient, LockClientBuilder, LockGuard};

use simplest_lock::SimplestLock;

type Res<T> = Result<T, Box<dyn Error + Send + Sync>>;

/// Locks taken at once per round where nobody waits.
const IN_FLIGHT: usize = 16;

#[tokio::main]
async fn main() -> Res<()> {
    let (url, cluster, workload, rounds) = parse()?;
    let target = Target { url, cluster };
    if target.cluster {
        let operator = target.builder().build().await?;
        operator.waive_restart_quarantine().await?;
        operator.shutdown().await;
    }
    let mut window = Window {
        stdin: BufReader::new(tokio::io::stdin()).lines(),
        stats: redis::Client::open(target.url.as_str())?
            .get_multiplexed_async_connection()
            .await?,
    };
    let operations = match workload.as_str() {
        "uncontended" => uncontended(&target, rounds, IN_FLIGHT, false, &mut window).await?,
        "group-commit" => uncontended(&target, rounds, IN_FLIGHT, true, &mut window).await?,
        "one-at-a-time" => uncontended(&target, rounds, 1, false, &mut window).await?,
        "hand-over" => hand_over(&target, rounds, &mut window).await?,
        "peer" => peer(&target.url, rounds, IN_FLIGHT, &mut window).await?,
        "peer-one-at-a-time" => peer(&target.url, rounds, 1, &mut window).await?,
        other => return Err(format!("unknown workload {other}").into()),
    };
    let commands = window.commands().await?;
    println!("done {operations} {commands}");
    window.stdin.next_line().await?;
    Ok(())
}

/// The Redis the lock clients talk to.
struct Target {
    url: String,
    /// Whether `url` is a node of a cluster, reached by cluster clients.
    cluster: bool,
}

impl Target {
    /// A builder of a lock client of this Redis, with a command timeout that a Redis run under
    /// callgrind (tens of times slower) meets: giving every slot of a cluster its epoch takes
    /// it seconds.
    fn builder(&self) -> LockClientBuilder {
        let builder = if self.cluster {
            LockClient::builder_cluster([&self.url])
        } else {
            LockClient::builder(&self.url)
        };
        builder.command_timeout(Duration::from_secs(60))
    }
}

fn parse() -> Res<(String, bool, String, usize)> {
    let (mut url, mut cluster, mut workload, mut rounds) = (None, false, None, None);
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        if flag == "--cluster" {
            cluster = true;
            continue;
        }
        let value = args.next().ok_or(format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--redis" => url = Some(value),
            "--workload" => workload = Some(value),
            "--rounds" => rounds = Some(value.parse().map_err(|_| "--rounds: not a number")?),
            _ => return Err(format!("unknown option {flag}").into()),
        }
    }
    let usage = "usage: redis_work --redis URL [--cluster] --workload \
                 uncontended|group-commit|one-at-a-time|hand-over|peer|peer-one-at-a-time \
                 --rounds N";
    Ok((
        url.ok_or(usage)?,
        cluster,
        workload.ok_or(usage)?,
        rounds.ok_or(usage)?,
    ))
}

/// The counted window: opened when the caller says go, and the commands Redis ran in it.
struct Window {
    stdin: Lines<BufReader<Stdin>>,
    /// A connection of its own for the server's command statistics.
    stats: MultiplexedConnection,
}

impl Window {
    /// Tells the caller the warm-up is over, waits for its go, and resets the statistics.
    async fn open(&mut self) -> Res<()> {
        println!("ready");
        self.stdin
            .next_line()
            .await?
            .ok_or("stdin closed before the go")?;
        let () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query_async(&mut self.stats)
            .await?;
        Ok(())
    }

    /// Commands Redis ran since [`Window::open`], but the statistics' own reset and read.
    async fn commands(&mut self) -> Res<u64> {
        let stats: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut self.stats)
            .await?;
        Ok(commandstats::calls_by_command(&stats)
            .into_iter()
            .filter(|(name, _)| !name.starts_with("config") && name != "info")
            .map(|(_, calls)| calls)
            .sum())
    }
}

/// Per round, `at_once` tasks of one client (with `group_commit` or not) each acquire and
/// release a lock of their own.
async fn uncontended(
    target: &Target,
    rounds: usize,
    at_once: usize,
    group_commit: bool,
    window: &mut Window,
) -> Res<usize> {
    let client = target.builder().group_commit(group_commit).build().await?;
    let locks = (0..at_once)
        .map(|worker| client.lock(&format!("redis-work:{worker}")))
        .collect::<Result<Vec<_>, _>>()?;
    let round = || {
        try_join_all(
            locks
                .iter()
                .map(|lock| async move { lock.acquire().await?.release().await }),
        )
    };
    round().await?;
    window.open().await?;
    for _ in 0..rounds {
        round().await?;
    }
    client.shutdown().await;
    Ok(rounds * at_once)
}

async fn hand_over(target: &Target, rounds: usize, window: &mut Window) -> Res<usize> {
    let clients = [
        target.builder().build().await?,
        target.builder().build().await?,
    ];
    let locks = [
        clients[0].lock("redis-work:hand-over")?,
        clients[1].lock("redis-work:hand-over")?,
    ];
    let mut held = locks[0].acquire().await?;
    // The first hand-over in each direction warms up: scripts loaded, subscriptions made.
    for round in 0..rounds + 2 {
        if round == 2 {
            window.open().await?;
        }
        held = hand_over_once(&clients[(round + 1) % 2], &locks[(round + 1) % 2], held).await?;
    }
    held.release().await?;
    for client in &clients {
        client.shutdown().await;
    }
    Ok(rounds)
}

/// `next` asks for the lock `held` holds, queues in Redis, and gets it by `held`'s release.
async fn hand_over_once(next_client: &LockClient, next: &Lock, held: LockGuard) -> Res<LockGuard> {
    let next = next.clone();
    let waiting = tokio::spawn(async move { next.acquire().await });
    // The client counts its queued waiters but signals nothing: look every millisecond.
    while next_client.queued_waiters() == 0 {
        if waiting.is_finished() {
            return Err("the waiter got the lock without queuing".into());
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let token = held.fencing_token();
    held.release().await?;
    let next = waiting.await??;
    if next.fencing_token() <= token {
        return Err("the fencing tokens went back".into());
    }
    Ok(next)
}

/// Per round, `at_once` acquire and release the simplest lock, each on a key of its own.
async fn peer(url: &str, rounds: usize, at_once: usize, window: &mut Window) -> Res<usize> {
    let lock = SimplestLock::connect(url).await?;
    let keys: Vec<String> = (0..at_once)
        .map(|worker| format!("redis-work:peer:{worker}"))
        .collect();
    let round = || join_all(keys.iter().map(|key| lock.acquire_release(key)));
    round().await;
    window.open().await?;
    for _ in 0..rounds {
        round().await;
    }
    Ok(rounds * at_once)
}
