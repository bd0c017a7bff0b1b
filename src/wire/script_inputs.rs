//! A script's keys and arguments as one typed struct (see [`script_inputs!`]): each field's
//! name, in capitals, is the name the script's Lua reads, and the fields' order is the order
//! of the command. A value is then given by name where the command is built, and a script
//! takes no other struct than its own.

use std::fmt::Write as _;

use redis::Cmd;

/// The longest number a command carries: a `u64` in decimal.
pub(crate) const MAX_NUMBER_LEN: usize = 20;

/// One argument of a script's command.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Arg<'a> {
    /// A word: an owner id, a mode, a channel prefix.
    Text(&'a str),
    /// Bytes as the caller gave them: a value a user writes.
    Bytes(&'a [u8]),
    /// A number, written in decimal.
    Number(u64),
    /// Numbers in decimal and a word, each after a space but the first: terms that travel
    /// as one argument (Redis spends about 1,100 instructions on each argument of a call).
    Joined(&'a [u64], &'a str),
}

impl Arg<'_> {
    /// At most how many bytes it takes.
    pub(crate) fn room(&self) -> usize {
        match self {
            Self::Text(text) => text.len(),
            Self::Bytes(bytes) => bytes.len(),
            Self::Number(_) => MAX_NUMBER_LEN,
            Self::Joined(numbers, word) => numbers.len() * (MAX_NUMBER_LEN + 1) + word.len(),
        }
    }

    pub(crate) fn write_to(&self, cmd: &mut Cmd) {
        match self {
            Self::Text(text) => cmd.arg(*text),
            Self::Bytes(bytes) => cmd.arg(*bytes),
            Self::Number(number) => cmd.arg(*number),
            Self::Joined(numbers, word) => {
                let mut joined = String::with_capacity(self.room());
                for number in *numbers {
                    write!(joined, "{number} ").expect("a String");
                }
                joined.push_str(word);
                cmd.arg(joined)
            }
        };
    }
}

