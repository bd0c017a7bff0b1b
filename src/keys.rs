//! Lock names to Redis keys: escaping, the hash tag, and the keys one lock owns.

use std::sync::{Arc, OnceLock};

use crate::error::{ErrorKind, LockError, Result};

/// The longest lock name accepted, in bytes (before escaping).
pub const MAX_NAME_LEN: usize = 512;

/// The default key prefix: the lock `acme` lives in the hash `lock:{acme}`.
pub const DEFAULT_PREFIX: &str = "lock:";

/// What follows the hash tag in a semaphore's hash: `lock:{acme}:semaphore`.
pub(crate) const SEMAPHORE_SUFFIX: &str = ":semaphore";

/// The Redis keys of one lock.
///
/// The escaped name sits inside one `{hash tag}`, so every key of a lock shares one cluster
/// slot and no name can reach another lock's keys: `{`, `}` and `%` are percent-encoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockKeys {
    /// Shared: the local key table keys its entries by it, and every acquisition would copy
    /// it there otherwise.
    hash: Arc<str>,
    last_grant: String,
    queue: String,
    waiter_terms: String,
    /// Built on first use: only read-write locks and renewals name it.
    readers: OnceLock<String>,
    /// Built on first use: only releases name it.
    release_trace: OnceLock<String>,
    /// Built on first use: only schedules name it.
    ticks: OnceLock<String>,
    /// Built on first use: only singletons and inspections name it.
    leader: OnceLock<String>,
}

impl LockKeys {
    /// The keys of the lock `name` under `prefix`.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidName`] when the name is empty or longer than [`MAX_NAME_LEN`]
    /// bytes, or the prefix contains `{` or `}`.
    pub fn new(prefix: &str, name: &str) -> Result<Self> {
        Self::with_suffix(prefix, name, "")
    }

    /// The keys of the semaphore `name` under `prefix`: its hash is
    /// `<prefix>{<name>}:semaphore`, in the slot of the lock of the same name but apart from
    /// its keys, so a lock and a semaphore of one name never meet.
    ///
    /// # Errors
    ///
    /// As [`LockKeys::new`].
    pub fn semaphore(prefix: &str, name: &str) -> Result<Self> {
        Self::with_suffix(prefix, name, SEMAPHORE_SUFFIX)
    }

    /// The keys whose hash is `<prefix>{<escaped name>}<suffix>`.
    fn with_suffix(prefix: &str, name: &str, suffix: &str) -> Result<Self> {
        validate_prefix(prefix)?;
        if name.is_empty() {
            return Err(LockError::new(
                ErrorKind::InvalidName,
                "the lock name is empty",
            ));
        }
        if name.len() > MAX_NAME_LEN {
            return Err(LockError::new(
                ErrorKind::InvalidName,
                format!(
                    "the lock name is {} bytes, over the limit of {MAX_NAME_LEN}",
                    name.len()
                ),
            ));
        }
        let mut hash = String::with_capacity(prefix.len() + name.len() + suffix.len() + 8);
        hash.push_str(prefix);
        hash.push('{');
        escape_into(name, &mut hash);
        hash.push('}');
        hash.push_str(suffix);
        Ok(Self {
            last_grant: format!("{hash}:fence"),
            queue: format!("{hash}:queue"),
            waiter_terms: format!("{hash}:waiters"),
            readers: OnceLock::new(),
            release_trace: OnceLock::new(),
            ticks: OnceLock::new(),
            leader: OnceLock::new(),
            hash: hash.into(),
        })
    }

    /// The hash holding owner ids and hold counts.
    pub fn hash(&self) -> &str {
        &self.hash
    }

    /// [`LockKeys::hash`], shared with whoever keeps it (the local key table).
    pub(crate) fn shared_hash(&self) -> &Arc<str> {
        &self.hash
    }

    /// `LAST_GRANT` of the scripts: the last token block granted from the queue (the key
    /// ends in `:fence`, as before it had this name). A waiter that finds its grant by a
    /// look, not by the message, reads its tokens there (they come from the scope's token
    /// counter).
    pub fn last_grant(&self) -> &str {
        &self.last_grant
    }

    /// The queue of waiting instances (a sorted set of owner ids by arrival).
    pub fn queue(&self) -> &str {
        &self.queue
    }

