//! A script's source as a Redis Functions library (`FUNCTION LOAD`, then `FCALL`), where
//! Lua makes its functions once, when the library loads, instead of on every call as it does
//! for a script: 13 % of a hand-over's Redis work and 6 % to 8 % of an uncontended lock's
//! (docs/benchmarks.md, "Redis Functions").
//!
//! The rule that keeps every call what a run of the script is: the script's top-level
//! functions move to the library; its other top-level locals are declared once with the
//! library and set at each call at the point where the script declared them (a bare `local x`
//! sets `x` to nil there). Lua scopes a local from its declaration on, so in the script no
//! code reads one before that point; a function can only be called after its definition,
//! which comes after every local it reads. So no call reads what an earlier call left.
//! A name declared twice at the top level would be one variable here and two in the script:
//! refused.

use std::collections::BTreeSet;
use std::fmt::Write;

use crate::wire::script_library::{Word, words};

/// How much a keyword opens (1) or closes (-1) a block: `while` and `for` open theirs with
/// `do`.
fn block_change(word: &str) -> i32 {
    match word {
        "function" | "if" | "do" | "repeat" => 1,
        "end" | "until" => -1,
        _ => 0,
    }
}

/// A top-level statement of a script that the library changes.
enum TopLevel<'a> {
    /// `local function name(...) ... end`, and the byte after its line.
    Function { name: &'a str, end: usize },
    /// `local a, b` (bare: no `=` follows) or `local a, b = ...`, and the byte after the
    /// names.
    Locals {
        names: Vec<&'a str>,
        bare: bool,
        end: usize,
    },
}

/// The top-level statement that starts with the word `words[at]`, `local`.
fn top_level<'a>(source: &'a str, words: &[Word<'a>], at: usize) -> TopLevel<'a> {
    if words.get(at + 1).map(|word| word.name) == Some("function") {
        let name = words[at + 2].name;
        let mut depth = 0;
        let closing = (at + 1..words.len())
            .find(|&index| {
                depth += block_change(words[index].name);
                depth == 0
            })
            .expect("a function with its `end`");
        let end = words[closing].start;
        let end = source[end..]
            .find('\n')
            .map_or(source.len(), |line| end + line + 1);
        return TopLevel::Function { name, end };
    }
    let names_start = words[at].start + "local".len();
    let names_len = source[names_start..]
        .find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '_' | ',' | ' ')))
        .unwrap_or(source.len() - names_start);
    let names_text = &source[names_start..names_start + names_len];
    let names = names_text.split(',').map(str::trim).collect();
    let end = names_start + names_text.trim_end().len();
    let bare = !source[end..].trim_start_matches(' ').starts_with('=');
    TopLevel::Locals { names, bare, end }
}

/// `source` (a script's whole source, as [`ScriptSpec::source`] builds it) as the library
/// `name`, which registers one function of the same name, with `flags`. A top-level local
/// that no top-level function reads stays a local of each call: the callback reads the
/// library's names as upvalues, of which Lua 5.1 gives a function at most 60.
///
/// [`ScriptSpec::source`]: crate::wire::script::ScriptSpec::source
pub(crate) fn function_library(name: &str, source: &str, flags: &[&str]) -> String {
    let source_words = words(source);
    let statements = top_level_statements(source, &source_words);
    let mut functions = String::new();
    for (start, statement) in &statements {
        if let TopLevel::Function { end, .. } = statement {
            functions.push_str(&source[*start..*end]);
        }
    }
    let read_by_functions: BTreeSet<&str> = words(&functions)
        .into_iter()
        .map(|word| word.name)
        .collect();
    let mut declared: BTreeSet<&str> = BTreeSet::new();
    let mut declarations = String::new();
    let mut body = String::new();
    let mut copied = 0;
    for (start, statement) in statements {
        let names = match statement {
            TopLevel::Function { name, end } => {
                body.push_str(&source[copied..start]);
                copied = end;
                vec![name]
            }
            TopLevel::Locals { names, bare, end } => {
                if !names.iter().any(|name| read_by_functions.contains(name)) {
                    continue;
                }
                // The callback sets them first (below), from its arguments.
                if names != ["KEYS", "ARGV"] {
                    writeln!(declarations, "local {}", names.join(", ")).expect("a String");
                }
                body.push_str(&source[copied..start]);
                body.push_str(&names.join(", "));
                if bare {
                    body.push_str(" = nil");
                }
                copied = end;
                names
            }
        };
        for name in names {
            assert!(
                declared.insert(name),
                "{name}: declared twice at the top level of the script"
            );
        }
    }
    body.push_str(&source[copied..]);
    let flags: Vec<String> = flags.iter().map(|flag| format!("'{flag}'")).collect();
    format!(
        "#!lua name={name}\nlocal KEYS, ARGV\n{declarations}{functions}\
         redis.register_function{{\
         function_name = '{name}', flags = {{{}}}, callback = function(keys, args)\n\
         KEYS, ARGV = keys, args\n{body}end}}\n",
        flags.join(", ")
    )
}

