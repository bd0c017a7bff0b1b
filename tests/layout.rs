//! The repository's layout: dependencies between the files of each crate (the library,
//! `lockctl` in `src/bin/`, lockbench in `tools/`) point one way (no cycle), and no file of
//! `src/` (binaries included) or of `tools/` (lockbench and the programs of the tests) grows
//! past 600 lines.
//!
//! A `use crate::…`, `use super::…` or a path written out in code (`crate::x::Y`) is an edge
//! from its file to the file that defines the item, following re-exports (`pub use`) to the
//! file they come from. `mod` declarations are not edges, and neither is a file's
//! `#[cfg(test)]` module (tests may reach anywhere).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The longest a file of `src/` or `tools/` may be: past it, a file holds more than one
/// concern and is split.
const MAX_LINES: usize = 600;

/// The crates of the repository whose files import each other, by their root folder: the
/// single-file programs of `tools/programs` cannot hold a cycle.
const CRATE_ROOTS: [&str; 3] = ["src", "src/bin/lockctl", "tools/lockbench/src"];

/// One file of a crate: its module path and the code that counts (comments and the
/// `#[cfg(test)]` module left out).
struct SourceFile {
    path: PathBuf,
    module: Vec<String>,
    code: String,
}

/// The files of the crate whose root is `folder` (relative to the repository); folders of
/// other crates in it (`src/bin` under `src`) are left out.
fn crate_files(folder: &str) -> Vec<SourceFile> {
    let repository = Path::new(env!("CARGO_MANIFEST_DIR"));
    let root = repository.join(folder);
    let others: Vec<PathBuf> = CRATE_ROOTS
        .iter()
        .map(|other| repository.join(other))
        .filter(|other| *other != root && other.starts_with(&root))
        .collect();
    let mut files: Vec<SourceFile> = rust_files_under(&root)
        .into_iter()
        .filter(|path| {
            !others.iter().any(|other| path.starts_with(other)) && !is_in_bin(path, &root)
        })
        .map(|path| {
            let relative = path.strip_prefix(&root).expect("under the root");
            let text = std::fs::read_to_string(&path).expect("a source file");
            SourceFile {
                module: module_of(relative),
                code: code_of(&text),
                path: relative.to_path_buf(),
            }
        })
        .collect();
    files.sort_by(|a, b| a.path.cmp(&b.path));
    files
}

/// Whether `path` is under the `bin` folder of the library's root: binaries are crates of
/// their own, checked as such.
fn is_in_bin(path: &Path, root: &Path) -> bool {
    path.strip_prefix(root)
        .is_ok_and(|relative| relative.starts_with("bin"))
}