    /// `WAITER_TERMS` of the scripts: the waiters' terms (a hash, its key ending in
    /// `:waiters`: owner id to liveness, lease of a grant and token block).
    pub fn waiter_terms(&self) -> &str {
        &self.waiter_terms
    }

    /// The readers of a read-write lock by lease deadline (a sorted set: owner id to
    /// deadline in server ms), while it is read-held.
    pub fn readers(&self) -> &str {
        self.readers
            .get_or_init(|| format!("{}:readers", self.hash))
    }

    /// The owner whose holds a release freed a moment ago, on a cluster, where a release may
    /// run twice (a string that expires: see `lua/lib/release_trace.lua`).
    pub fn release_trace(&self) -> &str {
        self.release_trace
            .get_or_init(|| format!("{}:released", self.hash))
    }

    /// The last tick claimed of a schedule whose lock this is (a string, `<tick> <claim>
    /// <life>`, kept: see `lua/claim_tick.lua`).
    pub fn ticks(&self) -> &str {
        self.ticks.get_or_init(|| format!("{}:ticks", self.hash))
    }

    /// The leader of a singleton task whose lock this is, for operators (a string,
    /// `<term> <since, server ms> <owner>`, kept: see `lua/record_leader.lua`).
    pub fn leader(&self) -> &str {
        self.leader.get_or_init(|| format!("{}:leader", self.hash))
    }

    /// The trace of the guarded write `id` (unique to its client and owner), on a cluster,
    /// where a write may run twice (a string that expires: see `lua/guarded_write.lua`).
    pub(crate) fn write_trace(&self, id: &str) -> String {
        format!("{}{WRITE_TRACE}{id}", self.hash)
    }

    /// The lock's cluster hash tag, `{<escaped name>}`: a key that contains it (and no `{`
    /// before it) lands in the lock's slot, where the lock's scripts can reach it. A lock
    /// and a semaphore of one name share it.
    pub fn hash_tag(&self) -> &str {
        // The prefix holds no brace and the escaped name none either: the first '{' opens
        // the tag and the first '}' closes it.
        let open = self.hash.find('{').expect("a lock key has a hash tag");
        let close = open + self.hash[open..].find('}').expect("a closed hash tag");
        &self.hash[open..=close]
    }
}

/// What follows a lock's hash in the name of a guarded write's trace, before the write's id.
const WRITE_TRACE: &str = ":written:";

/// What follows a lock's (or a semaphore's) hash in the names of its other keys.
const COMPANION_SUFFIXES: [&str; 7] = [
    ":fence",
    ":queue",
    ":waiters",
    ":readers",
    ":released",
    ":ticks",
    ":leader",
];

/// Whether `key` is one of the library's own keys under `prefix`, which only its scripts may
/// write: a lock's or a semaphore's hash or one of their companions, or an epoch, its marker
/// or a token counter (see `scopes.rs`).
pub(crate) fn is_library_key(prefix: &str, key: &str) -> bool {
    if let Some(rest) = key.strip_prefix(prefix) {
        let scoped = |name: &str| {
            rest.strip_prefix(name)
                .is_some_and(|after| after.is_empty() || after.starts_with(':'))
        };
        if scoped("epoch") || scoped("tokens") {
            return true;
        }
    }
    // A hash itself, or what a companion's or a write trace's name starts with: a name may
    // contain `:written:` too (only braces are escaped), so each reading is tried.
    let is_hash = |hash: &str| name_of_hash(prefix, hash).is_some();
    is_hash(key)
        || COMPANION_SUFFIXES
            .iter()
            .filter_map(|suffix| key.strip_suffix(suffix))
            .any(is_hash)
        || key
            .match_indices(WRITE_TRACE)
            .any(|(at, _)| is_hash(&key[..at]))
}

/// How many bytes of a lock name logs and messages show: a name comes from a request, and a
/// 10 KB tenant must not make a 10 KB log line.
const SHOWN_NAME_LEN: usize = 64;

/// A lock name as logs, spans and error messages show it: whole up to 64 bytes, else its
/// first 64 bytes (to a character boundary) and how many more there were.
pub(crate) fn display_name(name: &str) -> DisplayName<'_> {
    DisplayName(name)
}

