//! One description per Lua script, shared by Rust and Lua: its keys and arguments, named and
//! in order, and its reply statuses, named. From it the command is sized and written, and
//! the Lua block that binds the names (`local OWNER = ARGV[2]`) is put before the script's
//! own code, so no position is written twice and a script reads its inputs by name. A batch
//! gives each item the same keys and arguments (`each_item()`); what varies per item in
//! length follows all the items, in the order the items' own arguments count it
//! (`take_rest(n)`).
//!
//! A script's source is the binding block, then its own file, in which a line
//! `--#include <library>` stands for a library of shared functions from `lua/lib/`. A
//! cluster client runs it after `lua/cluster.lua`, which stops it in a migrating slot.
//! Where the include stands is where Lua creates those functions, each time the script runs
//! past it: a script includes what its fast path needs first, and the rest after it.

use std::fmt::Write;
use std::sync::OnceLock;

use redis::Cmd;

use crate::layout::LUA_BINDINGS;
use crate::wire::lua::Lua;

/// The longest number a command carries: a `u64` in decimal.
const MAX_NUMBER_LEN: usize = 20;

/// The libraries a script may include, by name.
pub(crate) const LIBRARIES: &[(&str, &str)] = &[
    ("clock", include_str!("lua/lib/clock.lua")),
    ("saves", include_str!("lua/lib/saves.lua")),
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
];

/// How an include of a library is written in a script's file.
pub(crate) const INCLUDE: &str = "--#include ";

