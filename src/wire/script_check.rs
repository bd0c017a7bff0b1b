//! Every script's Lua checked against its description, without Redis: what only integration
//! tests against a server would otherwise notice when Rust and Lua drift apart.

use std::collections::BTreeSet;

use crate::wire::lua::CLUSTER_PRELUDE;
use crate::wire::script::Described;
use crate::wire::script_library::{INCLUDE, LIBRARIES, library, words};
use crate::wire::scripts;

/// Lua's keywords, and the globals a Redis script may read.
const LUA_NAMES: &[&str] = &[
    "and", "break", "do", "else", "elseif", "end", "false", "for", "function", "if", "in", "local",
    "nil", "not", "or", "repeat", "return", "then", "true", "until", "while", "redis", "string",
    "math", "table", "tonumber", "tostring", "unpack", "type", "ipairs", "pairs",
];

/// The names `code` binds itself: locals, parameters and loop variables.
fn bound_names(code: &str) -> BTreeSet<&str> {
    let mut bound = BTreeSet::new();
    for line in code.lines().map(str::trim) {
        let line = line.split("--").next().unwrap_or("");
        let declared: Vec<&str> = if let Some(rest) = line.strip_prefix("local function ") {
            // The function's own name is defined where it stands (see `problems`).
            rest.split(['(', ')', ',']).skip(1).collect()
        } else if let Some(rest) = line.strip_prefix("local ") {
            rest.split('=').next().unwrap_or("").split(',').collect()
        } else if let Some(rest) = line.strip_prefix("for ") {
            match rest.split_once(" in ") {
                Some((names, _)) => names.split(',').collect(),
                None => rest.split('=').next().into_iter().collect(),
            }
        } else {
            Vec::new()
        };
        bound.extend(
            declared
                .into_iter()
                .map(str::trim)
                .filter(|name| !name.is_empty()),
        );
        if let Some(at) = line.find("function(") {
            let params = line[at + "function(".len()..]
                .split(')')
                .next()
                .unwrap_or("");
            bound.extend(
                params
                    .split(',')
                    .map(str::trim)
                    .filter(|name| !name.is_empty()),
            );
        }
    }
    bound
}

/// The names `code` binds with a `local` of its own at its top level (not a function's): what
/// a library gives the code of a script after its include, such as the terms it splits.
fn top_level_locals(code: &str) -> BTreeSet<&str> {
    code.lines()
        .filter(|line| !line.starts_with("local function "))
        .filter_map(|line| line.strip_prefix("local "))
        .flat_map(|rest| rest.split('=').next().unwrap_or("").split(','))
        .map(str::trim)
        .filter(|name| !name.is_empty())
        .collect()
}

/// A script's parts in the order of its source: the prelude, its own code between includes,
/// and each library where it is included.
fn parts(script: &dyn Described) -> Vec<(String, &'static str)> {
    let mut parts = vec![("cluster.lua".to_owned(), CLUSTER_PRELUDE)];
    let code = script.code();
    let mut segment_start = 0;
    let mut at = 0;
    for line in code.split_inclusive('\n') {
        if let Some(name) = line.trim_end().strip_prefix(INCLUDE) {
            parts.push((script.file().to_owned(), &code[segment_start..at]));
            parts.push((format!("lib/{name}.lua"), library(name)));
            segment_start = at + line.len();
        }
        at += line.len();
    }
    parts.push((script.file().to_owned(), &code[segment_start..]));
    parts
}

/// What is wrong with `script`'s Lua against its description, one line each.
fn problems(script: &dyn Described) -> Vec<String> {
    let mut problems = Vec::new();
    let file = script.file();
    let declared: BTreeSet<&str> = script.names().into_iter().collect();
    // The names bound from the description, and the prelude's own.
    let mut known: BTreeSet<&str> = declared.clone();
    known.extend(["KEYS", "ARGV"]);
    let mut defined_functions = BTreeSet::new();
    let mut used = BTreeSet::new();
    let mut included = BTreeSet::new();
    defined_functions.extend(script.bound_functions());
    let mut from_libraries = BTreeSet::new();
    for (part, code) in parts(script) {
        if part.starts_with("lib/") && !included.insert(part.clone()) {
            problems.push(format!("{file}: {part} is included twice"));
        }
        if part != "cluster.lua" && (code.contains("KEYS[") || code.contains("ARGV[")) {
            problems.push(format!("{file}: {part} reads KEYS or ARGV by position"));
        }
        // The script's own code is one scope across its includes.
        let mut bound = bound_names(if part == file { script.code() } else { code });
        if part == file {
            bound.extend(&from_libraries);
        } else if part.starts_with("lib/") {
            from_libraries.extend(top_level_locals(code));
        }
        for word in words(code) {
            let name = word.name;
            used.insert(name);
            if word.defines_function {
                defined_functions.insert(name);
                continue;
            }
            let is_constant =
                name.len() > 1 && name.bytes().all(|b| b.is_ascii_uppercase() || b == b'_');
            if is_constant && !known.contains(name) {
                problems.push(format!(
                    "{file}: {part} reads {name}, which it is not given"
                ));
            } else if !is_constant
                && !LUA_NAMES.contains(&name)
                && !bound.contains(name)
                && !defined_functions.contains(name)
            {
                problems.push(format!(
                    "{file}: {part} reads '{name}', defined nowhere before it in the script"
                ));
            }
        }
    }
    for name in declared.iter().filter(|name| !used.contains(*name)) {
        if !script.statuses().iter().any(|status| status.name == *name) {
            problems.push(format!("{file}: {name} is given but never read"));
        }
    }
    problems
}

