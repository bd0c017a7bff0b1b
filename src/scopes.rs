//! Where a lock's companions live: the epoch key its scripts check, the token counter its
//! fencing tokens come from, and the channel its grants are announced on.
//!
//! On one Redis server, one epoch key, one token counter and one wake channel per instance
//! serve every lock. On a cluster a script may touch only keys of its own slot, and SPUBLISH
//! only to a channel of its own slot, so each exists once per slot: `<prefix>epoch:{<tag>}`,
//! `<prefix>tokens:{<tag>}` and `<prefix>wake:{<tag>}:<instance id>`, where `<tag>` is a short
//! string that hashes to that slot. The token counter moves with its slot, so a lock's tokens
//! keep growing when the slot migrates. An instance thus listens on at most one channel per
//! slot it waits in, however many locks it waits for, and a Redis that loses a slot's data (a
//! failover to a replica that had not received it) is noticed per slot.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::keys::LockKeys;

/// The key of the witness of a server's promotion, with a slot's hash tag after `:` on a
/// cluster: outside every prefix, so that every prefix has it (`lua/lib/promotion.lua`
/// names it alike).
pub(crate) const PROMOTION_WITNESS: &str = "tower-redis-lock:promoted";

/// Slots of a Redis Cluster.
pub(crate) const SLOTS: u16 = 16384;

/// The slot of a key, as the cluster computes it: CRC16 of its hash tag (every lock key has
/// one: the escaped name between `{` and `}`), or of the whole key.
pub(crate) fn slot_of(key: &str) -> u16 {
    let hashed = key
        .find('{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            rest.find('}')
                .filter(|close| *close > 0)
                .map(|close| &rest[..close])
        })
        .unwrap_or(key);
    crc16::State::<crc16::XMODEM>::calculate(hashed.as_bytes()) % SLOTS
}

/// A hash tag of each slot: of the strings of `[a-z0-9]` in order of length, the first to
/// hash to it. Computed once, in about a millisecond: every slot is hit by a string of at
/// most four characters.
fn slot_tag(slot: u16) -> &'static str {
    static TAGS: OnceLock<Vec<String>> = OnceLock::new();
    let tags = TAGS.get_or_init(|| {
        const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
        let mut tags = vec![String::new(); usize::from(SLOTS)];
        let mut missing = usize::from(SLOTS);
        let mut tag = Vec::new();
        'lengths: for length in 1..=8u32 {
            tag.resize(length as usize, 0);
            for mut index in 0..ALPHABET.len().pow(length) {
                for byte in tag.iter_mut() {
                    *byte = ALPHABET[index % ALPHABET.len()];
                    index /= ALPHABET.len();
                }
                let text = std::str::from_utf8(&tag).expect("ASCII");
                let slot = usize::from(slot_of(text));
                if tags[slot].is_empty() {
                    tags[slot] = text.to_owned();
                    missing -= 1;
                    if missing == 0 {
                        break 'lengths;
                    }
                }
            }
        }
        tags
    });
    &tags[usize::from(slot)]
}

/// Which epoch and wake channel a script about a lock uses.
#[derive(Debug)]
pub(crate) enum Placement {
    /// One Redis server: one of each for every lock.
    Single(Arc<ScopeKeys>),
    /// A cluster: one of each per slot, named when first used.
    Cluster {
        prefix: String,
        scope_keys: Box<[OnceLock<Arc<ScopeKeys>>]>,
        /// See [`ScopeKeys::trace_ms`].
        trace_ms: u64,
    },
}

/// The epoch key, the token counter and the wake channel prefix (the instance id follows it)
/// of a scope.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct ScopeKeys {
    /// The scope: the slot on a cluster, 0 on one server.
    pub(crate) scope: u16,
    pub(crate) epoch_key: String,
    /// The counter every fencing token of the scope is taken from (see `lua/lib/tokens.lua`).
    pub(crate) tokens_key: String,
    pub(crate) wake_prefix: String,
    /// The witness of the server's promotion, which every prefix shares (see
    /// `lua/lib/promotion.lua`).
    pub(crate) promotion_witness: String,
    /// How long a script that must not take effect twice (a release, a guarded write)
    /// leaves its trace, in ms (see `lua/lib/release_trace.lua`): 0 on one server, whose
    /// connections never send a script twice.
    pub(crate) trace_ms: u64,
}

impl Placement {
    /// The placement of a single server's locks under `prefix`.
    pub(crate) fn single(prefix: &str) -> Self {
        Self::Single(Arc::new(ScopeKeys {
            scope: 0,
            epoch_key: format!("{prefix}epoch"),
            tokens_key: format!("{prefix}tokens"),
            promotion_witness: PROMOTION_WITNESS.to_owned(),
            wake_prefix: format!("{prefix}wake:"),
            trace_ms: 0,
        }))
    }