/// Named reply statuses: Rust constants, and the same names bound in a script's Lua.
macro_rules! reply_statuses {
    ($(#[$doc:meta])* $module:ident { $($(#[$status_doc:meta])* $name:ident = $value:expr),* $(,)? }) => {
        $(#[$doc])*
        pub(crate) mod $module {
            $($(#[$status_doc])* pub(crate) const $name: i64 = $value;)*
            /// Every status, by name, for the script's Lua.
            pub(crate) const ALL: &[(&str, i64)] = &[$((stringify!($name), $value)),*];
        }
    };
}
pub(crate) use reply_statuses;

/// A Lua script, described.
pub(crate) struct ScriptSpec<const KEYS: usize, const ARGS: usize> {
    /// The file of its own code under `lua/`.
    pub(crate) file: &'static str,
    /// The names of its keys, in order.
    pub(crate) keys: [&'static str; KEYS],
    /// The names of its arguments, in order.
    pub(crate) args: [&'static str; ARGS],
    /// Keys and arguments given once per item after the fixed ones (a batch's locks).
    pub(crate) each: Each,
    /// Whether arguments follow the items' ones, as many as the caller gives (see
    /// [`Self::with_rest`]).
    pub(crate) rest: bool,
    /// The groups of named statuses its replies start with.
    pub(crate) statuses: &'static [&'static [(&'static str, i64)]],
    /// The status a reply of one integer alone stands for, with that integer as its first
    /// figure (the fast path's answer: cheaper for Redis than a table).
    pub(crate) short_reply: Option<i64>,
    /// Whether its own code runs once per item, with the item's names, and the script answers
    /// a table of the items' replies (see [`Self::with_code_per_item`]).
    pub(crate) per_item: bool,
    /// The libraries a script run per item includes once for all its items.
    hoisted: &'static [&'static str],
    /// Its own code.
    pub(crate) code: &'static str,
    /// The whole source and its SHA, built on first use.
    lua: OnceLock<Lua>,
}

/// A script's keys and arguments given once per item of a batch, after the fixed ones: all
/// items' keys follow the fixed keys, and all items' arguments the fixed arguments. The
/// script reads them with `each_item()`, an iterator of the item's number and its values.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Each {
    pub(crate) keys: &'static [&'static str],
    pub(crate) args: &'static [&'static str],
}

impl Each {
    /// No batch.
    pub(crate) const NONE: Self = Self {
        keys: &[],
        args: &[],
    };

    const fn is_none(&self) -> bool {
        self.keys.is_empty() && self.args.is_empty()
    }
}

/// One argument of a script's command.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Arg<'a> {
    /// A word: an owner id, a mode, a channel prefix.
    Text(&'a str),
    /// Bytes as the caller gave them: a value a user writes.
    Bytes(&'a [u8]),
    /// A number, written in decimal.
    Number(u64),
}

impl<'a> From<&'a str> for Arg<'a> {
    fn from(text: &'a str) -> Self {
        Self::Text(text)
    }
}

impl From<u64> for Arg<'_> {
    fn from(number: u64) -> Self {
        Self::Number(number)
    }
}

impl Arg<'_> {
    /// At most how many bytes it takes.
    fn room(&self) -> usize {
        match self {
            Self::Text(text) => text.len(),
            Self::Bytes(bytes) => bytes.len(),
            Self::Number(_) => MAX_NUMBER_LEN,
        }
    }

    fn write_to(&self, cmd: &mut Cmd) {
        match self {
            Self::Text(text) => cmd.arg(*text),
            Self::Bytes(bytes) => cmd.arg(*bytes),
            Self::Number(number) => cmd.arg(*number),
        };
    }
}

impl<const KEYS: usize, const ARGS: usize> ScriptSpec<KEYS, ARGS> {
    /// A script of fixed keys and arguments.
    pub(crate) const fn new(
        file: &'static str,
        code: &'static str,
        keys: [&'static str; KEYS],
        args: [&'static str; ARGS],
        statuses: &'static [&'static [(&'static str, i64)]],
    ) -> Self {
        Self {
            file,
            keys,
            args,
            each: Each::NONE,
            rest: false,
            statuses,
            short_reply: None,
            per_item: false,
            hoisted: &[],
            code,
            lua: OnceLock::new(),
        }
    }

    /// This script, with keys and arguments given once per item of a batch.
    pub(crate) const fn with_each(mut self, each: Each) -> Self {
        self.each = each;
        self
    }

    /// This script, with arguments after the items' ones, as many as the caller gives (a
    /// variable count per item, which the item's own arguments tell): the script reads them
    /// in order with `take_rest(n)`, which returns the next `n`. The items must have keys, by
    /// which their count is known.
    pub(crate) const fn with_rest(mut self) -> Self {
        assert!(!self.each.keys.is_empty(), "the items have keys");
        self.rest = true;
        self
    }

    /// This script, whose own code runs once per item in order, as a function of the item's
    /// keys and arguments (by their names), with the fixed ones and every library it includes
    /// as one call of it would see them; it answers a table of the items' replies. One call
    /// then does the work of many, which Redis charges once: the command, its parsing, the
    /// script's start. The libraries `hoisted` (which read none of the items' names) are
    /// included once, before the items: what they read from Redis they read once per call.
    pub(crate) const fn with_code_per_item(mut self, hoisted: &'static [&'static str]) -> Self {
        assert!(!self.each.is_none(), "the items have keys or arguments");
        self.per_item = true;
        self.hoisted = hoisted;
        self
    }

    /// This script, whose reply of one integer `n` alone stands for `{status, n}`.
    pub(crate) const fn with_short_reply(mut self, status: i64) -> Self {
        self.short_reply = Some(status);
        self
    }

    /// The script as Redis runs it.
    pub(crate) fn lua(&self) -> &Lua {
        self.lua.get_or_init(|| Lua::new(self.source()))
    }

    /// Its whole source as a server runs it: the binding block, and its code with the
    /// libraries it includes.
    pub(crate) fn source(&self) -> String {
        let mut source = self.bindings();
        let item_names = self.each.keys.iter().chain(self.each.args).copied();
        let item_names = item_names.collect::<Vec<_>>().join(", ");
        if self.per_item {
            for name in self.hoisted {
                source.push_str(library(name));
            }
            writeln!(source, "local function run_item({item_names})").expect("a String");
        }
        for line in self.code.split_inclusive('\n') {
            match line.trim_end().strip_prefix(INCLUDE) {
                Some(name) if self.per_item && self.hoisted.contains(&name) => {}
                Some(name) => source.push_str(library(name)),
                None => source.push_str(line),
            }
        }
        if self.per_item {
            write!(
                source,
                "end\nlocal replies = {{}}\nfor n, {item_names} in each_item() do\n  \
                 replies[n] = run_item({item_names})\nend\nreturn replies\n"
            )
            .expect("a String");
        }
        source
    }

    /// The Lua block that binds every key, argument and status to its name.
    pub(crate) fn bindings(&self) -> String {
        let mut block = format!("-- Bound from the description of {}.\n", self.file);
        // Locals: Lua reads them faster than the globals Redis sets.
        block.push_str("local KEYS, ARGV = KEYS, ARGV\n");
        for (position, name) in self.keys.iter().enumerate() {
            writeln!(block, "local {name} = KEYS[{}]", position + 1).expect("a String");
        }
        for (position, name) in self.args.iter().enumerate() {
            writeln!(block, "local {name} = ARGV[{}]", position + 1).expect("a String");
        }
        for (name, value) in self.statuses.iter().flat_map(|group| group.iter()) {
            writeln!(block, "local {name} = {value}").expect("a String");
        }
        for (name, value) in self.layout_names() {
            writeln!(block, "local {name} = '{value}'").expect("a String");
        }
        if !self.each.is_none() {
            block.push_str(&self.each_item());
        }
        if self.rest {
            block.push_str(&self.take_rest());
        }
        block
    }

    /// The names of the data layout its code reads (its own or an included library's), with
    /// their values: bound only where read, so a script pays for no other.
    fn layout_names(&self) -> impl Iterator<Item = (&'static str, &'static str)> + '_ {
        let reads = |name: &str| {
            self.code.contains(name)
                || self.code.lines().any(|line| {
                    line.trim_end()
                        .strip_prefix(INCLUDE)
                        .is_some_and(|library_name| library(library_name).contains(name))
                })
        };
        LUA_BINDINGS
            .iter()
            .copied()
            .filter(move |(name, _)| reads(name))
    }

    /// `take_rest(n)`: the next `n` of the arguments after the items' ones.
    fn take_rest(&self) -> String {
        let (keys, args) = (self.each.keys.len(), self.each.args.len());
        format!(
            "-- After the items' arguments: take_rest(n) returns the next n.\n\
             local rest_at = {ARGS} + (#KEYS - {KEYS}) / {keys} * {args}\n\
             local function take_rest(n)\n  local first = rest_at + 1\n  \
             rest_at = rest_at + n\n  return unpack(ARGV, first, rest_at)\nend\n"
        )
    }

    /// `each_item()`: an iterator of each item's number (from 1) and its keys and arguments.
    fn each_item(&self) -> String {
        let (keys, args) = (self.each.keys.len(), self.each.args.len());
        let mut values = Vec::new();
        for position in 0..keys {
            values.push(format!(
                "KEYS[{KEYS} + (n - 1) * {keys} + {}]",
                position + 1
            ));
        }
        for position in 0..args {
            values.push(format!(
                "ARGV[{ARGS} + (n - 1) * {args} + {}]",
                position + 1
            ));
        }
        let count = if keys > 0 {
            format!("(#KEYS - {KEYS}) / {keys}")
        } else {
            format!("(#ARGV - {ARGS}) / {args}")
        };
        format!(
            "-- Per item: {}.\nlocal function each_item()\n  local n, count = 0, {count}\n  \
             return function()\n    n = n + 1\n    if n > count then\n      return nil\n    \
             end\n    return n, {}\n  end\nend\n",
            self.each
                .keys
                .iter()
                .chain(self.each.args)
                .copied()
                .collect::<Vec<_>>()
                .join(", "),
            values.join(", ")
        )
    }

    /// The `EVALSHA` of this script with `keys` and `args`, sized before it is built: a lock
    /// operation should not allocate per argument, nor grow its buffers.
    pub(crate) fn command(&self, keys: [&str; KEYS], args: [Arg<'_>; ARGS]) -> Cmd {
        self.command_each::<0, 0>(keys, args, &[])
    }

    /// [`Self::command`] with the keys and arguments of each item of a batch.
    pub(crate) fn command_each<const ITEM_KEYS: usize, const ITEM_ARGS: usize>(
        &self,
        keys: [&str; KEYS],
        args: [Arg<'_>; ARGS],
        items: &[([&str; ITEM_KEYS], [Arg<'_>; ITEM_ARGS])],
    ) -> Cmd {
        self.command_with_rest(keys, args, items, &[])
    }

    /// [`Self::command_each`] with the arguments after the items' ones (see
    /// [`Self::with_rest`]).
    pub(crate) fn command_with_rest<const ITEM_KEYS: usize, const ITEM_ARGS: usize>(
        &self,
        keys: [&str; KEYS],
        args: [Arg<'_>; ARGS],
        items: &[([&str; ITEM_KEYS], [Arg<'_>; ITEM_ARGS])],
        rest: &[Arg<'_>],
    ) -> Cmd {
        debug_assert!(self.rest || rest.is_empty(), "{} takes no rest", self.file);
        debug_assert_eq!(
            (ITEM_KEYS, ITEM_ARGS),
            (self.each.keys.len(), self.each.args.len()),
            "the items of {}",
            self.file
        );
        let lua = self.lua();
        let item_keys = items.iter().flat_map(|(keys, _)| keys.iter());
        let item_args = items.iter().flat_map(|(_, args)| args.iter());
        let key_count = KEYS + items.len() * ITEM_KEYS;
        let arg_count = 4 + key_count + ARGS + items.len() * ITEM_ARGS + rest.len();
        let bytes = "EVALSHA".len()
            + lua.sha().len()
            + MAX_NUMBER_LEN
            + keys
                .iter()
                .chain(item_keys.clone())
                .map(|key| key.len())
                .sum::<usize>()
            + args
                .iter()
                .chain(item_args.clone())
                .chain(rest)
                .map(Arg::room)
                .sum::<usize>();
        let mut cmd = lua.evalsha_in(Cmd::with_capacity(arg_count, bytes), key_count);
        for key in keys.iter().chain(item_keys) {
            cmd.arg(*key);
        }
        for arg in args.iter().chain(item_args).chain(rest) {
            arg.write_to(&mut cmd);
        }
        cmd
    }
}

/// `first` and then `more`, as one array of the length the two add up to (checked when it
/// compiles): the keys or arguments a script takes after those every script of its family
/// takes.
pub(crate) const fn joined<const N: usize, const M: usize, const R: usize>(
    first: [&'static str; N],
    more: [&'static str; M],
) -> [&'static str; R] {
    const { assert!(N + M == R, "the joined length is the sum of both") };
    let mut out = [""; R];
    let mut at = 0;
    while at < R {
        out[at] = if at < N { first[at] } else { more[at - N] };
        at += 1;
    }
    out
}

/// [`joined`] for the values a command is built from.
pub(crate) fn joined_values<T: Copy, const N: usize, const M: usize, const R: usize>(
    first: [T; N],
    more: [T; M],
) -> [T; R] {
    const { assert!(N + M == R, "the joined length is the sum of both") };
    std::array::from_fn(|at| if at < N { first[at] } else { more[at - N] })
}

/// The code of the library `name`.
pub(crate) fn library(name: &str) -> &'static str {
    LIBRARIES
        .iter()
        .find_map(|(library, code)| (*library == name).then_some(*code))
        .unwrap_or_else(|| panic!("no Lua library named '{name}'"))
}

/// What every description shows of itself, whatever its counts: for the check of each
/// script's Lua against its description.
#[cfg(test)]
pub(crate) trait Described: Sync {
    fn file(&self) -> &'static str;
    fn code(&self) -> &'static str;
    fn names(&self) -> Vec<&'static str>;
    fn status_names(&self) -> Vec<&'static str>;
    /// The functions its binding block defines (`each_item`, `take_rest`).
    fn bound_functions(&self) -> Vec<&'static str>;
    fn source(&self) -> String;
}

#[cfg(test)]
impl<const KEYS: usize, const ARGS: usize> Described for ScriptSpec<KEYS, ARGS> {
    fn file(&self) -> &'static str {
        self.file
    }

    fn code(&self) -> &'static str {
        self.code
    }

    fn names(&self) -> Vec<&'static str> {
        let statuses = self.statuses.iter().flat_map(|group| group.iter());
        // The code of a script run per item reads the items' names as its own.
        let item_names = self.each.keys.iter().chain(self.each.args);
        let item_names = item_names.filter(|_| self.per_item);
        self.keys
            .iter()
            .chain(&self.args)
            .chain(item_names)
            .copied()
            .chain(statuses.map(|(name, _)| *name))
            .chain(self.layout_names().map(|(name, _)| name))
            .collect()
    }

    fn status_names(&self) -> Vec<&'static str> {
        let statuses = self.statuses.iter().flat_map(|group| group.iter());
        statuses.map(|(name, _)| *name).collect()
    }

    fn bound_functions(&self) -> Vec<&'static str> {
        let each = (!self.each.is_none()).then_some("each_item");
        let rest = self.rest.then_some("take_rest");
        each.into_iter().chain(rest).collect()
    }

    fn source(&self) -> String {
        ScriptSpec::source(self)
    }
}
