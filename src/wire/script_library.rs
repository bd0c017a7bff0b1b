//! The Lua libraries a script includes, cut to the functions it calls. Lua creates every
//! `local function` of a source each time a script runs past it, at about 400 to 1,100 Redis
//! instructions each, so a library brings into a script only the functions that the script's
//! own code calls, directly or through another of them. The two scripts of a hand-over
//! between instances create 29 functions instead of 55 (the acquire's epoch check makes its
//! own only when it runs), about 8 % of that hand-over's Redis work (docs/benchmarks.md, "A
//! hand-over's work").

use std::collections::BTreeSet;

/// The libraries a script may include, by name.
pub(crate) const LIBRARIES: &[(&str, &str)] = &[
    ("clock", include_str!("lua/lib/clock.lua")),
    ("saves", include_str!("lua/lib/saves.lua")),
    ("epoch_look", include_str!("lua/lib/epoch_look.lua")),
    ("counter", include_str!("lua/lib/counter.lua")),
    ("tokens", include_str!("lua/lib/tokens.lua")),
    ("life", include_str!("lua/lib/life.lua")),
    ("promotion", include_str!("lua/lib/promotion.lua")),
    ("epoch", include_str!("lua/lib/epoch.lua")),
    ("queue_expiry", include_str!("lua/lib/queue_expiry.lua")),
    ("queue", include_str!("lua/lib/queue.lua")),
    ("rw", include_str!("lua/lib/rw.lua")),
    ("semaphore", include_str!("lua/lib/semaphore.lua")),
    ("release_trace", include_str!("lua/lib/release_trace.lua")),
    ("slow_terms", include_str!("lua/lib/slow_terms.lua")),
];

/// How an include of a library is written in a script's file.
pub(crate) const INCLUDE: &str = "--#include ";

/// How a library's function starts: at the start of a line, and it ends at a line `end`.
const FUNCTION_START: &str = "local function ";

/// The code of the library `name`.
pub(crate) fn library(name: &str) -> &'static str {
    LIBRARIES
        .iter()
        .find_map(|(library, code)| (*library == name).then_some(*code))
        .unwrap_or_else(|| panic!("no Lua library named '{name}'"))
}

/// One identifier of Lua code, with whether it is the name a `local function` defines.
#[derive(Debug)]
pub(crate) struct Word<'a> {
    pub(crate) name: &'a str,
    /// Where it starts in the code, in bytes.
    pub(crate) start: usize,
    /// Read by the check of each script's Lua, which finds a function used before it is made.
    #[cfg_attr(not(test), expect(dead_code, reason = "read by the scripts' check"))]
    pub(crate) defines_function: bool,
}

/// The identifiers of `code` in order, leaving out comments, strings and fields (`a.b`,
/// `a:b`: only `a` counts).
pub(crate) fn words(code: &str) -> Vec<Word<'_>> {
    let bytes = code.as_bytes();
    let mut words = Vec::new();
    let mut at = 0;
    let mut after_local_function = false;
    while at < bytes.len() {
        let byte = bytes[at];
        if code[at..].starts_with("--") {
            at += code[at..].find('\n').unwrap_or(code.len() - at);
        } else if byte == b'\'' || byte == b'"' {
            at += 1;
            while at < bytes.len() && bytes[at] != byte {
                at += if bytes[at] == b'\\' { 2 } else { 1 };
            }
            at += 1;
        } else if byte.is_ascii_alphabetic() || byte == b'_' {
            let start = at;
            while at < bytes.len() && (bytes[at].is_ascii_alphanumeric() || bytes[at] == b'_') {
                at += 1;
            }
            let name = &code[start..at];
            let field = start > 0 && matches!(bytes[start - 1], b'.' | b':');
            if !field {
                words.push(Word {
                    name,
                    start,
                    defines_function: after_local_function,
                });
            }
            after_local_function =
                words.len() >= 2 && name == "function" && words[words.len() - 2].name == "local";
        } else {
            at += 1;
        }
    }
    words
}

