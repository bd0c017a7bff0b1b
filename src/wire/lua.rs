//! A Lua script that one server runs as a Redis Function (`FCALL`) and a cluster by its SHA
//! (`EVALSHA`), and the fallbacks that keep a server
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

use crate::wire::conn::{Conn, Functions};
use crate::wire::function_library::function_library;
use crate::wire::function_names::{library_name, remove_older_releases};
use crate::wire::redis_error::stopped_by_a_migrating_slot;

/// The prelude of every script a cluster client runs (see `lua/cluster.lua`).
pub(crate) const CLUSTER_PRELUDE: &str = include_str!("lua/cluster.lua");

/// How many times a script stopped by its slot's migration is tried again at once, and the
/// pause before the first of them (doubled each time, to at most 100 ms): 350 ms in all.
const MIGRATING_SLOT_TRIES: u32 = 6;
const FIRST_MIGRATING_SLOT_PAUSE: Duration = Duration::from_millis(10);
const LONGEST_MIGRATING_SLOT_PAUSE: Duration = Duration::from_millis(100);

/// A script's whole source, and its SHA: as a server runs it, and as a cluster does; and the
/// same source as a function library, which one server runs in its place.
pub(crate) struct Lua {
    server: Variant,
    cluster: Variant,
    function: Function,
}

/// A script as a Redis Functions library of one function of the library's name
/// (`function_library.rs`).
struct Function {
    name: String,
    library: String,
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

    /// `cmd`, a call of the script, as the `EVAL` of this source.
    fn eval(&self, cmd: &Cmd) -> Cmd {
        let mut eval = redis::cmd("EVAL");
        eval.arg(&self.code);
        copy_after_sha(cmd, &mut eval);
        eval
    }

    /// `cmd`, a call of the script, as the `EVALSHA` of this source.
    fn evalsha(&self, cmd: &Cmd) -> Cmd {
        let mut evalsha = redis::cmd("EVALSHA");
        evalsha.arg(self.script.get_hash());
        copy_after_sha(cmd, &mut evalsha);
        evalsha
    }
}

