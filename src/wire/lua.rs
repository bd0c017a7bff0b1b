//! A Lua script that Redis runs by its SHA (`EVALSHA`), and the fallbacks that keep a server
//! without it in its script cache from surfacing as an error: first use, a restart,
//! `SCRIPT FLUSH`, a replica just promoted to master (scripts are not replicated), or an ACL
//! that denies `SCRIPT LOAD`. A `NOSCRIPT` reply means the script did not run, so running it
//! again is always safe.
//!
//! A cluster client runs each script with `lua/cluster.lua` before it (another SHA), which
//! stops it before its first write while its slot migrates. A resharding moves a slot in
//! milliseconds, so a stopped script is tried again a few times within about a third of a
//! second (as redis-rs tries a `TRYAGAIN` again); after that the refusal comes back as an
//! error the callers count as Redis being unavailable for now, and ride out within their own
//! bounds until the migration ends.

use redis::{Arg, Cmd, FromRedisValue, RedisError, RedisResult, Script, ServerErrorKind};

use std::time::Duration;

use crate::wire::conn::Conn;
use crate::wire::redis_error::stopped_by_a_migrating_slot;

/// The prelude of every script a cluster client runs (see `lua/cluster.lua`).
pub(crate) const CLUSTER_PRELUDE: &str = include_str!("lua/cluster.lua");

/// How many times a script stopped by its slot's migration is tried again at once, and the
/// pause before the first of them (doubled each time, to at most 100 ms): 350 ms in all.
const MIGRATING_SLOT_TRIES: u32 = 6;
const FIRST_MIGRATING_SLOT_PAUSE: Duration = Duration::from_millis(10);
const LONGEST_MIGRATING_SLOT_PAUSE: Duration = Duration::from_millis(100);

/// A script's whole source, and its SHA: as a server runs it, and as a cluster does.
pub(crate) struct Lua {
    server: Variant,
    cluster: Variant,
}

/// One source of a script, and its SHA.
struct Variant {
    code: String,
    script: Script,
}

impl Variant {
    fn new(code: String) -> Self {
        let script = Script::new(&code);
        Self { code, script }
    }

    /// `cmd`, an `EVALSHA` of the script, as the `EVAL` of this source.
    fn eval(&self, cmd: &Cmd) -> Cmd {
        let mut eval = redis::cmd("EVAL");
        eval.arg(&self.code);
        copy_after_sha(cmd, &mut eval);
        eval
    }

    /// `cmd`, an `EVALSHA` of the script, naming this source's SHA.
    fn evalsha(&self, cmd: &Cmd) -> Cmd {
        let mut evalsha = redis::cmd("EVALSHA");
        evalsha.arg(self.script.get_hash());
        copy_after_sha(cmd, &mut evalsha);
        evalsha
    }
}

/// The key count, the keys and the arguments of `cmd` (after `EVALSHA` and the SHA), added
/// to `to`.
fn copy_after_sha(cmd: &Cmd, to: &mut Cmd) {
    for arg in cmd.args_iter().skip(2) {
        match arg {
            Arg::Simple(bytes) => to.arg(bytes),
            // No script takes a cursor; anything else would be a new redis-rs variant.
            _ => unreachable!("a script argument that is not plain bytes"),
        };
    }
}

impl Lua {
    pub(crate) fn new(code: String) -> Self {
        let cluster = Variant::new(format!("{CLUSTER_PRELUDE}{code}"));
        Self {
            server: Variant::new(code),
            cluster,
        }
    }

    /// The SHA1 that `EVALSHA` names the script by (a server's; a cluster client's run
    /// names the other, see [`Self::run`]).
    pub(crate) fn sha(&self) -> &str {
        self.server.script.get_hash()
    }

    /// `EVALSHA` of this script with `key_count` keys, written into `cmd`, an empty command
    /// the caller sized for all its arguments; the caller adds the keys, then the arguments.
    pub(crate) fn evalsha_in(&self, mut cmd: Cmd, key_count: usize) -> Cmd {
        cmd.arg("EVALSHA").arg(self.sha()).arg(key_count);
        cmd
    }

    /// Runs `cmd`, an `EVALSHA` of this script (of its cluster source on a cluster). On
    /// `NOSCRIPT` it loads the script (redis-rs sends `SCRIPT LOAD` to every master it knows)
    /// and runs `cmd` again; when that still meets `NOSCRIPT`, or the load failed, it runs
    /// the script as `EVAL`, which carries the source to the node that owns the keys and so
    /// cannot meet `NOSCRIPT`.
    pub(crate) async fn run<T: FromRedisValue>(
        &self,
        conn: &mut Conn,
        cmd: &Cmd,
    ) -> RedisResult<T> {
        if let Conn::Server(_) = conn {
            return run_once(&self.server, conn, cmd).await;
        }
        let cmd = self.cluster.evalsha(cmd);
        let mut pause = FIRST_MIGRATING_SLOT_PAUSE;
        for _ in 0..MIGRATING_SLOT_TRIES {
            match run_once(&self.cluster, conn, &cmd).await {
                // Stopped before its first write: nothing ran, so it may run again.
                Err(err) if stopped_by_a_migrating_slot(&err) => {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(LONGEST_MIGRATING_SLOT_PAUSE);
                }
                outcome => return outcome,
            }
        }
        run_once(&self.cluster, conn, &cmd).await
    }
}

/// Runs `cmd`, an `EVALSHA` of `variant`, loading the script when its node lacks it.
async fn run_once<T: FromRedisValue>(
    variant: &Variant,
    conn: &mut Conn,
    cmd: &Cmd,
) -> RedisResult<T> {
    match conn.query(cmd).await {
        // Boxed: rare, and every script's future would carry it otherwise.
        Err(err) if no_script(&err) => Box::pin(load_and_run(variant, conn, cmd)).await,
        outcome => outcome,
    }
}

async fn load_and_run<T: FromRedisValue>(
    variant: &Variant,
    conn: &mut Conn,
    cmd: &Cmd,
) -> RedisResult<T> {
    match variant.script.load_async(conn).await {
        Ok(_) => match conn.query(cmd).await {
            Err(err) if no_script(&err) => {
                tracing::debug!("the script was loaded but its node still lacks it: EVAL");
            }
            outcome => return outcome,
        },
        Err(err) => tracing::debug!(error = %err, "the script could not be loaded: EVAL"),
    }
    conn.query(&variant.eval(cmd)).await
}

fn no_script(err: &RedisError) -> bool {
    err.kind() == redis::ErrorKind::Server(ServerErrorKind::NoScript)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_eval_of_an_evalsha_keeps_its_keys_and_arguments_after_the_source() {
        let echo = Lua::new("return {KEYS[1], ARGV[1]}".to_owned());
        let mut evalsha = echo.evalsha_in(Cmd::new(), 1);
        evalsha.arg("lock:{a}").arg(b"\x00bytes".as_slice());
        let eval = echo.server.eval(&evalsha);
        let args: Vec<Vec<u8>> = eval
            .args_iter()
            .map(|arg| match arg {
                Arg::Simple(bytes) => bytes.to_vec(),
                _ => panic!("a cursor"),
            })
            .collect();
        assert_eq!(
            args,
            [
                b"EVAL".as_slice(),
                echo.server.code.as_bytes(),
                b"1",
                b"lock:{a}",
                b"\x00bytes",
            ]
        );
    }
}