/// A top-level part of a library: one of its functions with the comment right above it, or
/// the code between them (its header, the state its functions keep), which always stays.
struct Piece {
    function: Option<&'static str>,
    text: &'static str,
}

/// `library`'s code in pieces, in order, which put together again are the whole of it.
fn pieces(library: &'static str) -> Vec<Piece> {
    let mut pieces = Vec::new();
    // Where the current piece of other code starts, and where its trailing comment does.
    let (mut other_start, mut comment_start) = (0, None);
    let mut function: Option<(&'static str, usize)> = None;
    let mut at = 0;
    for line in library.split_inclusive('\n') {
        let end = at + line.len();
        if let Some((name, start)) = function {
            if line.trim_end() == "end" {
                pieces.push(Piece {
                    function: Some(name),
                    text: &library[start..end],
                });
                function = None;
                other_start = end;
            }
        } else if let Some(rest) = line.strip_prefix(FUNCTION_START) {
            let start = comment_start.unwrap_or(at);
            pieces.push(Piece {
                function: None,
                text: &library[other_start..start],
            });
            let name = rest.split('(').next().unwrap_or(rest).trim();
            function = Some((name, start));
            comment_start = None;
        } else if line.starts_with("--") {
            comment_start = comment_start.or(Some(at));
        } else {
            comment_start = None;
        }
        at = end;
    }
    assert!(function.is_none(), "a library function without its `end`");
    pieces.push(Piece {
        function: None,
        text: &library[other_start..],
    });
    pieces
}

/// The functions of the libraries `code` includes that it calls (or names), directly or
/// through another of them.
pub(crate) fn functions_used(code: &str) -> BTreeSet<&'static str> {
    let included: Vec<Piece> = code
        .lines()
        .filter_map(|line| line.trim_end().strip_prefix(INCLUDE))
        .flat_map(|name| pieces(library(name)))
        .filter(|piece| piece.function.is_some())
        .collect();
    let mut used = BTreeSet::new();
    let mut named: Vec<&str> = words(code).into_iter().map(|word| word.name).collect();
    while let Some(name) = named.pop() {
        let piece = included.iter().find(|piece| piece.function == Some(name));
        if let Some(Piece {
            function: Some(name),
            text,
        }) = piece
            && used.insert(*name)
        {
            named.extend(words(text).into_iter().map(|word| word.name));
        }
    }
    used
}

/// `library`'s code with only the functions in `used`.
pub(crate) fn cut(library: &'static str, used: &BTreeSet<&str>) -> String {
    pieces(library)
        .into_iter()
        .filter(|piece| piece.function.is_none_or(|name| used.contains(name)))
        .map(|piece| piece.text)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_library_in_pieces_is_the_whole_library() {
        for (name, code) in LIBRARIES {
            let whole: String = pieces(code).into_iter().map(|piece| piece.text).collect();
            assert_eq!(&whole, code, "{name}");
            let functions = pieces(code)
                .into_iter()
                .filter(|piece| piece.function.is_some())
                .count();
            let defined = code.matches(&format!("\n{FUNCTION_START}")).count();
            assert_eq!(functions, defined, "{name}");
        }
    }

    #[test]
    fn a_script_keeps_the_functions_it_calls_and_theirs_and_no_other() {
        let code = "--#include clock\n--#include queue_expiry\n--#include queue\n\
                    local head = pop_live_head(now_ms())\n";
        let used = functions_used(code);
        let expected = ["now_ms", "now_us", "pop_live_head", "live_terms"];
        assert_eq!(used, expected.into_iter().collect());
        let queue = cut(library("queue"), &used);
        assert!(queue.contains("local function pop_live_head(now)\n"));
        assert!(queue.contains("local function live_terms(terms, now)\n"));
        assert!(!queue.contains("local function enqueue("));
        assert!(!queue.contains("-- Puts `owner` at the back of the queue"));
        // The library's header stays.
        assert!(queue.starts_with("-- The queue of a lock"));
    }
}
