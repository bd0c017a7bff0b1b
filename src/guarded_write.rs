//! Writes only a holder can make: a set of Redis writes that one script applies only while
//! a guard still holds its lock ([`LockGuard::write_if_held`](crate::LockGuard::write_if_held)).

use std::time::Duration;

use crate::engine::hold::Holder;
use crate::engine::replicas;
use crate::error::{ErrorKind, LockError, Result};
use crate::keys::{display_name, is_library_key};
use crate::lock_kind::LockKind;
use crate::scopes::{Placement, slot_of};
use crate::wire::scripts::{self, WriteCommand, WriteTrace};

/// The most arguments one command of a guarded write may take after its key: Lua passes them
/// to Redis on its stack, which holds about 8,000 values. Split a longer one (an `HSET` of
/// many fields) into several commands.
pub const MAX_WRITE_ARGS: usize = 7_000;

/// Redis writes to apply together, only while a guard holds its lock: see
/// [`LockGuard::write_if_held`](crate::LockGuard::write_if_held).
///
/// Each command's first argument is its only key. On a Redis Cluster every key must be in the
/// lock's slot: put the lock's [hash tag](crate::LockGuard::hash_tag) in it, as in
/// `format!("balance:{}", guard.hash_tag())`; on one server any key may be written, but keys
/// with the tag keep working when the data moves to a cluster.
///
/// ```no_run
/// # async fn demo(guard: tower_redis_lock::LockGuard) -> tower_redis_lock::Result<()> {
/// use std::time::Duration;
/// use tower_redis_lock::GuardedWrites;
///
/// let tag = guard.hash_tag();
/// let writes = GuardedWrites::new()
///     .set(&format!("balance:{tag}"), "120")
///     .set_with_ttl(&format!("receipt:{tag}"), "ok", Duration::from_secs(3600))
///     .command("LPUSH", &format!("history:{tag}"), ["+20"]);
/// if !guard.write_if_held(&writes).await? {
///     // The lock was lost: another holder may have written since; nothing was written.
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Default)]
#[must_use]
pub struct GuardedWrites {
    commands: Vec<WriteCommand>,
}

impl GuardedWrites {
    /// No writes yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Any write command whose first argument is its key, and which names no other key:
    /// `name key args…` (`"LPUSH", key, ["a", "b"]`).
    pub fn command<A: Into<Vec<u8>>>(
        mut self,
        name: &str,
        key: &str,
        args: impl IntoIterator<Item = A>,
    ) -> Self {
        self.commands.push(WriteCommand {
            name: name.to_owned(),
            key: key.to_owned(),
            args: args.into_iter().map(Into::into).collect(),
        });
        self
    }

    /// `SET key value`.
    pub fn set(self, key: &str, value: impl Into<Vec<u8>>) -> Self {
        self.command("SET", key, [value])
    }

    /// `SET key value PX ms`: the value expires after `ttl`, rounded up to whole
    /// milliseconds (at least one).
    pub fn set_with_ttl(self, key: &str, value: impl Into<Vec<u8>>, ttl: Duration) -> Self {
        let millis = millis_at_least_one(ttl);
        self.command(
            "SET",
            key,
            [value.into(), b"PX".to_vec(), millis.into_bytes()],
        )
    }

    /// `DEL key`.
    pub fn del(self, key: &str) -> Self {
        self.command("DEL", key, std::iter::empty::<Vec<u8>>())
    }

    /// `HSET key field value…`; no fields add no command (Redis refuses an `HSET` without).
    pub fn hset<F: Into<Vec<u8>>, V: Into<Vec<u8>>>(
        self,
        key: &str,
        fields: impl IntoIterator<Item = (F, V)>,
    ) -> Self {
        let args: Vec<Vec<u8>> = fields
            .into_iter()
            .flat_map(|(field, value)| [field.into(), value.into()])
            .collect();
        if args.is_empty() {
            return self;
        }
        self.command("HSET", key, args)
    }