    /// The placement of a cluster's locks under `prefix`, for a client whose commands time
    /// out after `command_timeout`. redis-rs's cluster client sends a command again on a
    /// fresh connection when the first dropped before its reply, until the caller stops
    /// waiting: a script's trace outlasts that twice.
    pub(crate) fn cluster(prefix: &str, command_timeout: Duration) -> Self {
        Self::Cluster {
            prefix: prefix.to_owned(),
            scope_keys: (0..SLOTS).map(|_| OnceLock::new()).collect(),
            trace_ms: u64::try_from(command_timeout.as_millis() * 2).unwrap_or(u64::MAX),
        }
    }

    /// Whether a script may run twice for one send: redis-rs's cluster client sends it again
    /// after a dropped connection; one server's connections never do.
    pub(crate) fn may_send_again(&self) -> bool {
        matches!(self, Self::Cluster { .. })
    }

    /// The scope of the lock with `keys`: its slot on a cluster, 0 on one server.
    pub(crate) fn scope_of(&self, keys: &LockKeys) -> u16 {
        match self {
            Self::Single(_) => 0,
            Self::Cluster { .. } => slot_of(keys.hash()),
        }
    }

    /// The keys of `scope`.
    pub(crate) fn scope_keys(&self, scope: u16) -> &Arc<ScopeKeys> {
        match self {
            Self::Single(scope_keys) => scope_keys,
            Self::Cluster {
                prefix,
                scope_keys,
                trace_ms,
            } => scope_keys[usize::from(scope % SLOTS)].get_or_init(|| {
                let tag = slot_tag(scope);
                Arc::new(ScopeKeys {
                    scope,
                    epoch_key: format!("{prefix}epoch:{{{tag}}}"),
                    tokens_key: format!("{prefix}tokens:{{{tag}}}"),
                    wake_prefix: format!("{prefix}wake:{{{tag}}}:"),
                    promotion_witness: format!("{PROMOTION_WITNESS}:{{{tag}}}"),
                    trace_ms: *trace_ms,
                })
            }),
        }
    }

    /// The scope keys of the lock with `keys`.
    pub(crate) fn of(&self, keys: &LockKeys) -> &Arc<ScopeKeys> {
        self.scope_keys(self.scope_of(keys))
    }

    /// Every scope there is: one on a server, every slot on a cluster.
    pub(crate) fn scopes(&self) -> std::ops::Range<u16> {
        match self {
            Self::Single(_) => 0..1,
            Self::Cluster { .. } => 0..SLOTS,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_the_clusters() {
        // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(slot_of("123456789"), 0x31C3);
        assert_eq!(slot_of("foo"), 12182);
        assert_eq!(slot_of("{user1000}.following"), slot_of("user1000"));
        assert_ne!(slot_of("foo{}{bar}"), slot_of("bar"));
    }

    #[test]
    fn every_slot_has_a_tag_of_its_own() {
        for slot in 0..SLOTS {
            let tag = slot_tag(slot);
            assert!(!tag.is_empty() && tag.len() <= 4, "slot {slot}: {tag:?}");
            assert_eq!(slot_of(tag), slot);
        }
    }

    #[test]
    fn a_locks_companions_share_its_slot() {
        let placement = Placement::cluster("lock:", Duration::from_secs(1));
        for name in ["account-7", "tenant/{weird}", "ü", "x"] {
            let keys = LockKeys::new("lock:", name).unwrap();
            let scope_keys = placement.of(&keys);
            let slot = slot_of(keys.hash());
            assert_eq!(scope_keys.scope, slot);
            assert_eq!(slot_of(&scope_keys.epoch_key), slot);
            assert_eq!(slot_of(&scope_keys.tokens_key), slot);
            assert_eq!(slot_of(&format!("{}abc123", scope_keys.wake_prefix)), slot);
            assert_eq!(slot_of(&scope_keys.promotion_witness), slot);
        }
        let single = Placement::single("lock:");
        let keys = LockKeys::new("lock:", "account-7").unwrap();
        assert_eq!(single.of(&keys).epoch_key, "lock:epoch");
        assert_eq!(single.of(&keys).tokens_key, "lock:tokens");
        assert_eq!(single.of(&keys).wake_prefix, "lock:wake:");
        assert_eq!(
            single.of(&keys).promotion_witness,
            "tower-redis-lock:promoted"
        );
    }
}
