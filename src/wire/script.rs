//! One description per Lua script, shared by Rust and Lua: its inputs, one typed struct whose
//! fields name its keys and arguments in order (`script_inputs.rs`), and its reply statuses,
//! named, each with the struct of the values that follow it (`script_reply.rs`). From it the
//! command is sized and written, and the Lua block that binds the names
//! (`local OWNER = ARGV[2]`) is put before the script's own code, so no position is written
//! twice and a script reads its inputs by name. A batch gives each item the same keys and
//! arguments, a struct of their own (`each_item()`); what varies per item in length follows
//! all the items, in the order the items' own arguments count it (`take_rest(n)`).
//!
//! A script's source is the binding block, then its own file, in which a line
//! `--#include <library>` stands for a library of shared functions from `lua/lib/`. A
//! cluster client runs it after `lua/cluster.lua`, which stops it in a migrating slot.
//! Where the include stands is where Lua creates those of its functions that the script calls
//! (`script_library.rs`), each time the script runs past it: a script includes what its fast
//! path needs first, and the rest after it or inside the function that alone needs it.

use std::fmt::Write;
use std::marker::PhantomData;
use std::sync::OnceLock;

use redis::Cmd;

use crate::layout::LUA_BINDINGS;
use crate::wire::lua::Lua;
use crate::wire::script_inputs::{Arg, Inputs, MAX_NUMBER_LEN, script_inputs};
use crate::wire::script_library::{INCLUDE, cut, functions_used, library};
use crate::wire::script_reply::{ScriptReply, Status};

/// What a script run per item that takes locks free (`take_free`) runs after its last item:
/// the tokens its items took that way are written to the counter once, there
/// (`lua/lib/counter.lua`).
const COUNTER_AFTER_ITEMS: &str = "catch_up_counter()\n";

/// What such a script says before its items, past the counter's library: only then may a
/// reservation leave the counter behind for [`COUNTER_AFTER_ITEMS`].
const COUNTER_BEFORE_ITEMS: &str = "counter_caught_up_after_items = true\n";

/// The flags of a script's function that must run when Redis is over `maxmemory`, as a
/// script that writes only what frees or keeps (a release, a renewal, a heartbeat) runs there:
/// a function without them is refused at its start.
pub(crate) const RUNS_OVER_MAXMEMORY: &[&str] = &["allow-oom"];

/// The flags of a script's function that writes nothing (it runs over `maxmemory` too).
pub(crate) const READS_ONLY: &[&str] = &["no-writes"];

/// A Lua script, described: it takes the inputs `I`, and per item of a batch the inputs `E`.
pub(crate) struct ScriptSpec<I: Inputs, E: Inputs = NoItems> {
    /// The file of its own code under `lua/`.
    pub(crate) file: &'static str,
    /// Whether it takes a batch of items after its own keys and arguments.
    each: bool,
    /// Whether arguments follow the items' ones, as many as the caller gives (see
    /// [`Self::with_rest`]).
    pub(crate) rest: bool,
    /// The groups of named statuses its replies start with.
    pub(crate) statuses: &'static [&'static [Status]],
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
    /// The flags of its function when a server runs it as one (`function_library.rs`): a
    /// function without `allow-oom` does not start when Redis is over `maxmemory`.
    function_flags: &'static [&'static str],
    /// The whole source and its SHA, built on first use.
    lua: OnceLock<Lua>,
    inputs: PhantomData<fn() -> (I, E)>,
}

script_inputs! {
    /// The items of a script that takes no batch.
    pub(crate) struct NoItems {
        keys {}
        args {}
    }
}