    /// `PEXPIRE key ms`: the key expires after `ttl`, rounded up to whole milliseconds (at
    /// least one).
    pub fn pexpire(self, key: &str, ttl: Duration) -> Self {
        self.command("PEXPIRE", key, [millis_at_least_one(ttl)])
    }

    /// These writes, then `more`.
    pub(crate) fn then(mut self, more: GuardedWrites) -> Self {
        self.commands.extend(more.commands);
        self
    }

    /// How many commands there are.
    pub fn len(&self) -> usize {
        self.commands.len()
    }

    /// Whether there are none: applying them then only checks the lock.
    pub fn is_empty(&self) -> bool {
        self.commands.is_empty()
    }
}

/// `ttl` in whole milliseconds, rounded up, at least one (Redis refuses an expiry of 0).
fn millis_at_least_one(ttl: Duration) -> String {
    let millis = ttl.as_nanos().div_ceil(1_000_000).max(1);
    u64::try_from(millis).unwrap_or(u64::MAX).to_string()
}

/// Applies `writes` for `holder` in one script only while it holds the lock to write (see
/// `LockGuard::write_if_held`).
pub(crate) async fn write_if_held(holder: &Holder, writes: &GuardedWrites) -> Result<bool> {
    let acquisition = &holder.acquisition;
    let shared = &acquisition.shared;
    check_kind(acquisition.terms.kind)?;
    shared.ensure_running()?;
    check_keys(
        &shared.config.prefix,
        &shared.placement,
        acquisition.keys.hash(),
        writes,
    )?;
    // The holder was told already: no need to ask Redis.
    if acquisition.lease_state.is_lost() {
        return Ok(false);
    }
    let keys = &acquisition.keys;
    // Where a script may run twice, a key of this write alone says it ran (one server
    // names none, and is given the lock's own, which it never reads).
    let trace_ms = shared.scope_keys(keys).trace_ms;
    let trace_key = (trace_ms > 0)
        .then(|| keys.write_trace(&format!("{}:{}", acquisition.owner, shared.new_holder_id())));
    let trace = WriteTrace {
        key: trace_key.as_deref().unwrap_or(keys.hash()),
        ms: trace_ms,
    };
    let applied = shared
        .connections
        .run(keys.hash(), |mut conn| async move {
            scripts::write_if_held(&mut conn, keys, &acquisition.owner, &writes.commands, trace)
                .await
        })
        .await?;
    if !applied {
        tracing::debug!(
            lock = %display_name(&acquisition.name),
            "a guarded write was refused: the lock is no longer held by this guard"
        );
    } else if !writes.is_empty() {
        replicas::acknowledged_what(shared, keys, "guarded write").await?;
    }
    Ok(applied)
}

/// Refuses the guards of the kinds whose holders share the lock with others (a reader, a
/// semaphore's permit, whichever way it was taken): holding it guards no write.
fn check_kind(kind: LockKind) -> Result<()> {
    match kind {
        LockKind::Exclusive | LockKind::Fair | LockKind::Write => Ok(()),
        LockKind::Read | LockKind::Semaphore { .. } => Err(LockError::new(
            ErrorKind::UnsupportedGuard,
            "only the guard of an exclusive or fair lock, or of a read-write lock's write side, \
             can write under its lock",
        )),
    }
}

