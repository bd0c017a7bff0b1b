//! A Lua script that a server or a cluster runs as a Redis Function (`FCALL`), and the
//! fallbacks that keep a node without it from surfacing as an error. A function is lost with
//! the data (a restart without a snapshot, `FUNCTION FLUSH`) and a node added to a cluster
//! starts without it: "function not found" loads it (on every master of a cluster) and calls
//! again. A server that does not know functions (before Redis 7.0) or an ACL that denies them
//! runs the script by its SHA (`EVALSHA`), loading it on `NOSCRIPT`: first use, a restart,
//! `SCRIPT FLUSH`, a replica just promoted to master (scripts are not replicated). None of
//! these replies ran anything, so running again is always safe.
//!
//! A cluster runs each script with `lua/cluster.lua` before it (another library, another
//! SHA), which stops it before its first write while its slot migrates. A resharding moves a
//! slot in milliseconds, so a stopped script is tried again a few times within about a third
//! of a second (as redis-rs tries a `TRYAGAIN` again); after that the refusal comes back as
//! an error the callers count as Redis being unavailable for now, and ride out within their
//! own bounds until the migration ends.

use redis::{Arg, Cmd, FromRedisValue, RedisError, RedisResult, Script, ServerErrorKind};

use std::time::Duration;

use crate::wire::conn::Conn;
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

/// A script's whole source as one server runs it and as a cluster does (with
/// `lua/cluster.lua` before it): each as a function library, and as a script by its SHA.
pub(crate) struct Lua {
    server: Source,
    cluster: Source,
}

/// One source of a script: as a Redis Functions library of one function of the library's
/// name (`function_library.rs`), and as a script where functions are not run.
struct Source {
    function: Function,
    script: Variant,
}

struct Function {
    name: String,
    library: String,
}

/// A script's source, and its SHA.
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
        copy_after_name(cmd, &mut eval);
        eval
    }

    /// `cmd`, a call of the script, as the `EVALSHA` of this source.
    fn evalsha(&self, cmd: &Cmd) -> Cmd {
        let mut evalsha = redis::cmd("EVALSHA");
        evalsha.arg(self.script.get_hash());
        copy_after_name(cmd, &mut evalsha);
        evalsha
    }

    /// Runs `cmd`, a call of the script, as the `EVALSHA` of this source, loading the script
    /// where its node lacks it.
    async fn run<T: FromRedisValue>(&self, conn: &mut Conn, cmd: &Cmd) -> RedisResult<T> {
        let evalsha = self.evalsha(cmd);
        match conn.query(&evalsha).await {
            // Boxed: rare, and every script's future would carry it otherwise.
            Err(err) if no_script(&err) => Box::pin(self.load_and_run(conn, &evalsha)).await,
            outcome => outcome,
        }
    }

    /// On `NOSCRIPT` it loads the script (redis-rs sends `SCRIPT LOAD` to every master it
    /// knows) and runs `evalsha` again; when that still meets `NOSCRIPT`, or the load failed,
    /// it runs the script as `EVAL`, which carries the source to the node that owns the keys
    /// and so cannot meet `NOSCRIPT`.
    async fn load_and_run<T: FromRedisValue>(
        &self,
        conn: &mut Conn,
        evalsha: &Cmd,
    ) -> RedisResult<T> {
        match self.script.load_async(conn).await {
            Ok(_) => match conn.query(evalsha).await {
                Err(err) if no_script(&err) => {
                    tracing::debug!("the script was loaded but its node still lacks it: EVAL");
                }
                outcome => return outcome,
            },
            Err(err) => tracing::debug!(error = %err, "the script could not be loaded: EVAL"),
        }
        conn.query(&self.eval(evalsha)).await
    }
}