impl<I: Inputs, E: Inputs> ScriptSpec<I, E> {
    /// A script; it takes a batch when `E` has keys or arguments.
    pub(crate) const fn new(
        file: &'static str,
        code: &'static str,
        statuses: &'static [&'static [Status]],
    ) -> Self {
        Self {
            file,
            each: E::KEY_COUNT + E::ARG_COUNT > 0,
            rest: false,
            statuses,
            short_reply: None,
            per_item: false,
            hoisted: &[],
            code,
            function_flags: &[],
            lua: OnceLock::new(),
            inputs: PhantomData,
        }
    }

    /// This script, with arguments after the items' ones, as many as the caller gives (a
    /// variable count per item, which the item's own arguments tell): the script reads them
    /// in order with `take_rest(n)`, which returns the next `n`. The items must have keys, by
    /// which their count is known.
    pub(crate) const fn with_rest(mut self) -> Self {
        assert!(E::KEY_COUNT > 0, "the items have keys");
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
        assert!(self.each, "the items have keys or arguments");
        self.per_item = true;
        self.hoisted = hoisted;
        self
    }

    /// This script, whose function (on a server that runs it as one) has `flags`.
    pub(crate) const fn with_function_flags(mut self, flags: &'static [&'static str]) -> Self {
        self.function_flags = flags;
        self
    }

    /// This script, whose reply of one integer `n` alone stands for `{status, n}`.
    pub(crate) const fn with_short_reply(mut self, status: i64) -> Self {
        self.short_reply = Some(status);
        self
    }

    /// The script as Redis runs it.
    pub(crate) fn lua(&self) -> &Lua {
        self.lua
            .get_or_init(|| Lua::new(self.file, self.source(), self.function_flags))
    }

    /// Runs `cmd`, one of this script's commands, and reads its reply.
    pub(crate) async fn run(
        &self,
        conn: &mut crate::wire::conn::Conn,
        cmd: &Cmd,
    ) -> redis::RedisResult<ScriptReply> {
        let value = self.lua().run(conn, cmd).await?;
        ScriptReply::read(self.file, value, self.short_reply)
    }

    /// The Lua names of its keys, its arguments, and its items' keys and arguments.
    fn input_names() -> [Vec<&'static str>; 4] {
        let mut names = [Vec::new(), Vec::new(), Vec::new(), Vec::new()];
        I::key_names(&mut names[0]);
        I::arg_names(&mut names[1]);
        E::key_names(&mut names[2]);
        E::arg_names(&mut names[3]);
        names
    }

    /// The names of one item's keys and arguments, in order.
    fn item_names() -> Vec<&'static str> {
        let [_, _, item_keys, item_args] = Self::input_names();
        item_keys.into_iter().chain(item_args).collect()
    }

    /// Its whole source as a server runs it: the binding block, and its code with the
    /// libraries it includes.
    pub(crate) fn source(&self) -> String {
        let mut source = self.bindings();
        let item_names = Self::item_names().join(", ");
        let mut used = functions_used(self.code);
        let (before_items, after_items) = if self.per_item && used.contains("take_free") {
            assert!(
                self.hoisted.contains(&"counter"),
                "{}: the counter is written after the items it is hoisted before",
                self.file
            );
            used.insert("catch_up_counter");
            (COUNTER_BEFORE_ITEMS, COUNTER_AFTER_ITEMS)
        } else {
            ("", "")
        };
        if self.per_item {
            for name in self.hoisted {
                source.push_str(&cut(library(name), &used));
            }
            source.push_str(before_items);
            writeln!(source, "local function run_item({item_names})").expect("a String");
        }
        for line in self.code.split_inclusive('\n') {
            match line.trim_end().strip_prefix(INCLUDE) {
                Some(name) if self.per_item && self.hoisted.contains(&name) => {}
                Some(name) => source.push_str(&cut(library(name), &used)),
                None => source.push_str(line),
            }
        }
        if self.per_item {
            write!(
                source,
                "end\nlocal replies = {{}}\nfor n, {item_names} in each_item() do\n  \
                 replies[n] = run_item({item_names})\nend\n{after_items}return replies\n"
            )
            .expect("a String");
        }
        source
    }

    /// The Lua block that binds every key, argument and status to its name.
    pub(crate) fn bindings(&self) -> String {
        let [keys, args, _, _] = Self::input_names();
        let mut block = format!("-- Bound from the description of {}.\n", self.file);
        // Locals: Lua reads them faster than the globals Redis sets.
        block.push_str("local KEYS, ARGV = KEYS, ARGV\n");
        for (position, name) in keys.iter().enumerate() {
            writeln!(block, "local {name} = KEYS[{}]", position + 1).expect("a String");
        }
        for (position, name) in args.iter().enumerate() {
            writeln!(block, "local {name} = ARGV[{}]", position + 1).expect("a String");
        }
        for status in self.statuses.iter().flat_map(|group| group.iter()) {
            writeln!(block, "local {} = {}", status.name, status.value).expect("a String");
        }
        for (name, value) in self.layout_names() {
            writeln!(block, "local {name} = '{value}'").expect("a String");
        }
        if self.each {
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
        let (keys, args) = (I::KEY_COUNT, I::ARG_COUNT);
        let (item_keys, item_args) = (E::KEY_COUNT, E::ARG_COUNT);
        format!(
            "-- After the items' arguments: take_rest(n) returns the next n.\n\
             local rest_at = {args} + (#KEYS - {keys}) / {item_keys} * {item_args}\n\
             local function take_rest(n)\n  local first = rest_at + 1\n  \
             rest_at = rest_at + n\n  return unpack(ARGV, first, rest_at)\nend\n"
        )
    }

    /// `each_item()`: an iterator of each item's number (from 1) and its keys and arguments.
    fn each_item(&self) -> String {
        let (keys, args) = (I::KEY_COUNT, I::ARG_COUNT);
        let (item_keys, item_args) = (E::KEY_COUNT, E::ARG_COUNT);
        let mut values = Vec::new();
        for position in 0..item_keys {
            values.push(format!(
                "KEYS[{keys} + (n - 1) * {item_keys} + {}]",
                position + 1
            ));
        }
        for position in 0..item_args {
            values.push(format!(
                "ARGV[{args} + (n - 1) * {item_args} + {}]",
                position + 1
            ));
        }
        let count = if item_keys > 0 {
            format!("(#KEYS - {keys}) / {item_keys}")
        } else {
            format!("(#ARGV - {args}) / {item_args}")
        };
        format!(
            "-- Per item: {}.\nlocal function each_item()\n  local n, count = 0, {count}\n  \
             return function()\n    n = n + 1\n    if n > count then\n      return nil\n    \
             end\n    return n, {}\n  end\nend\n",
            Self::item_names().join(", "),
            values.join(", ")
        )
    }

    /// The call of this script with `inputs`, sized before it is built: a lock
    /// operation should not allocate per argument, nor grow its buffers.
    pub(crate) fn command(&self, inputs: &I::Borrowing<'_>) -> Cmd {
        self.command_each(inputs, &[])
    }

    /// [`Self::command`] with the inputs of each item of a batch.
    pub(crate) fn command_each(
        &self,
        inputs: &I::Borrowing<'_>,
        items: &[E::Borrowing<'_>],
    ) -> Cmd {
        self.command_with_rest(inputs, items, &[])
    }

    /// [`Self::command_each`] with the arguments after the items' ones (see
    /// [`Self::with_rest`]).
    pub(crate) fn command_with_rest(
        &self,
        inputs: &I::Borrowing<'_>,
        items: &[E::Borrowing<'_>],
        rest: &[Arg<'_>],
    ) -> Cmd {
        debug_assert!(self.rest || rest.is_empty(), "{} takes no rest", self.file);
        debug_assert!(
            self.each || items.is_empty(),
            "{} takes no items",
            self.file
        );
        let lua = self.lua();
        let key_count = I::KEY_COUNT + items.len() * E::KEY_COUNT;
        let arg_count = 4 + key_count + I::ARG_COUNT + items.len() * E::ARG_COUNT + rest.len();
        let mut bytes = "FCALL".len() + lua.name().len() + MAX_NUMBER_LEN;
        let mut count_key = |key: &str| bytes += key.len();
        inputs.keys(&mut count_key);
        items.iter().for_each(|item| item.keys(&mut count_key));
        let mut count_arg = |arg: Arg<'_>| bytes += arg.room();
        inputs.args(&mut count_arg);
        items.iter().for_each(|item| item.args(&mut count_arg));
        rest.iter().copied().for_each(count_arg);
        let mut cmd = lua.call_in(Cmd::with_capacity(arg_count, bytes), key_count);
        let mut write_key = |key: &str| {
            cmd.arg(key);
        };
        inputs.keys(&mut write_key);
        items.iter().for_each(|item| item.keys(&mut write_key));
        let mut write_arg = |arg: Arg<'_>| arg.write_to(&mut cmd);
        inputs.args(&mut write_arg);
        items.iter().for_each(|item| item.args(&mut write_arg));
        rest.iter().copied().for_each(write_arg);
        cmd
    }
}

/// What every description shows of itself, whatever its counts: for the check of each
/// script's Lua against its description.
#[cfg(test)]
pub(crate) trait Described: Sync {
    fn file(&self) -> &'static str;
    fn code(&self) -> &'static str;
    fn names(&self) -> Vec<&'static str>;
    fn statuses(&self) -> Vec<Status>;
    /// The functions its binding block defines (`each_item`, `take_rest`).
    fn bound_functions(&self) -> Vec<&'static str>;
    fn source(&self) -> String;
}

#[cfg(test)]
impl<I: Inputs, E: Inputs> Described for ScriptSpec<I, E> {
    fn file(&self) -> &'static str {
        self.file
    }

    fn code(&self) -> &'static str {
        self.code
    }

    fn names(&self) -> Vec<&'static str> {
        let [keys, args, item_keys, item_args] = Self::input_names();
        let statuses = self.statuses.iter().flat_map(|group| group.iter());
        // The code of a script run per item reads the items' names as its own.
        let item_names = item_keys.into_iter().chain(item_args);
        let item_names = item_names.filter(|_| self.per_item);
        keys.into_iter()
            .chain(args)
            .chain(item_names)
            .chain(statuses.map(|status| status.name))
            .chain(self.layout_names().map(|(name, _)| name))
            .collect()
    }

    fn statuses(&self) -> Vec<Status> {
        self.statuses
            .iter()
            .flat_map(|group| group.iter())
            .copied()
            .collect()
    }

    fn bound_functions(&self) -> Vec<&'static str> {
        let each = self.each.then_some("each_item");
        let rest = self.rest.then_some("take_rest");
        each.into_iter().chain(rest).collect()
    }

    fn source(&self) -> String {
        ScriptSpec::source(self)
    }
}