/// The key count, the keys and the arguments of `cmd` (after `FCALL` and the function's name,
/// or `EVALSHA` and the SHA), added
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
    /// The script of `file` with its whole source `code`; as a function, registered with
    /// `flags`.
    pub(crate) fn new(file: &str, code: String, flags: &[&str]) -> Self {
        let cluster = Variant::new(format!("{CLUSTER_PRELUDE}{code}"));
        let server = Variant::new(code);
        let name = library_name(file, server.script.get_hash());
        let library = function_library(&name, &server.code, flags);
        Self {
            server,
            cluster,
            function: Function { name, library },
        }
    }

    /// The name a call of the script names: its function's.
    pub(crate) fn name(&self) -> &str {
        &self.function.name
    }

    /// A call of this script with `key_count` keys (`FCALL` of its function), written into
    /// `cmd`, an empty command the caller sized for all its arguments; the caller adds the
    /// keys, then the arguments. Built as one server runs it; [`Self::run`] turns it into the
    /// script's `EVALSHA` where functions are not run.
    pub(crate) fn call_in(&self, mut cmd: Cmd, key_count: usize) -> Cmd {
        cmd.arg("FCALL").arg(self.name()).arg(key_count);
        cmd
    }

    /// Runs `cmd`, a call of this script ([`Self::call_in`]): on one server as its function
    /// (see [`Self::run_function`]), or as the script where the server refused functions; on a
    /// cluster as the `EVALSHA` of its cluster source. On `NOSCRIPT` it loads the script
    /// (redis-rs sends `SCRIPT LOAD` to every master it knows) and runs it again; when that
    /// still meets `NOSCRIPT`, or the load failed, it runs the script as `EVAL`, which carries
    /// the source to the node that owns the keys and so cannot meet `NOSCRIPT`.
    pub(crate) async fn run<T: FromRedisValue>(
        &self,
        conn: &mut Conn,
        cmd: &Cmd,
    ) -> RedisResult<T> {
        if let Conn::Server(_, functions) = conn {
            if functions.refused() {
                return run_once(&self.server, conn, &self.server.evalsha(cmd)).await;
            }
            let functions = functions.clone();
            return self.run_function(&functions, conn, cmd).await;
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

impl Lua {
    /// Runs `cmd`, the `FCALL` of this script's function, on one server.
    /// On "function not found" (first use, a restart without the library, `FUNCTION FLUSH`) it
    /// loads the library and calls it again; a server that does not know or allow functions
    /// runs the script, and this connection runs scripts from then on. None of these replies
    /// ran anything, so running again is always safe.
    async fn run_function<T: FromRedisValue>(
        &self,
        functions: &Functions,
        conn: &mut Conn,
        cmd: &Cmd,
    ) -> RedisResult<T> {
        match conn.query(cmd).await {
            // Boxed: rare, and every script's future would carry it otherwise.
            Err(err) if function_not_found(&err) => {
                Box::pin(self.load_and_call(functions, conn, cmd)).await
            }
            Err(err) if refused(&err, "fcall") => {
                functions.refuse();
                Box::pin(run_once(&self.server, conn, &self.server.evalsha(cmd))).await
            }
            outcome => outcome,
        }
    }

    async fn load_and_call<T: FromRedisValue>(
        &self,
        functions: &Functions,
        conn: &mut Conn,
        cmd: &Cmd,
    ) -> RedisResult<T> {
        let mut load = redis::cmd("FUNCTION");
        load.arg("LOAD").arg(&self.function.library);
        match conn.query::<redis::Value>(&load).await {
            // In the background: the call waits for nothing but its own load.
            Ok(_) => {
                let mut conn = conn.clone();
                tokio::spawn(async move { remove_older_releases(&mut conn).await });
            }
            // Loaded meanwhile by another client.
            Err(err) if err.to_string().contains("already exists") => {}
            Err(err) => {
                if refused(&err, "function|load") {
                    functions.refuse();
                }
                tracing::debug!(error = %err, "the function could not be loaded: EVALSHA");
                return run_once(&self.server, conn, &self.server.evalsha(cmd)).await;
            }
        }
        match conn.query(cmd).await {
            Err(err) if function_not_found(&err) => {
                tracing::debug!("the function was loaded but the server still lacks it: EVALSHA");
                run_once(&self.server, conn, &self.server.evalsha(cmd)).await
            }
            outcome => outcome,
        }
    }
}

/// Whether the server has no function of that name: nothing ran.
fn function_not_found(err: &RedisError) -> bool {
    err.to_string().contains("Function not found")
}

/// Whether the server refused `command` itself (`fcall`, `function|load`): it does not know
/// functions (before Redis 7.0), or does not allow them to this user (an ACL written for the
/// scripts). Nothing ran then. A refusal from inside a function (a command the user lacks)
/// is not one: the function ran up to it, and is not run again as a script.
fn refused(err: &RedisError, command: &str) -> bool {
    let message = err.to_string().to_ascii_lowercase();
    let name = command.split('|').next().unwrap_or(command);
    (message.contains("unknown command") && message.contains(name))
        || message.contains(&format!("'{command}' command"))
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
    use crate::wire::error_reply;

    #[test]
    fn a_server_that_refuses_fcall_itself_is_told_from_a_refusal_inside_a_function() {
        let refusals = [
            // Redis 7.0, Valkey 9, Redis 6.2 (which has no functions).
            "NOPERM this user has no permissions to run the 'fcall' command",
            "NOPERM User locker has no permissions to run the 'fcall' command",
            "ERR unknown command 'FCALL', with args beginning with: 'tower_redis_lock_x' ",
            "ERR unknown command `FCALL`, with args beginning with: `tower_redis_lock_x`, ",
        ];
        for line in refusals {
            assert!(refused(&error_reply(line), "fcall"), "{line}");
        }
        let inside = [
            "NOPERM this user has no permissions to run the 'hset' command script: \
             tower_redis_lock_acquire_x, on @user_function:42.",
            "ERR Function not found",
        ];
        for line in inside {
            assert!(!refused(&error_reply(line), "fcall"), "{line}");
        }
        let load = "NOPERM this user has no permissions to run the 'function|load' command";
        assert!(refused(&error_reply(load), "function|load"));
        assert!(function_not_found(&error_reply("ERR Function not found")));
    }

    #[test]
    fn a_call_as_the_eval_and_the_evalsha_of_the_script_keeps_its_keys_and_arguments() {
        let echo = Lua::new("echo.lua", "return {KEYS[1], ARGV[1]}".to_owned(), &[]);
        let mut call = echo.call_in(Cmd::new(), 1);
        call.arg("lock:{a}").arg(b"\x00bytes".as_slice());
        let written = |cmd: &Cmd| -> Vec<Vec<u8>> {
            cmd.args_iter()
                .map(|arg| match arg {
                    Arg::Simple(bytes) => bytes.to_vec(),
                    _ => panic!("a cursor"),
                })
                .collect()
        };
        let after = [b"1".as_slice(), b"lock:{a}", b"\x00bytes"];
        let head = |first: &[u8], second: &[u8]| -> Vec<Vec<u8>> {
            [first, second]
                .into_iter()
                .chain(after)
                .map(<[u8]>::to_vec)
                .collect()
        };
        assert_eq!(written(&call), head(b"FCALL", echo.name().as_bytes()));
        assert!(echo.name().starts_with("tower_redis_lock_"));
        let eval = echo.server.eval(&call);
        assert_eq!(written(&eval), head(b"EVAL", echo.server.code.as_bytes()));
        let evalsha = echo.server.evalsha(&call);
        let sha = echo.server.script.get_hash().as_bytes();
        assert_eq!(written(&evalsha), head(b"EVALSHA", sha));
    }
}