/// The tables `code` returns, each as its items split at the commas outside brackets:
/// `return {STATUS, a, f(b, c)}` gives `["STATUS", "a", "f(b, c)"]`. A script returns a
/// table on one line.
fn returned_tables(code: &str) -> Vec<Vec<&str>> {
    let mut tables = Vec::new();
    for line in code.lines() {
        let line = line.split("--").next().unwrap_or("");
        let Some(at) = line.find("return {") else {
            continue;
        };
        let body = &line[at + "return {".len()..];
        let (mut depth, mut start, mut items) = (0, 0, Vec::new());
        for (at, byte) in body.bytes().enumerate() {
            match byte {
                b'(' | b'{' | b'[' => depth += 1,
                b'}' if depth == 0 => {
                    items.push(body[start..at].trim());
                    break;
                }
                b')' | b'}' | b']' => depth -= 1,
                b',' if depth == 0 => {
                    items.push(body[start..at].trim());
                    start = at + 1;
                }
                _ => {}
            }
        }
        items.retain(|item| !item.is_empty());
        tables.push(items);
    }
    tables
}

/// What is wrong with the replies `script`'s Lua returns: a status it does not describe, or
/// another count of values than the status's struct names.
fn reply_problems(script: &dyn Described) -> Vec<String> {
    let statuses = script.statuses();
    let file = script.file();
    let mut problems = Vec::new();
    for (part, code) in parts(script) {
        for table in returned_tables(code) {
            let Some((first, values)) = table.split_first() else {
                continue;
            };
            let is_constant = first.bytes().all(|b| b.is_ascii_uppercase() || b == b'_');
            match statuses.iter().find(|status| status.name == *first) {
                Some(status)
                    if !(status.least_values..=status.most_values).contains(&values.len()) =>
                {
                    problems.push(format!(
                        "{file}: {part} returns {first} with {} values, its struct names {}",
                        values.len(),
                        if status.least_values == status.most_values {
                            status.most_values.to_string()
                        } else {
                            format!("{} to {}", status.least_values, status.most_values)
                        }
                    ));
                }
                None if is_constant => {
                    problems.push(format!("{file}: {part} returns {first}, no status of it"));
                }
                _ => {}
            }
        }
    }
    problems
}

#[test]
fn every_status_a_script_returns_carries_the_values_its_struct_names() {
    let problems: Vec<String> = scripts::all()
        .into_iter()
        .flat_map(reply_problems)
        .collect();
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    let returned: usize = scripts::all()
        .into_iter()
        .flat_map(|script| parts(script).into_iter().map(|(_, code)| code))
        .map(|code| returned_tables(code).len())
        .sum();
    assert!(returned > 50, "the scripts' returns are found: {returned}");
}

#[test]
fn the_reply_check_finds_a_status_with_other_values_and_one_not_described() {
    use crate::wire::script::ScriptSpec;
    use crate::wire::script_reply::reply_statuses;
    reply_statuses! {
        /// The statuses of the test.
        done {
            /// Done, with two values, the last of which may be left out.
            DONE = 1 => Done { first: u64, second: Option<u64> },
        }
    }
    static BAD: ScriptSpec<crate::wire::script::NoItems> = ScriptSpec::new(
        "bad.lua",
        "if x then\n  return {DONE, f(a, b)}\nend\nreturn {DONE, a, b, c} -- return {DONE}\n\
         return {GONE}\n",
        &[done::ALL],
    );
    assert_eq!(done::ALL[0].value, done::DONE);
    assert_eq!(
        reply_problems(&BAD),
        [
            "bad.lua: bad.lua returns DONE with 3 values, its struct names 1 to 2",
            "bad.lua: bad.lua returns GONE, no status of it",
        ]
    );
    assert_eq!(
        returned_tables("return {A, f(b, {c, d})}\nreturn {}\n"),
        [vec!["A", "f(b, {c, d})"], vec![]]
    );
}