/// Every `.rs` file under `folder`, sorted. Hidden folders and `target` are left out: a build
/// of lockbench without `CARGO_TARGET_DIR` puts its dependencies' generated sources there,
/// which no one edits.
fn rust_files_under(folder: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut folders = vec![folder.to_path_buf()];
    while let Some(folder) = folders.pop() {
        let entries = std::fs::read_dir(&folder)
            .unwrap_or_else(|err| panic!("{} is readable: {err}", folder.display()));
        for entry in entries {
            let path = entry.expect("a directory entry").path();
            let name = path.file_name().unwrap_or_default().to_string_lossy();
            if path.is_dir() {
                if !name.starts_with('.') && name != "target" {
                    folders.push(path);
                }
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// What is wrong with a file of `lines` lines named `name`, if it is over [`MAX_LINES`].
fn too_long(name: &str, lines: usize) -> Option<String> {
    (lines > MAX_LINES).then(|| {
        format!("{name} has {lines} lines, over the limit of {MAX_LINES}: split it by concern")
    })
}

/// `lib.rs` and `main.rs` → [], `a.rs` → [a], `a/mod.rs` → [a], `a/b.rs` → [a, b].
fn module_of(relative: &Path) -> Vec<String> {
    let mut parts: Vec<String> = relative
        .iter()
        .map(|part| part.to_string_lossy().trim_end_matches(".rs").to_owned())
        .collect();
    let root_file = parts.len() == 1 && parts[0] == "main";
    if root_file || matches!(parts.last().map(String::as_str), Some("lib" | "mod")) {
        parts.pop();
    }
    parts
}

/// The lines of `text` that are code: no comments, nothing from `#[cfg(test)]` on.
fn code_of(text: &str) -> String {
    text.lines()
        .take_while(|line| line.trim() != "#[cfg(test)]")
        .map(|line| line.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every path a file names through `use` statements (braces expanded) and written out in
/// code, as written (`crate::a::B`, `super::c`, `self::d`).
fn named_paths(code: &str) -> Vec<String> {
    let mut paths = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("use ") {
        // `must_use` and other identifiers ending in `use` are no `use` statement.
        let boundary = at == 0 || {
            let before = rest.as_bytes()[at - 1];
            !(before.is_ascii_alphanumeric() || before == b'_')
        };
        let tail = &rest[at + 4..];
        let end = tail.find(';').unwrap_or(tail.len());
        if boundary {
            let tree: String = tail[..end].split_whitespace().collect();
            expand("", &tree, &mut paths);
        }
        rest = &tail[end..];
    }
    for start in ["crate::", "super::"] {
        let mut from = 0;
        while let Some(at) = code[from..].find(start) {
            let at = from + at;
            let path: String = code[at..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':')
                .collect();
            let path = path.trim_end_matches(':');
            // `crate::{a, b}` opens a use tree, expanded above: the bare root is no item.
            if !path
                .split("::")
                .all(|part| matches!(part, "crate" | "super" | "self"))
            {
                paths.push(path.to_owned());
            }
            from = at + start.len();
        }
    }
    paths
}

/// Expands a use tree (`a::{b, c::{d, e}}`) below `prefix` into whole paths.
fn expand(prefix: &str, tree: &str, paths: &mut Vec<String>) {
    let join = |tail: &str| {
        if prefix.is_empty() {
            tail.to_owned()
        } else {
            format!("{prefix}::{tail}")
        }
    };
    match tree.find('{') {
        None => {
            let path = tree.split(" as ").next().unwrap_or(tree);
            paths.push(join(path.trim_end_matches("::self")));
        }
        Some(open) => {
            let head = join(tree[..open].trim_end_matches("::"));
            let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
            let mut depth = 0;
            let mut item = String::new();
            for c in inner.chars().chain(std::iter::once(',')) {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        if item == "self" {
                            paths.push(head.clone());
                        } else if !item.is_empty() {
                            expand(&head, &item, paths);
                        }
                        item.clear();
                        continue;
                    }
                    _ => {}
                }
                item.push(c);
            }
        }
    }
}

/// The module path `path` names from inside `module`, or `None` for a path outside the crate.
fn absolute(path: &str, module: &[String]) -> Option<Vec<String>> {
    let mut parts = path.split("::").filter(|part| !part.is_empty());
    let first = parts.next()?;
    let mut base: Vec<String> = match first {
        "crate" => Vec::new(),
        "super" => module[..module.len().saturating_sub(1)].to_vec(),
        "self" => module.to_vec(),
        _ => return None,
    };
    for part in parts {
        if part == "super" {
            base.pop();
        } else {
            base.push(part.to_owned());
        }
    }
    Some(base)
}

/// The file an absolute path leads to: the deepest module it names, and from there through
/// that module's re-exports to the file the item comes from.
fn resolve(
    path: &[String],
    files: &[SourceFile],
    modules: &BTreeMap<Vec<String>, usize>,
    depth: usize,
) -> Option<usize> {
    let (known, file) = (0..=path.len())
        .rev()
        .find_map(|len| modules.get(&path[..len]).map(|file| (len, *file)))?;
    let Some(item) = path.get(known) else {
        return Some(file);
    };
    let source = &files[file];
    // A module whose file lies outside the crate's folder (`#[path = "…"] mod x;`, a file
    // shared with another program) is a leaf of its own: it names nothing of this crate.
    if source.code.contains(&format!("mod {item};")) {
        return None;
    }
    if depth > 8 {
        return Some(file);
    }
    // Re-exported here? Follow it to where it is defined.
    for named in named_paths(&source.code) {
        let last = named.rsplit("::").next().unwrap_or("");
        if last != item || !source.code.contains("pub use") {
            continue;
        }
        let named = if named.starts_with("crate") || named.starts_with("super") {
            named
        } else {
            format!("self::{named}")
        };
        if let Some(target) = absolute(&named, &source.module)
            && target != path
            && let Some(found) = resolve(&target, files, modules, depth + 1)
            && found != file
        {
            return Some(found);
        }
    }
    Some(file)
}

/// The edges between the crate's files, by index into `files`.
fn edges(files: &[SourceFile]) -> BTreeMap<usize, BTreeSet<usize>> {
    let modules: BTreeMap<Vec<String>, usize> = files
        .iter()
        .enumerate()
        .map(|(index, file)| (file.module.clone(), index))
        .collect();
    let mut edges: BTreeMap<usize, BTreeSet<usize>> = BTreeMap::new();
    for (index, file) in files.iter().enumerate() {
        for named in named_paths(&file.code) {
            let Some(path) = absolute(&named, &file.module) else {
                continue;
            };
            if let Some(target) = resolve(&path, files, &modules, 0)
                && target != index
                // The crate root and module roots declare their children: only a re-export
                // that could not be followed leads there, which is no dependency.
                && !files[target].path.ends_with("lib.rs")
            {
                edges.entry(index).or_default().insert(target);
            }
        }
    }
    edges
}

/// A cycle among `edges`, as the files on it, if there is one.
fn find_cycle(count: usize, edges: &BTreeMap<usize, BTreeSet<usize>>) -> Option<Vec<usize>> {
    // 0 unvisited, 1 on the current path, 2 done.
    let mut state = vec![0u8; count];
    let mut path = Vec::new();
    fn visit(
        node: usize,
        edges: &BTreeMap<usize, BTreeSet<usize>>,
        state: &mut [u8],
        path: &mut Vec<usize>,
    ) -> Option<Vec<usize>> {
        state[node] = 1;
        path.push(node);
        for &next in edges.get(&node).into_iter().flatten() {
            if state[next] == 1 {
                let from = path.iter().position(|&n| n == next).expect("on the path");
                return Some(path[from..].to_vec());
            }
            if state[next] == 0
                && let Some(cycle) = visit(next, edges, state, path)
            {
                return Some(cycle);
            }
        }
        path.pop();
        state[node] = 2;
        None
    }
    (0..count).find_map(|node| {
        if state[node] == 0 {
            visit(node, edges, &mut state, &mut path)
        } else {
            None
        }
    })
}

#[test]
fn the_files_of_each_crate_depend_on_each_other_one_way() {
    for root in CRATE_ROOTS {
        let files = crate_files(root);
        assert!(files.len() > 5, "the files of {root} were found");
        let edges = edges(&files);
        if let Some(cycle) = find_cycle(files.len(), &edges) {
            let names: Vec<String> = cycle
                .iter()
                .chain(cycle.first())
                .map(|&index| format!("{root}/{}", files[index].path.display()))
                .collect();
            panic!("an import cycle: {}", names.join(" -> "));
        }
    }
}

/// Every file a person edits: the library, its binaries (`src/bin/`), lockbench and the
/// programs of the tests (`tools/`).
#[test]
fn no_file_of_src_or_tools_is_over_600_lines() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let files: Vec<PathBuf> = ["src", "tools"]
        .iter()
        .flat_map(|folder| rust_files_under(&root.join(folder)))
        .collect();
    for expected in [
        "src/lib.rs",
        "src/bin",
        "tools/lockbench/src",
        "tools/programs",
    ] {
        assert!(
            files
                .iter()
                .any(|path| path.starts_with(root.join(expected))),
            "no .rs file found under {expected}: the check would miss it"
        );
    }
    let long: Vec<String> = files
        .iter()
        .filter_map(|path| {
            let text = std::fs::read_to_string(path).expect("a source file");
            let name = path.strip_prefix(root).expect("in the repository");
            too_long(&name.display().to_string(), text.lines().count())
        })
        .collect();
    assert!(long.is_empty(), "{}", long.join("\n"));
}

/// The checker itself: 600 lines pass, 601 do not, and the message names the file and its
/// length.
#[test]
fn the_length_check_names_a_file_over_the_limit() {
    assert_eq!(too_long("src/a.rs", MAX_LINES), None);
    assert_eq!(
        too_long("src/bin/b/main.rs", MAX_LINES + 1).as_deref(),
        Some("src/bin/b/main.rs has 601 lines, over the limit of 600: split it by concern")
    );
}

/// A file of a crate the checks below make up: `code` at `path`.
fn file(path: &str, code: &str) -> SourceFile {
    SourceFile {
        path: PathBuf::from(path),
        module: module_of(Path::new(path)),
        code: code_of(code),
    }
}

/// The checker itself: a cycle through a re-export is found, and a one-way chain is not one.
#[test]
fn the_layout_check_finds_a_cycle_through_a_re_export() {
    let one_way = [
        file("lib.rs", "mod a; mod b; pub use b::Thing;"),
        file("a.rs", "use crate::Thing;"),
        file("b.rs", "pub struct Thing;"),
    ];
    assert_eq!(find_cycle(3, &edges(&one_way)), None);
    let cyclic = [
        file("lib.rs", "mod a; mod b; pub use b::Thing;"),
        file("a.rs", "use crate::Thing;\npub struct Other;"),
        file("b/mod.rs", "mod c;\npub use c::Thing;"),
        file(
            "b/c.rs",
            "use super::super::a::{self, Other};\npub struct Thing;",
        ),
    ];
    let cycle = find_cycle(4, &edges(&cyclic)).expect("the cycle a -> b/c -> a");
    let mut on_it: Vec<&Path> = cycle.iter().map(|&i| cyclic[i].path.as_path()).collect();
    on_it.sort();
    assert_eq!(on_it, [Path::new("a.rs"), Path::new("b/c.rs")]);
}

/// The checker on a binary's files: an item of `main.rs` used by a module `main.rs` calls is a
/// cycle; a use tree opened at the root (`crate::{a, b}`) and a module whose file lies
/// elsewhere (`#[path]`) are not.
#[test]
fn the_layout_check_finds_a_cycle_through_a_binarys_main() {
    let one_way = [
        file(
            "main.rs",
            "mod a; mod b;\n#[path = \"../x.rs\"] mod shared;\nuse crate::{a, b};",
        ),
        file("a.rs", "use crate::{b::run, shared::Thing};"),
        file("b.rs", "pub fn run() {}"),
    ];
    assert_eq!(find_cycle(3, &edges(&one_way)), None);
    let cyclic = [
        file("main.rs", "mod a;\nuse crate::a::run;\nfn emit() {}"),
        file("a.rs", "use crate::emit;\npub fn run() {}"),
    ];
    let cycle = find_cycle(2, &edges(&cyclic)).expect("the cycle main -> a -> main");
    assert_eq!(cycle.len(), 2);
}