/// Declares a script's inputs: a struct with a `keys` section and an `args` section, each
/// field one key or argument (named in Lua as the field in capitals), or a group of them
/// (another such struct, whose fields stand in its place and whose own field name is not
/// bound).
macro_rules! script_inputs {
    (
        $(#[$doc:meta])*
        $vis:vis struct $name:ident<$lifetime:lifetime> { $($fields:tt)* }
    ) => {
        $crate::wire::script_inputs::script_inputs!(
            @define [$(#[$doc])*] $vis $name [<$lifetime>] [$name<'b>] { $($fields)* }
        );
    };
    (
        $(#[$doc:meta])*
        $vis:vis struct $name:ident { $($fields:tt)* }
    ) => {
        $crate::wire::script_inputs::script_inputs!(
            @define [$(#[$doc])*] $vis $name [] [$name] { $($fields)* }
        );
    };
    (
        @define [$(#[$doc:meta])*] $vis:vis $name:ident [$($generics:tt)*] [$($borrowing:tt)*] {
            keys { $($(#[$key_doc:meta])* $key:ident: $key_type:ty),* $(,)? }
            args { $($(#[$arg_doc:meta])* $arg:ident: $arg_type:ty),* $(,)? }
        }
    ) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy)]
        $vis struct $name $($generics)* {
            $($(#[$key_doc])* pub(crate) $key: $key_type,)*
            $($(#[$arg_doc])* pub(crate) $arg: $arg_type,)*
        }

        impl $($generics)* $crate::wire::script_inputs::Inputs for $name $($generics)* {
            type Borrowing<'b> = $($borrowing)*;
            const KEY_COUNT: usize =
                0 $(+ <$key_type as $crate::wire::script_inputs::KeyField>::COUNT)*;
            const ARG_COUNT: usize =
                0 $(+ <$arg_type as $crate::wire::script_inputs::ArgField>::COUNT)*;

            fn key_names(names: &mut Vec<&'static str>) {
                $(<$key_type as $crate::wire::script_inputs::KeyField>::names(
                    $crate::wire::script_inputs::lua_name!($key),
                    names,
                );)*
                let _ = names;
            }

            fn arg_names(names: &mut Vec<&'static str>) {
                $(<$arg_type as $crate::wire::script_inputs::ArgField>::names(
                    $crate::wire::script_inputs::lua_name!($arg),
                    names,
                );)*
                let _ = names;
            }

            fn keys<'s>(&'s self, visit: &mut impl FnMut(&'s str)) {
                $($crate::wire::script_inputs::KeyField::visit(&self.$key, visit);)*
                let _ = visit;
            }

            fn args<'s>(&'s self, visit: &mut impl FnMut($crate::wire::script_inputs::Arg<'s>)) {
                $($crate::wire::script_inputs::ArgField::visit(&self.$arg, visit);)*
                let _ = visit;
            }
        }

        impl $($generics)* $crate::wire::script_inputs::KeyField for $name $($generics)* {
            const COUNT: usize = <Self as $crate::wire::script_inputs::Inputs>::KEY_COUNT;

            fn names(_group: &'static str, names: &mut Vec<&'static str>) {
                <Self as $crate::wire::script_inputs::Inputs>::key_names(names);
            }

            fn visit<'s>(&'s self, visit: &mut impl FnMut(&'s str)) {
                $crate::wire::script_inputs::Inputs::keys(self, visit);
            }
        }

        impl $($generics)* $crate::wire::script_inputs::ArgField for $name $($generics)* {
            const COUNT: usize = <Self as $crate::wire::script_inputs::Inputs>::ARG_COUNT;

            fn names(_group: &'static str, names: &mut Vec<&'static str>) {
                <Self as $crate::wire::script_inputs::Inputs>::arg_names(names);
            }

            fn visit<'s>(&'s self, visit: &mut impl FnMut($crate::wire::script_inputs::Arg<'s>)) {
                $crate::wire::script_inputs::Inputs::args(self, visit);
            }
        }
    };
}
pub(crate) use script_inputs;

/// The Lua name of a field: its name in capitals, made when the crate compiles.
macro_rules! lua_name {
    ($field:ident) => {
        const {
            const CAPITALS: [u8; stringify!($field).len()] =
                $crate::wire::script_inputs::capitals(stringify!($field));
            match ::core::str::from_utf8(&CAPITALS) {
                Ok(name) => name,
                Err(_) => panic!("a field's name is ASCII"),
            }
        }
    };
}
pub(crate) use lua_name;

/// `name` in capitals.
pub(crate) const fn capitals<const N: usize>(name: &str) -> [u8; N] {
    let bytes = name.as_bytes();
    let mut out = [0; N];
    let mut at = 0;
    while at < N {
        out[at] = bytes[at].to_ascii_uppercase();
        at += 1;
    }
    out
}

/// A script's keys and arguments, named and in order (made by [`script_inputs!`]).
pub(crate) trait Inputs {
    /// The same inputs, borrowing their values for `'b`: a script is described with the
    /// `'static` type and called with this one.
    type Borrowing<'b>: Inputs;
    /// How many keys.
    const KEY_COUNT: usize;
    /// How many arguments.
    const ARG_COUNT: usize;
    /// The keys' Lua names, in order.
    fn key_names(names: &mut Vec<&'static str>);
    /// The arguments' Lua names, in order.
    fn arg_names(names: &mut Vec<&'static str>);
    /// The keys, in order.
    fn keys<'s>(&'s self, visit: &mut impl FnMut(&'s str));
    /// The arguments, in order.
    fn args<'s>(&'s self, visit: &mut impl FnMut(Arg<'s>));
}

/// A field of the `keys` section: one key, or a group of them.
pub(crate) trait KeyField {
    /// How many keys it gives.
    const COUNT: usize;
    /// Its Lua names, for a field called `name` (in capitals).
    fn names(name: &'static str, names: &mut Vec<&'static str>);
    /// Its keys, in order.
    fn visit<'s>(&'s self, visit: &mut impl FnMut(&'s str));
}

/// A field of the `args` section: one argument, or a group of them.
pub(crate) trait ArgField {
    /// How many arguments it gives.
    const COUNT: usize;
    /// Its Lua names, for a field called `name` (in capitals).
    fn names(name: &'static str, names: &mut Vec<&'static str>);
    /// Its arguments, in order.
    fn visit<'s>(&'s self, visit: &mut impl FnMut(Arg<'s>));
}

impl KeyField for &str {
    const COUNT: usize = 1;

    fn names(name: &'static str, names: &mut Vec<&'static str>) {
        names.push(name);
    }

    fn visit<'s>(&'s self, visit: &mut impl FnMut(&'s str)) {
        visit(self);
    }
}

/// An argument of one value.
pub(crate) trait OneArg {
    /// As the command carries it.
    fn arg(&self) -> Arg<'_>;
}

impl<T: OneArg> ArgField for T {
    const COUNT: usize = 1;

    fn names(name: &'static str, names: &mut Vec<&'static str>) {
        names.push(name);
    }

    fn visit<'s>(&'s self, visit: &mut impl FnMut(Arg<'s>)) {
        visit(self.arg());
    }
}

impl OneArg for &str {
    fn arg(&self) -> Arg<'_> {
        Arg::Text(self)
    }
}

impl OneArg for u64 {
    fn arg(&self) -> Arg<'_> {
        Arg::Number(*self)
    }
}

/// A yes-or-no argument, as the scripts read it: `yes` or `no`.
impl OneArg for bool {
    fn arg(&self) -> Arg<'_> {
        Arg::Text(yes_or_no(*self))
    }
}

/// A yes or a no as the scripts read it.
pub(crate) const fn yes_or_no(yes: bool) -> &'static str {
    if yes { "yes" } else { "no" }
}

#[cfg(test)]
mod tests {
    use super::*;

    script_inputs! {
        /// A group of two keys.
        struct Pair<'a> {
            keys { first_key: &'a str, second_key: &'a str }
            args {}
        }
    }

    script_inputs! {
        /// Keys with a group among them, and arguments of each kind.
        struct Sample<'a> {
            keys { pair: Pair<'a>, last_key: &'a str }
            args { owner: &'a str, lease_ms: u64, keeps_writes: bool }
        }
    }

    #[test]
    fn joined_terms_travel_as_one_argument_within_their_room() {
        let mut cmd = redis::cmd("EVALSHA");
        let joined = Arg::Joined(&[u64::MAX, 0, 30_000], "no");
        joined.write_to(&mut cmd);
        let written: Vec<&[u8]> = cmd
            .args_iter()
            .filter_map(|arg| match arg {
                redis::Arg::Simple(bytes) => Some(bytes),
                _ => None,
            })
            .collect();
        let expected = format!("{} 0 30000 no", u64::MAX);
        assert_eq!(written, [b"EVALSHA".as_slice(), expected.as_bytes()]);
        assert!(joined.room() >= expected.len());
    }

    #[test]
    fn fields_give_the_lua_names_and_the_order_and_a_group_stands_in_its_place() {
        let (mut keys, mut args) = (Vec::new(), Vec::new());
        Sample::key_names(&mut keys);
        Sample::arg_names(&mut args);
        assert_eq!(keys, ["FIRST_KEY", "SECOND_KEY", "LAST_KEY"]);
        assert_eq!(args, ["OWNER", "LEASE_MS", "KEEPS_WRITES"]);
        assert_eq!((Sample::KEY_COUNT, Sample::ARG_COUNT), (3, 3));
        let sample = Sample {
            pair: Pair {
                first_key: "a",
                second_key: "b",
            },
            last_key: "c",
            owner: "o",
            lease_ms: 30_000,
            keeps_writes: false,
        };
        let mut values = Vec::new();
        sample.keys(&mut |key| values.push(key.to_owned()));
        sample.args(&mut |arg| values.push(format!("{arg:?}")));
        assert_eq!(
            values,
            [
                "a",
                "b",
                "c",
                "Text(\"o\")",
                "Number(30000)",
                "Text(\"no\")"
            ]
        );
    }
}