/// The top-level statements of `source` that start with `local`, each with where it starts.
fn top_level_statements<'a>(source: &'a str, words: &[Word<'a>]) -> Vec<(usize, TopLevel<'a>)> {
    let mut statements = Vec::new();
    let mut depth = 0;
    let mut at = 0;
    while at < words.len() {
        let word = &words[at];
        if depth > 0 || word.name != "local" {
            depth += block_change(word.name);
            at += 1;
            continue;
        }
        let statement = top_level(source, words, at);
        let end = match &statement {
            TopLevel::Function { end, .. } | TopLevel::Locals { end, .. } => *end,
        };
        statements.push((word.start, statement));
        at = words.partition_point(|word| word.start < end);
    }
    statements
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCRIPT: &str = "local KEYS, ARGV = KEYS, ARGV\nlocal LOCK = KEYS[1]\n\
        local seen\nlocal function look(key)\n  if not seen then\n    seen = 1\n  end\n\
        return redis.call('exists', key)\nend\nlocal count, found = look(LOCK), 0\n\
        if count == 0 then\n  local inner = 1\n  return inner\nend\n\
        local function run_item(n)\nlocal per_item = n\nif per_item then\nend\n\
        return per_item\nend\nreturn run_item(count)\n";

    #[test]
    fn top_level_functions_move_to_the_library_and_locals_are_set_at_each_call() {
        let library = function_library("trl_look", SCRIPT, &["allow-oom"]);
        let (head, callback) = library
            .split_once("redis.register_function")
            .expect("one registration");
        // Only what a function reads is the library's: `seen`, not `LOCK` nor `count`.
        assert!(head.starts_with("#!lua name=trl_look\nlocal KEYS, ARGV\nlocal seen\n"));
        // Each function whole, with a block whose `end` is at the line's start inside it.
        assert!(head.contains("local function look(key)\n"));
        assert!(head.contains("local function run_item(n)\nlocal per_item = n\nif per_item"));
        assert!(head.ends_with("return per_item\nend\n"));
        assert!(callback.contains("flags = {'allow-oom'}"));
        assert!(callback.contains(
            "KEYS, ARGV = keys, args\nlocal KEYS, ARGV = KEYS, ARGV\nlocal LOCK = KEYS[1]\n\
             seen = nil\nlocal count, found = look(LOCK), 0\n"
        ));
        assert!(callback.contains("  local inner = 1\n"));
        assert!(!callback.contains("local function"));
        assert!(callback.ends_with("return run_item(count)\nend}\n"));
    }

    /// Lua 5.1 gives a function at most 60 upvalues: the callback reads the library's names
    /// as upvalues.
    #[test]
    fn every_script_makes_a_library_whose_callback_reads_at_most_60_of_its_names() {
        for script in crate::wire::scripts::all() {
            let library = function_library("trl_check", &script.source(), &[]);
            let (head, callback) = library.split_once("redis.register_function").unwrap();
            let library_names: BTreeSet<&str> = head
                .lines()
                .filter(|line| !line.starts_with(' '))
                .filter_map(|line| line.strip_prefix("local "))
                .flat_map(|names| match names.strip_prefix("function ") {
                    Some(function) => function.split('(').take(1).collect::<Vec<_>>(),
                    None => names.split(',').collect(),
                })
                .map(str::trim)
                .collect();
            let read: BTreeSet<&str> = words(callback)
                .into_iter()
                .map(|word| word.name)
                .filter(|name| library_names.contains(name))
                .collect();
            assert!(
                read.len() <= 60,
                "{}: {} names: {read:?}",
                script.file(),
                read.len()
            );
        }
    }

    #[test]
    #[should_panic(expected = "declared twice")]
    fn a_name_declared_twice_at_the_top_level_is_refused() {
        // In the script `f` reads the first `a` (1); as one variable it would read 2.
        let script =
            "local a = 1\nlocal function f()\n  return a\nend\nlocal a = 2\nreturn f() + a\n";
        function_library("trl_twice", script, &[]);
    }
}
