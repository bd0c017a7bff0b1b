//! Property tests of lock-name escaping through the public `LockKeys`: for any name, the keys
//! of a lock carry one balanced hash tag whose content is the escaped name, the escaping
//! can be undone, and two names never share a key.

use proptest::prelude::*;
use tower_redis_lock::{DEFAULT_PREFIX, ErrorKind, LockKeys, MAX_NAME_LEN};

/// Characters that escaping must handle, and the ones an escape is spelled with, mixed with
/// any `char` (multi-byte UTF-8 included).
fn tricky_char() -> impl Strategy<Value = char> {
    prop_oneof![
        3 => prop::sample::select(vec!['{', '}', '%', '7', 'B', 'D', '2', '5', ':']),
        1 => any::<char>(),
    ]
}

fn name() -> impl Strategy<Value = String> {
    prop::collection::vec(tricky_char(), 1..48).prop_map(String::from_iter)
}

/// A prefix the client accepts: anything without braces.
fn prefix() -> impl Strategy<Value = String> {
    prop::collection::vec(any::<char>(), 0..8).prop_map(|chars| {
        chars
            .into_iter()
            .filter(|c| *c != '{' && *c != '}')
            .collect()
    })
}

/// The cluster hash tag of a key as Redis computes it: between the first `{` and the first
/// `}` after it, when that is not empty.
fn hash_tag(key: &str) -> Option<&str> {
    let open = key.find('{')?;
    let close = key[open + 1..].find('}')? + open + 1;
    (close > open + 1).then(|| &key[open + 1..close])
}

/// Undoes the escaping: `%25`, `%7B` and `%7D` back to `%`, `{` and `}`; nothing else may
/// follow a `%`.
fn unescape(escaped: &str) -> String {
    let mut out = String::new();
    let mut rest = escaped;
    while let Some(at) = rest.find('%') {
        out.push_str(&rest[..at]);
        let decoded = match &rest[at..at + 3] {
            "%25" => '%',
            "%7B" => '{',
            "%7D" => '}',
            other => panic!("{other} is not an escape of this crate"),
        };
        out.push(decoded);
        rest = &rest[at + 3..];
    }
    out.push_str(rest);
    out
}

fn all_keys(keys: &LockKeys) -> [&str; 4] {
    [
        keys.hash(),
        keys.last_grant(),
        keys.queue(),
        keys.waiter_terms(),
    ]
}

proptest! {
    #[test]
    fn every_key_has_one_balanced_tag_holding_the_escaped_name(
        prefix in prefix(),
        name in name(),
    ) {
        let keys = LockKeys::new(&prefix, &name).unwrap();
        let hash = keys.hash();
        prop_assert!(hash.starts_with(&prefix));
        let tagged = &hash[prefix.len()..];
        prop_assert!(tagged.starts_with('{') && tagged.ends_with('}'), "{hash}");
        let content = &tagged[1..tagged.len() - 1];
        prop_assert!(!content.contains(['{', '}']), "{hash}");
        prop_assert_eq!(unescape(content), name.as_str());
        for (key, suffix) in all_keys(&keys).into_iter().zip(["", ":fence", ":queue", ":waiters"]) {
            prop_assert_eq!(key.matches('{').count(), 1, "{}", key);
            prop_assert_eq!(key.matches('}').count(), 1, "{}", key);
            prop_assert!(key.find('{') < key.find('}'), "{}", key);
            prop_assert_eq!(hash_tag(key), Some(content), "one cluster slot: {}", key);
            prop_assert_eq!(key.strip_suffix(suffix), Some(hash));
        }
    }

    #[test]
    fn two_names_never_share_a_key(a in name(), b in name()) {
        prop_assume!(a != b);
        let (a_keys, b_keys) = (
            LockKeys::new(DEFAULT_PREFIX, &a).unwrap(),
            LockKeys::new(DEFAULT_PREFIX, &b).unwrap(),
        );
        for a_key in all_keys(&a_keys) {
            for b_key in all_keys(&b_keys) {
                prop_assert_ne!(a_key, b_key, "{:?} and {:?}", a, b);
            }
        }
    }

    #[test]
    fn a_name_one_escape_away_from_another_is_another_lock(name in name()) {
        // The escaped spelling of a name, used as a name, must not reach the name's keys.
        let keys = LockKeys::new(DEFAULT_PREFIX, &name).unwrap();
        let content = &keys.hash()[DEFAULT_PREFIX.len() + 1..keys.hash().len() - 1];
        prop_assume!(content != name);
        let spelled = LockKeys::new(DEFAULT_PREFIX, content).unwrap();
        prop_assert_ne!(spelled.hash(), keys.hash());
    }

    #[test]
    fn the_length_limit_counts_bytes_of_multibyte_names(
        c in prop::sample::select(vec!['a', 'é', '€', '😀', '{', '%']),
        extra in 0usize..8,
    ) {
        let fits = MAX_NAME_LEN / c.len_utf8();
        let within: String = std::iter::repeat_n(c, fits).collect();
        prop_assert!(LockKeys::new(DEFAULT_PREFIX, &within).is_ok());
        let over: String = std::iter::repeat_n(c, fits + 1 + extra).collect();
        prop_assert!(over.len() > MAX_NAME_LEN);
        let err = LockKeys::new(DEFAULT_PREFIX, &over).unwrap_err();
        prop_assert_eq!(err.kind(), ErrorKind::InvalidName);
    }
}

#[test]
fn the_hash_tag_helper_reads_tags_as_redis_does() {
    assert_eq!(hash_tag("lock:{acme}:fence"), Some("acme"));
    assert_eq!(hash_tag("{}x{y}"), None);
    assert_eq!(hash_tag("a}{b}"), Some("b"));
    assert_eq!(unescape("a%7Bb%7Dc%25"), "a{b}c%");
}
