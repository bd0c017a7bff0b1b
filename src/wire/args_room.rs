//! How much room a command's arguments take, counted before it is built.

/// The longest number a command carries: a `u64` in decimal.
pub(crate) const MAX_NUMBER_LEN: usize = 20;

/// Room for a command's arguments: how many, and at most how many bytes, so the command is
/// sized once and its buffers never grow.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ArgsRoom {
    pub(crate) args: usize,
    pub(crate) bytes: usize,
}

impl ArgsRoom {
    /// No arguments.
    pub(crate) const NONE: Self = Self { args: 0, bytes: 0 };

    /// And `words` (keys, owner ids, modes, roles).
    pub(crate) fn words<'a>(mut self, words: impl IntoIterator<Item = &'a str>) -> Self {
        for word in words {
            self.args += 1;
            self.bytes += word.len();
        }
        self
    }

    /// And `count` numbers.
    pub(crate) fn numbers(mut self, count: usize) -> Self {
        self.args += count;
        self.bytes += count * MAX_NUMBER_LEN;
        self
    }

    /// And one argument of `count` numbers joined by spaces (see `joined_numbers.rs`).
    pub(crate) fn joined_numbers(mut self, count: usize) -> Self {
        self.args += 1;
        self.bytes += count * (MAX_NUMBER_LEN + 1);
        self
    }
}