/// See [`display_name`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct DisplayName<'a>(&'a str);

impl std::fmt::Display for DisplayName<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = self.0;
        if name.len() <= SHOWN_NAME_LEN {
            return f.write_str(name);
        }
        let mut end = SHOWN_NAME_LEN;
        while !name.is_char_boundary(end) {
            end -= 1;
        }
        write!(f, "{}…(+{} bytes)", &name[..end], name.len() - end)
    }
}

/// Several lock names as logs show them: each [`display_name`], at most four, then how many more.
pub(crate) fn display_names(names: &[String]) -> DisplayNames<'_> {
    DisplayNames(names)
}

/// See [`display_names`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct DisplayNames<'a>(&'a [String]);

/// How many names of a list logs show.
const SHOWN_NAMES: usize = 4;

impl std::fmt::Display for DisplayNames<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("[")?;
        for (index, name) in self.0.iter().take(SHOWN_NAMES).enumerate() {
            if index > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{}", display_name(name))?;
        }
        if self.0.len() > SHOWN_NAMES {
            write!(f, ", …(+{} more)", self.0.len() - SHOWN_NAMES)?;
        }
        f.write_str("]")
    }
}

/// Rejects prefixes that would break the hash tag.
pub(crate) fn validate_prefix(prefix: &str) -> Result<()> {
    if prefix.contains(['{', '}']) {
        return Err(LockError::new(
            ErrorKind::InvalidName,
            "the key prefix must not contain '{' or '}'",
        ));
    }
    Ok(())
}

/// The SCAN `MATCH` pattern of the hashes of the locks and semaphores under `prefix` whose
/// names match the glob `pattern` (`*`, `?`, `[...]`, `\\` as Redis reads them): the prefix
/// with its glob characters escaped, the pattern escaped as names are, inside the hash tag,
/// and anything after the tag (a semaphore's [`SEMAPHORE_SUFFIX`]; [`name_of_hash`] leaves
/// out the internal keys this also matches).
pub(crate) fn hash_pattern(prefix: &str, pattern: &str) -> String {
    let mut out = String::with_capacity(prefix.len() + pattern.len() + 8);
    for c in prefix.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('{');
    escape_into(pattern, &mut out);
    out.push_str("}*");
    out
}

/// Whose hash a key under the prefix is: a lock's (`<prefix>{<name>}`) or a semaphore's
/// (`<prefix>{<name>}:semaphore`). A lock and a semaphore of one name are two things.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum HashOf {
    /// An exclusive, fair or read-write lock ([`LockKeys::new`]).
    Lock,
    /// A semaphore ([`LockKeys::semaphore`]).
    Semaphore,
}

impl HashOf {
    /// The keys of `name` under `prefix`, of this kind.
    pub(crate) fn keys(self, prefix: &str, name: &str) -> Result<LockKeys> {
        match self {
            Self::Lock => LockKeys::new(prefix, name),
            Self::Semaphore => LockKeys::semaphore(prefix, name),
        }
    }
}

/// The name of the lock or semaphore whose hash is `key` under `prefix`, and which of the two
/// it is; `None` for any other key (a grant's token block, a queue, the waiters' terms, the
/// epoch, the token counter): the reverse of the hash of [`LockKeys::new`] and
/// [`LockKeys::semaphore`].
pub(crate) fn name_of_hash(prefix: &str, key: &str) -> Option<(String, HashOf)> {
    let tagged = key.strip_prefix(prefix)?.strip_prefix('{')?;
    let (escaped, of) = match tagged.strip_suffix(SEMAPHORE_SUFFIX) {
        Some(semaphore) => (semaphore.strip_suffix('}')?, HashOf::Semaphore),
        None => (tagged.strip_suffix('}')?, HashOf::Lock),
    };
    if escaped.is_empty() || escaped.contains(['{', '}']) {
        return None;
    }
    let mut name = String::with_capacity(escaped.len());
    let mut rest = escaped;
    while let Some(at) = rest.find('%') {
        name.push_str(&rest[..at]);
        let code = rest.get(at + 1..at + 3)?;
        name.push(match code {
            "25" => '%',
            "7B" => '{',
            "7D" => '}',
            _ => return None,
        });
        rest = &rest[at + 3..];
    }
    name.push_str(rest);
    Some((name, of))
}

