//! A Lua script that Redis runs by its SHA (`EVALSHA`), and the fallbacks that keep a server
//! without it in its script cache from surfacing as an error: first use, a restart,
//! `SCRIPT FLUSH`, a replica just promoted to master (scripts are not replicated), or an ACL
//! that denies `SCRIPT LOAD`. A `NOSCRIPT` reply means the script did not run, so running it
//! again is always safe.

use redis::{Arg, Cmd, FromRedisValue, RedisError, RedisResult, Script, ServerErrorKind};

use crate::wire::conn::Conn;
use crate::wire::migration;

/// A script's whole source, and its SHA.
pub(crate) struct Lua {
    code: String,
    script: Script,
}

impl Lua {
    pub(crate) fn new(code: String) -> Self {
        let script = Script::new(&code);
        Self { code, script }
    }

    /// The SHA1 that `EVALSHA` names the script by.
    pub(crate) fn sha(&self) -> &str {
        self.script.get_hash()
    }

    /// `EVALSHA` of this script with `key_count` keys, written into `cmd`, an empty command
    /// the caller sized for all its arguments; the caller adds the keys, then the arguments.
    pub(crate) fn evalsha_in(&self, mut cmd: Cmd, key_count: usize) -> Cmd {
        cmd.arg("EVALSHA").arg(self.sha()).arg(key_count);
        cmd
    }

    /// Runs `cmd`, an `EVALSHA` of this script. On `NOSCRIPT` it loads the script (redis-rs
    /// sends `SCRIPT LOAD` to every master it knows) and runs `cmd` again; when that still
    /// meets `NOSCRIPT`, or the load failed, it runs the script as `EVAL`, which carries the
    /// source to the node that owns the keys and so cannot meet `NOSCRIPT`.
    pub(crate) async fn run<T: FromRedisValue>(
        &self,
        conn: &mut Conn,
        cmd: &Cmd,
    ) -> RedisResult<T> {
        if let Conn::Cluster(cluster) = conn
            && migration::seen_migrating(cmd)
            && let Some(reply) = Box::pin(migration::run(cluster, cmd, &self.code)).await?
        {
            return Ok(reply);
        }
        match conn.query(cmd).await {
            // Boxed: rare, and every script's future would carry it otherwise.
            Err(err) if no_script(&err) => Box::pin(self.load_and_run(conn, cmd)).await,
            // Refused because its slot migrates: run where the slot's keys go.
            Err(err) if migration::refused_by_migration(&err) => match conn {
                Conn::Cluster(cluster) => Box::pin(migration::run(cluster, cmd, &self.code))
                    .await?
                    .ok_or(err),
                Conn::Server(_) => Err(err),
            },
            outcome => outcome,
        }
    }

    async fn load_and_run<T: FromRedisValue>(&self, conn: &mut Conn, cmd: &Cmd) -> RedisResult<T> {
        match self.script.load_async(conn).await {
            Ok(_) => match conn.query(cmd).await {
                Err(err) if no_script(&err) => {
                    tracing::debug!("the script was loaded but its node still lacks it: EVAL");
                }
                outcome => return outcome,
            },
            Err(err) => tracing::debug!(error = %err, "the script could not be loaded: EVAL"),
        }
        conn.query(&self.eval(cmd)).await
    }

    /// `cmd`, an `EVALSHA` of this script, as the `EVAL` of its source.
    fn eval(&self, cmd: &Cmd) -> Cmd {
        let mut eval = redis::cmd("EVAL");
        eval.arg(&self.code);
        // After EVALSHA and the SHA: the key count, the keys, the arguments.
        for arg in cmd.args_iter().skip(2) {
            match arg {
                Arg::Simple(bytes) => eval.arg(bytes),
                // No script takes a cursor; anything else would be a new redis-rs variant.
                _ => unreachable!("a script argument that is not plain bytes"),
            };
        }
        eval
    }
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
        let eval = echo.eval(&evalsha);
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
                echo.code.as_bytes(),
                b"1",
                b"lock:{a}",
                b"\x00bytes",
            ]
        );
    }
}
