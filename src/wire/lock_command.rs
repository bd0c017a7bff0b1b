//! The EVALSHA command of a script about one lock: the lock's keys, its scope's token counter,
//! the extra keys its kind and the script take, and the wake prefix, sized before it is built.

use redis::Cmd;

use crate::keys::LockKeys;
use crate::kind::LockKind;
use crate::slots::Names;
use crate::wire::args_room::ArgsRoom;
use crate::wire::lua::Lua;

/// Which keys a script takes besides a lock's four and its scope's token counter: the epoch
/// key (with the marker an exclusive lock's acquisition checks it by), and the readers' index
/// (always last, where a read-write lock's and a semaphore's scripts find it; a semaphore
/// keeps its holders there).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ExtraKeys<'a> {
    pub(crate) epoch: Option<&'a str>,
    pub(crate) marker: Option<&'a str>,
    pub(crate) readers: bool,
}

impl<'a> ExtraKeys<'a> {
    /// The epoch key, and the readers' index when `kind` has readers (or holders with
    /// leases of their own).
    pub(crate) fn of(kind: LockKind, epoch: Option<&'a str>) -> Self {
        Self {
            epoch,
            marker: None,
            readers: !matches!(kind, LockKind::Exclusive | LockKind::Fair),
        }
    }

    /// What an acquisition of a lock of `kind` takes: the epoch key, and an exclusive lock's
    /// also the epoch's `marker`.
    pub(crate) fn acquiring(kind: LockKind, epoch_key: &'a str, marker: &'a str) -> Self {
        let mut extra = Self::of(kind, Some(epoch_key));
        if !extra.readers {
            extra.marker = Some(marker);
        }
        extra
    }
}

/// EVALSHA of `script` with a lock's four keys, the token counter of its scope (KEYS[5]), the
/// `extra` keys, and the wake prefix of its scope (ARGV[1]); the caller adds the rest of its
/// arguments, for which `tail` is room. Built as one command
/// buffer of the size it needs: a lock operation should not allocate per argument, nor grow
/// its buffers.
pub(crate) fn evalsha(
    script: &Lua,
    keys: &LockKeys,
    extra: ExtraKeys<'_>,
    names: &Names,
    tail: ArgsRoom,
) -> Cmd {
    let key_count = 5
        + usize::from(extra.epoch.is_some())
        + usize::from(extra.marker.is_some())
        + usize::from(extra.readers);
    // Named only when a script takes it: it is built on first use.
    let readers = extra.readers.then(|| keys.readers());
    let head = ArgsRoom::NONE
        .words([
            "EVALSHA",
            script.sha(),
            keys.hash(),
            keys.fence(),
            keys.queue(),
            keys.waiters(),
            names.tokens_key.as_str(),
        ])
        .words(extra.epoch)
        .words(extra.marker)
        .words(readers)
        .words([names.wake_prefix.as_str()])
        .numbers(1);
    let mut cmd = script.evalsha_in(
        Cmd::with_capacity(head.args + tail.args, head.bytes + tail.bytes),
        key_count,
    );
    cmd.arg(keys.hash())
        .arg(keys.fence())
        .arg(keys.queue())
        .arg(keys.waiters())
        .arg(&names.tokens_key);
    if let Some(epoch_key) = extra.epoch {
        cmd.arg(epoch_key);
    }
    if let Some(marker) = extra.marker {
        cmd.arg(marker);
    }
    if let Some(readers) = readers {
        cmd.arg(readers);
    }
    cmd.arg(&names.wake_prefix);
    cmd
}