fn escape_into(name: &str, out: &mut String) {
    for c in name.chars() {
        match c {
            '%' => out.push_str("%25"),
            '{' => out.push_str("%7B"),
            '}' => out.push_str("%7D"),
            c => out.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(name: &str) -> LockKeys {
        LockKeys::new(DEFAULT_PREFIX, name).unwrap()
    }

    #[test]
    fn plain_names_sit_inside_one_hash_tag() {
        let k = keys("acme");
        assert_eq!(k.hash(), "lock:{acme}");
        assert_eq!(k.last_grant(), "lock:{acme}:fence");
        assert_eq!(k.queue(), "lock:{acme}:queue");
        assert_eq!(k.waiter_terms(), "lock:{acme}:waiters");
        assert_eq!(k.readers(), "lock:{acme}:readers");
    }

    #[test]
    fn braces_and_percent_are_escaped() {
        assert_eq!(keys("a{b}c%").hash(), "lock:{a%7Bb%7Dc%25}");
        // A name crafted to look like another lock's internal key stays inside its own tag.
        let crafted = keys("x}:fence");
        assert_eq!(crafted.hash(), "lock:{x%7D:fence}");
        assert_ne!(crafted.hash(), keys("x").last_grant());
    }

    #[test]
    fn escaping_keeps_distinct_names_distinct() {
        let names = ["%7B", "{", "%", "%25", "}", "%7D", "a", "a%", "a{"];
        let hashes: std::collections::HashSet<_> =
            names.iter().map(|n| keys(n).hash().to_owned()).collect();
        assert_eq!(hashes.len(), names.len());
    }

    #[test]
    fn empty_and_oversize_names_are_rejected() {
        let empty = LockKeys::new(DEFAULT_PREFIX, "").unwrap_err();
        assert_eq!(empty.kind(), ErrorKind::InvalidName);
        let long = "n".repeat(MAX_NAME_LEN + 1);
        let oversize = LockKeys::new(DEFAULT_PREFIX, &long).unwrap_err();
        assert_eq!(oversize.kind(), ErrorKind::InvalidName);
        assert!(LockKeys::new(DEFAULT_PREFIX, &long[1..]).is_ok());
    }

    #[test]
    fn long_names_are_shown_cut() {
        assert_eq!(display_name("acme").to_string(), "acme");
        let long = "t".repeat(10_000);
        assert_eq!(
            display_name(&long).to_string(),
            format!("{}…(+9936 bytes)", "t".repeat(64))
        );
        // Cut on a character boundary: 63 ASCII bytes, then a 2-byte 'é' across byte 64.
        let accented = format!("{}é{}", "a".repeat(63), "b".repeat(10));
        assert_eq!(
            display_name(&accented).to_string(),
            format!("{}…(+12 bytes)", "a".repeat(63))
        );
        let names: Vec<String> = (0..6).map(|i| format!("k{i}")).collect();
        assert_eq!(
            display_names(&names).to_string(),
            "[k0, k1, k2, k3, …(+2 more)]"
        );
        assert_eq!(display_names(&names[..1]).to_string(), "[k0]");
    }

    #[test]
    fn hash_keys_map_back_to_their_names() {
        for name in ["acme", "a{b}c%", "x}:fence", "%7B", "t\u{e9}nant:*", "%"] {
            assert_eq!(
                name_of_hash(DEFAULT_PREFIX, keys(name).hash()),
                Some((name.to_owned(), HashOf::Lock))
            );
        }
        for other in [
            "lock:{acme}:fence",
            "lock:{acme}:queue",
            "lock:{acme}:waiters",
            "lock:{acme}:readers",
            "lock:epoch",
            "lock:epoch:{a}",
            "lock:tokens",
            "lock:tokens:{a}",
            "lock:{}",
            "lock:{a%7}",
            "lock:{a%41}",
            "other:{acme}",
            "lock:{a{b}",
        ] {
            assert_eq!(name_of_hash(DEFAULT_PREFIX, other), None, "{other}");
        }
    }

    #[test]
    fn semaphore_hashes_map_back_to_their_names_and_their_internal_keys_to_nothing() {
        for name in ["pool", "a{b}c%", "x}:semaphore", "x:semaphore", "%7D"] {
            let sem = LockKeys::semaphore(DEFAULT_PREFIX, name).unwrap();
            assert_eq!(
                name_of_hash(DEFAULT_PREFIX, sem.hash()),
                Some((name.to_owned(), HashOf::Semaphore)),
                "{}",
                sem.hash()
            );
            assert_eq!(HashOf::Semaphore.keys(DEFAULT_PREFIX, name).unwrap(), sem);
            for internal in [
                sem.last_grant(),
                sem.queue(),
                sem.waiter_terms(),
                sem.readers(),
            ] {
                assert_eq!(name_of_hash(DEFAULT_PREFIX, internal), None, "{internal}");
            }
        }
        // A lock whose name ends in ':semaphore' is still that lock, not a semaphore.
        assert_eq!(
            name_of_hash(DEFAULT_PREFIX, "lock:{x:semaphore}"),
            Some(("x:semaphore".to_owned(), HashOf::Lock))
        );
        for other in [
            "lock:{}:semaphore",
            "lock:{pool}:semaphore:waiters",
            "lock:{pool}:semaphore:queue",
            "lock:{pool}:semaphorex",
            "lock:{pool}:sem",
            "lock:{pool}x:semaphore",
            "lock:{a{b}:semaphore",
            "other:{pool}:semaphore",
        ] {
            assert_eq!(name_of_hash(DEFAULT_PREFIX, other), None, "{other}");
        }
    }

    #[test]
    fn a_name_pattern_matches_only_hashes_under_the_prefix() {
        assert_eq!(hash_pattern("lock:", "*"), "lock:{*}*");
        assert_eq!(
            hash_pattern("lock:", "ten{ant}%*"),
            "lock:{ten%7Bant%7D%25*}*"
        );
        assert_eq!(hash_pattern("a*b?[c]\\:", "x"), "a\\*b\\?\\[c\\]\\\\:{x}*");
    }

    #[test]
    fn the_hash_tag_is_the_escaped_name_in_braces() {
        assert_eq!(keys("acme").hash_tag(), "{acme}");
        assert_eq!(keys("a{b}c%").hash_tag(), "{a%7Bb%7Dc%25}");
        let semaphore = LockKeys::semaphore("app:", "pool").unwrap();
        assert_eq!(semaphore.hash_tag(), "{pool}");
        assert_eq!(LockKeys::new("", "x").unwrap().hash_tag(), "{x}");
    }

    #[test]
    fn the_librarys_own_keys_are_told_from_a_users_keys_beside_them() {
        let lock = keys("acme");
        let semaphore = LockKeys::semaphore(DEFAULT_PREFIX, "acme").unwrap();
        let written = lock.write_trace("instance:1:2");
        // A name that holds the trace's infix itself.
        let odd = keys("a:written:b");
        let odd_written = odd.write_trace("instance:1:2");
        for own in [
            lock.hash(),
            lock.last_grant(),
            lock.queue(),
            lock.waiter_terms(),
            lock.readers(),
            lock.release_trace(),
            &written,
            odd.hash(),
            &odd_written,
            semaphore.hash(),
            semaphore.queue(),
            "lock:epoch",
            "lock:epoch:{a}",
            "lock:epoch:{a}:7:30000",
            "lock:tokens",
            "lock:tokens:{a}",
        ] {
            assert!(is_library_key(DEFAULT_PREFIX, own), "{own}");
        }
        for users in [
            "balance:{acme}",
            "lock:{acme}:balance",
            "lock:{acme}:fence:mine",
            "lock:{acme:written:x",
            "lock:{acme}x:written:y",
            "lock:epochs",
            "other:{acme}",
            "{acme}:x",
        ] {
            assert!(!is_library_key(DEFAULT_PREFIX, users), "{users}");
        }
        // With no prefix, the lock's keys are still told from a key that carries its tag.
        assert!(is_library_key("", "{acme}:queue"));
        assert!(!is_library_key("", "{acme}:balance"));
    }

    #[test]
    fn prefixes_with_braces_are_rejected() {
        let err = LockKeys::new("bad{", "x").unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidName);
    }
}