#[test]
fn every_scripts_lua_reads_only_what_its_description_gives_it_by_name() {
    let problems: Vec<String> = scripts::all().into_iter().flat_map(problems).collect();
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn a_library_gives_the_script_its_top_level_locals_only() {
    let code = "local server_us\nlocal a, b =\n  f()\nlocal function g(c)\n  local d = c\nend\n";
    assert_eq!(
        top_level_locals(code).into_iter().collect::<Vec<_>>(),
        ["a", "b", "server_us"]
    );
}

#[test]
fn every_library_is_included_by_some_script() {
    let sources: Vec<String> = scripts::all()
        .iter()
        .map(|script| script.code().to_owned())
        .collect();
    for (name, _) in LIBRARIES {
        let include = format!("{INCLUDE}{name}\n");
        assert!(
            sources.iter().any(|code| code.contains(&include)),
            "{name} is included nowhere"
        );
    }
}

#[test]
fn the_check_finds_a_position_a_name_not_given_an_unused_one_and_a_function_used_too_early() {
    use crate::wire::script::ScriptSpec;
    use crate::wire::script_inputs::script_inputs;
    script_inputs! {
        /// The inputs of the bad script.
        struct BadInputs<'a> {
            keys { lock: &'a str }
            args {
                owner: &'a str,
                lease_ms: u64,
            }
        }
    }
    static BAD: ScriptSpec<BadInputs<'static>> = ScriptSpec::new(
        "bad.lua",
        "local x = ARGV[3]\nlocal y = later(OWNR, x)\nlocal function later(a)\n  return a\nend\n",
        &[],
    );
    let found = problems(&BAD);
    for expected in [
        "bad.lua: bad.lua reads KEYS or ARGV by position",
        "bad.lua: bad.lua reads OWNR, which it is not given",
        "bad.lua: bad.lua reads 'later', defined nowhere before it in the script",
        "bad.lua: LOCK is given but never read",
    ] {
        assert!(
            found.iter().any(|problem| problem == expected),
            "{expected} in {found:?}"
        );
    }
}

#[test]
fn a_script_binds_its_keys_arguments_and_statuses_by_name_in_order() {
    let bindings: Vec<String> = scripts::all()
        .iter()
        .map(|script| script.source())
        .filter(|source| source.contains("local OWNER = ARGV[2]"))
        .collect();
    assert!(!bindings.is_empty());
    for source in bindings {
        assert!(source.contains("local LOCK = KEYS[1]\n"));
        assert!(source.contains("local WAKE_PREFIX = ARGV[1]\n"));
        assert!(
            !source.contains(INCLUDE),
            "every include is replaced by its library"
        );
    }
}

#[test]
fn every_library_function_a_scripts_source_names_is_made_in_it() {
    let library_functions: BTreeSet<&str> = LIBRARIES
        .iter()
        .flat_map(|(_, code)| words(code))
        .filter(|word| word.defines_function)
        .map(|word| word.name)
        .collect();
    for script in scripts::all() {
        let source = script.source();
        let made: BTreeSet<&str> = words(&source)
            .into_iter()
            .filter(|word| word.defines_function)
            .map(|word| word.name)
            .collect();
        let missing: BTreeSet<&str> = words(&source)
            .into_iter()
            .map(|word| word.name)
            .filter(|name| library_functions.contains(name) && !made.contains(name))
            .collect();
        assert!(missing.is_empty(), "{}: {missing:?}", script.file());
    }
}

#[test]
fn only_a_script_that_catches_the_counter_up_after_its_items_may_leave_it_behind() {
    let mut catching_up = 0;
    for script in scripts::all() {
        let source = script.source();
        let allowed = source.find("\ncounter_caught_up_after_items = true\n");
        let items = source.find("\nlocal function run_item(");
        let caught_up = source.find("\ncatch_up_counter()\nreturn replies\n");
        match (allowed, items, caught_up) {
            (None, _, None) => {}
            (Some(allowed), Some(items), Some(caught_up)) if allowed < items => {
                assert!(items < caught_up, "{}", script.file());
                catching_up += 1;
            }
            _ => panic!("{}: {allowed:?} {items:?} {caught_up:?}", script.file()),
        }
    }
    // The gathered acquire's: the one script whose items take locks free.
    assert_eq!(catching_up, 1);
}
