//! What a lock keeps in Redis besides its keys: the fields of its hash and the formats of the
//! values its scripts write, named once. The scripts' Lua reads the names as the script
//! descriptions bind them ([`LUA_BINDINGS`], in the scripts that read them), and the Rust side that reads Redis (the lock
//! handle's look, `inspect`, the tests and tools) parses the values here, so the two sides of
//! a format cannot drift apart. Public for this crate's tests and tools only: hidden from the
//! docs, and not part of the API that semver covers.
//!
//! The lock hash (`LOCK`):
//! - `<owner>`: an owner's hold count, `<holds>`; a reader's or a semaphore holder's, then its
//!   own lease deadline, `<holds> <deadline ms>` (server time);
//! - `<owner>:r`: the read holds a writer took within its own write lock, counted with it;
//! - `mode`: a read-write lock's `read` or `write` (absent for a plain lock);
//! - `permits` and `used`: a semaphore's counts, which are nobody's;
//! - `queued` and `queued.2`: a plain lock's sign that someone may wait (see `lua/lib/queue.lua`).
//!
//! Owner ids always hold a ':', so no owner's field can be one of the named ones.
//!
//! A waiter's terms (`WAITER_TERMS`, owner id → terms): `<alive until ms> <grant lease ms>
//! <token block>`, then what the kind of lock adds: a read-write lock's role (`r` or `w`), a
//! semaphore's permits wanted.
//!
//! The last grant (`LAST_GRANT`): `<last token of the block> <first token> <owner>`.

/// A read-write lock's mode field.
pub const MODE: &str = "mode";
/// The mode of a read-held lock.
pub const MODE_READ: &str = "read";
/// The mode of a write-held lock.
pub const MODE_WRITE: &str = "write";
/// A semaphore's permit count.
pub const PERMITS: &str = "permits";
/// How many of a semaphore's permits its holders hold.
pub const USED: &str = "used";
/// The first field of a plain lock's sign that someone may wait.
pub const QUEUED: &str = "queued";
/// The second field of that sign (a release's `HDEL` counts both).
pub const QUEUED_2: &str = "queued.2";
/// The suffix of a writer's field for its reads within its write lock.
pub const READS_WITHIN: &str = ":r";
/// A read-write lock's waiter that wants to read.
pub const ROLE_READ: &str = "r";
/// A read-write lock's waiter that wants to write.
pub const ROLE_WRITE: &str = "w";

/// The names every script's Lua reads these by, and their values.
pub const LUA_BINDINGS: &[(&str, &str)] = &[
    ("MODE_FIELD", MODE),
    ("MODE_READ", MODE_READ),
    ("MODE_WRITE", MODE_WRITE),
    ("PERMITS_FIELD", PERMITS),
    ("USED_FIELD", USED),
    ("QUEUED_FIELD", QUEUED),
    ("QUEUED_SECOND_FIELD", QUEUED_2),
    ("READS_WITHIN_SUFFIX", READS_WITHIN),
    ("ROLE_READ", ROLE_READ),
    ("ROLE_WRITE", ROLE_WRITE),
];

/// What one field of a lock hash is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HashField<'a> {
    /// A read-write lock's mode.
    Mode,
    /// A semaphore's counts, or a plain lock's sign that someone may wait: nobody's.
    Nobodys,
    /// An owner's holds; `reads_within` for a writer's reads within its write lock.
    Owner {
        /// The owner id.
        owner: &'a str,
        /// Whether the field counts a writer's reads within its lock.
        reads_within: bool,
    },
}

/// What the field `name` of a lock hash is.
pub fn hash_field(name: &str) -> HashField<'_> {
    match name {
        MODE => HashField::Mode,
        PERMITS | USED | QUEUED | QUEUED_2 => HashField::Nobodys,
        _ => match name.strip_suffix(READS_WITHIN) {
            Some(owner) => HashField::Owner {
                owner,
                reads_within: true,
            },
            None => HashField::Owner {
                owner: name,
                reads_within: false,
            },
        },
    }
}

/// An owner's field value: its hold count (a semaphore holder's permits), and its own lease
/// deadline (server ms) when it has one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Holds {
    /// Its hold count, or a semaphore holder's permits.
    pub holds: u64,
    /// Its own lease deadline: a reader's or a semaphore holder's.
    pub deadline_ms: Option<u64>,
}

/// An owner's field `value`; `None` when it is not one.
pub fn holds(value: &str) -> Option<Holds> {
    let mut parts = value.split(' ');
    let holds = parts.next()?.parse().ok()?;
    let deadline_ms = parts.next().and_then(|deadline| deadline.parse().ok());
    Some(Holds { holds, deadline_ms })
}

/// A waiter's terms, as far as this process reads them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WaiterTerms<'a> {
    /// Until when (server ms) its place lives without a refresh.
    pub alive_until_ms: Option<u64>,
    /// What its kind of lock adds after the shared terms.
    added: Option<&'a str>,
}

impl<'a> WaiterTerms<'a> {
    /// A read-write lock's waiter's role: [`ROLE_READ`] or [`ROLE_WRITE`].
    pub fn role(&self) -> Option<&'a str> {
        self.added
    }

    /// A semaphore's waiter's permits wanted; 1 when missing.
    pub fn take(&self) -> u32 {
        self.added.and_then(|take| take.parse().ok()).unwrap_or(1)
    }
}

/// The waiter terms `text`.
pub fn waiter_terms(text: &str) -> WaiterTerms<'_> {
    let mut words = text.splitn(4, ' ');
    let alive_until_ms = words.next().and_then(|until| until.parse().ok());
    WaiterTerms {
        alive_until_ms,
        added: words.nth(2),
    }
}

/// The last token of the block last granted from the queue, from `LAST_GRANT`'s value.
pub fn last_granted_token(value: &str) -> Option<u64> {
    value.split(' ').next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fields_of_a_lock_hash_are_told_apart_by_their_names() {
        assert_eq!(hash_field("mode"), HashField::Mode);
        for nobodys in ["permits", "used", "queued", "queued.2"] {
            assert_eq!(hash_field(nobodys), HashField::Nobodys);
        }
        assert_eq!(
            hash_field("a:1"),
            HashField::Owner {
                owner: "a:1",
                reads_within: false
            }
        );
        assert_eq!(
            hash_field("a:1:r"),
            HashField::Owner {
                owner: "a:1",
                reads_within: true
            }
        );
    }

    #[test]
    fn values_parse_as_the_scripts_write_them() {
        assert_eq!(
            holds("2 1700000000000"),
            Some(Holds {
                holds: 2,
                deadline_ms: Some(1_700_000_000_000)
            })
        );
        assert_eq!(
            holds("3"),
            Some(Holds {
                holds: 3,
                deadline_ms: None
            })
        );
        assert_eq!(holds("x"), None);

        let reader = waiter_terms("1700000000000 30000 17 r");
        assert_eq!(reader.alive_until_ms, Some(1_700_000_000_000));
        assert_eq!(reader.role(), Some(ROLE_READ));
        let semaphore = waiter_terms("1700000000000 30000 1 2");
        assert_eq!(semaphore.take(), 2);
        let plain = waiter_terms("1700000000000 30000 17");
        assert_eq!((plain.role(), plain.take()), (None, 1));

        assert_eq!(last_granted_token("120 104 a:1"), Some(120));
        assert_eq!(last_granted_token(""), None);
    }
}