/// Refuses, before anything is sent, a command with too many arguments, a key of the
/// library's own and, on a cluster, a key outside the slot of the lock whose hash is `hash`.
fn check_keys(
    prefix: &str,
    placement: &Placement,
    hash: &str,
    writes: &GuardedWrites,
) -> Result<()> {
    let lock_slot = matches!(placement, Placement::Cluster { .. }).then(|| slot_of(hash));
    for command in &writes.commands {
        let key = display_name(&command.key);
        if command.args.len() > MAX_WRITE_ARGS {
            return Err(LockError::new(
                ErrorKind::InvalidConfig,
                format!(
                    "{} of '{key}' takes {} arguments, over the limit of {MAX_WRITE_ARGS}",
                    command.name,
                    command.args.len()
                ),
            ));
        }
        if is_library_key(prefix, &command.key) {
            return Err(LockError::new(
                ErrorKind::InvalidName,
                format!("'{key}' is one of the lock library's own keys"),
            ));
        }
        if let Some(lock_slot) = lock_slot
            && slot_of(&command.key) != lock_slot
        {
            return Err(LockError::new(
                ErrorKind::WrongSlot,
                format!(
                    "'{key}' is in slot {}, not in the lock's slot {lock_slot}: put the lock's \
                     hash tag in it",
                    slot_of(&command.key)
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn commands(writes: &GuardedWrites) -> Vec<(String, String, Vec<String>)> {
        writes
            .commands
            .iter()
            .map(|command| {
                let args = command
                    .args
                    .iter()
                    .map(|arg| String::from_utf8_lossy(arg).into_owned())
                    .collect();
                (command.name.clone(), command.key.clone(), args)
            })
            .collect()
    }

    #[test]
    fn each_helper_writes_its_command_with_the_key_first() {
        let writes = GuardedWrites::new()
            .set("a", "1")
            .set_with_ttl("b", b"2".to_vec(), Duration::from_micros(1500))
            .del("c")
            .hset("d", [("f", "v"), ("g", "w")])
            .hset("e", Vec::<(String, String)>::new())
            .pexpire("f", Duration::ZERO)
            .command("LPUSH", "g", ["x", "y"]);
        let owned = |args: &[&str]| args.iter().map(|arg| (*arg).to_owned()).collect();
        assert_eq!(
            commands(&writes),
            [
                ("SET".into(), "a".into(), owned(&["1"])),
                ("SET".into(), "b".into(), owned(&["2", "PX", "2"])),
                ("DEL".into(), "c".into(), owned(&[])),
                ("HSET".into(), "d".into(), owned(&["f", "v", "g", "w"])),
                ("PEXPIRE".into(), "f".into(), owned(&["1"])),
                ("LPUSH".into(), "g".into(), owned(&["x", "y"])),
            ]
        );
        assert_eq!(writes.len(), 6);
        assert!(!writes.is_empty() && GuardedWrites::new().is_empty());
    }

    #[test]
    fn only_the_kinds_held_by_one_owner_write() {
        for kind in [LockKind::Exclusive, LockKind::Fair, LockKind::Write] {
            assert!(check_kind(kind).is_ok(), "{kind:?}");
        }
        // A permit is a semaphore's guard, as the layer's limit per key holds it.
        let permit = LockKind::Semaphore {
            permits: 2,
            take: 1,
        };
        for kind in [LockKind::Read, permit] {
            let err = check_kind(kind).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::UnsupportedGuard, "{kind:?}");
        }
    }

    #[test]
    fn keys_are_checked_against_the_library_and_the_locks_slot() {
        let hash = "lock:{acme}";
        let cluster = Placement::cluster("lock:", std::time::Duration::from_secs(1));
        let single = Placement::single("lock:");
        let tagged = GuardedWrites::new().set("balance:{acme}", "1");
        assert!(check_keys("lock:", &cluster, hash, &tagged).is_ok());
        let elsewhere = tagged.clone().set("balance:{other}", "1");
        let err = check_keys("lock:", &cluster, hash, &elsewhere).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::WrongSlot);
        assert!(check_keys("lock:", &single, hash, &elsewhere).is_ok());
        for own in ["lock:{acme}", "lock:{acme}:queue", "lock:epoch"] {
            let writes = GuardedWrites::new().del(own);
            let err = check_keys("lock:", &single, hash, &writes).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidName, "{own}");
        }
        let long = GuardedWrites::new().command("RPUSH", "l", vec!["x"; MAX_WRITE_ARGS + 1]);
        let err = check_keys("lock:", &single, hash, &long).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidConfig);
    }
}