/// The key count, the keys and the arguments of `cmd` (after `FCALL` and the function's name,
/// or `EVALSHA` and the SHA), added to `to`.
fn copy_after_name(cmd: &Cmd, to: &mut Cmd) {
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
        let cluster = Source::new(file, format!("{CLUSTER_PRELUDE}{code}"), flags);
        Self {
            server: Source::new(file, code, flags),
            cluster,
        }
    }

    /// The name a call of the script names: its function's on one server.
    pub(crate) fn name(&self) -> &str {
        &self.server.function.name
    }

    /// A call of this script with `key_count` keys (`FCALL` of its function), written into
    /// `cmd`, an empty command the caller sized for all its arguments; the caller adds the
    /// keys, then the arguments. Built as one server runs it; [`Self::run`] turns it into the
    /// cluster's call on a cluster, and into the script's `EVALSHA` where functions are not
    /// run.
    pub(crate) fn call_in(&self, mut cmd: Cmd, key_count: usize) -> Cmd {
        cmd.arg("FCALL").arg(self.name()).arg(key_count);
        cmd
    }

    /// Runs `cmd`, a call of this script ([`Self::call_in`]): on one server its function, on
    /// a cluster the function of its cluster source (see [`Source::run`]).
    pub(crate) async fn run<T: FromRedisValue>(
        &self,
        conn: &mut Conn,
        cmd: &Cmd,
    ) -> RedisResult<T> {
        if let Conn::Server(..) = conn {
            return self.server.run(conn, cmd).await;
        }
        let mut call = redis::cmd("FCALL");
        call.arg(&self.cluster.function.name);
        copy_after_name(cmd, &mut call);
        let mut pause = FIRST_MIGRATING_SLOT_PAUSE;
        for _ in 0..MIGRATING_SLOT_TRIES {
            match self.cluster.run(conn, &call).await {
                // Stopped before its first write: nothing ran, so it may run again.
                Err(err) if stopped_by_a_migrating_slot(&err) => {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(LONGEST_MIGRATING_SLOT_PAUSE);
                }
                outcome => return outcome,
            }
        }
        self.cluster.run(conn, &call).await
    }
}

impl Source {
    fn new(file: &str, code: String, flags: &[&str]) -> Self {
        let script = Variant::new(code);
        let name = library_name(file, script.script.get_hash());
        let library = function_library(&name, &script.code, flags);
        Self {
            function: Function { name, library },
            script,
        }
    }

    /// Runs `cmd`, the `FCALL` of this source's function.
    /// On "function not found" (first use, a restart without the library, `FUNCTION FLUSH`, a
    /// cluster node added empty) it loads the library and calls it again; a server or cluster
    /// that does not know or allow functions runs the script, and this connection runs
    /// scripts from then on. None of these replies ran anything, so running again is always
    /// safe.
    async fn run<T: FromRedisValue>(&self, conn: &mut Conn, cmd: &Cmd) -> RedisResult<T> {
        if conn.functions().refused() {
            return self.script.run(conn, cmd).await;
        }
        match conn.query(cmd).await {
            // Boxed: rare, and every script's future would carry it otherwise.
            Err(err) if function_not_found(&err) => Box::pin(self.load_and_call(conn, cmd)).await,
            Err(err) if refused(&err, "fcall") => {
                conn.functions().refuse();
                Box::pin(self.script.run(conn, cmd)).await
            }
            outcome => outcome,
        }
    }

    /// Loads the library (on a cluster, redis-rs sends `FUNCTION LOAD` to every master) and
    /// calls its function again. `REPLACE`: another client may have loaded it meanwhile, or
    /// some masters of a cluster have it and others not; a library's name is its source's
    /// SHA, so what it replaces is the same code.
    async fn load_and_call<T: FromRedisValue>(&self, conn: &mut Conn, cmd: &Cmd) -> RedisResult<T> {
        let mut load = redis::cmd("FUNCTION");
        load.arg("LOAD").arg("REPLACE").arg(&self.function.library);
        match conn.query::<redis::Value>(&load).await {
            // In the background: the call waits for nothing but its own load.
            Ok(_) if conn.functions().first_to_look_for_older_releases() => {
                let mut conn = conn.clone();
                tokio::spawn(async move { remove_older_releases(&mut conn).await });
            }
            Ok(_) => {}
            Err(err) => {
                if refused(&err, "function|load") {
                    conn.functions().refuse();
                }
                tracing::debug!(error = %err, "the function could not be loaded: EVALSHA");
                return self.script.run(conn, cmd).await;
            }
        }
        match conn.query(cmd).await {
            Err(err) if function_not_found(&err) => {
                tracing::debug!("the function was loaded but its node still lacks it: EVALSHA");
                self.script.run(conn, cmd).await
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
        let script = &echo.server.script;
        let eval = script.eval(&call);
        assert_eq!(written(&eval), head(b"EVAL", script.code.as_bytes()));
        let evalsha = script.evalsha(&call);
        let sha = script.script.get_hash().as_bytes();
        assert_eq!(written(&evalsha), head(b"EVALSHA", sha));
    }
}
