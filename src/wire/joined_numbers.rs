//! Numbers a script receives as one argument, joined by spaces: each argument costs Redis a Lua
//! string and room in `ARGV` on every run, so the terms a script reads only on its slower paths
//! travel together.

use std::io::Write;

use crate::wire::args_room::MAX_NUMBER_LEN;

/// How many numbers one argument joins.
pub(crate) const JOINED: usize = 4;

const CAPACITY: usize = JOINED * (MAX_NUMBER_LEN + 1);

/// [`JOINED`] numbers in decimal with a space between each, written on the stack: a lock
/// operation allocates nothing per argument.
pub(crate) struct JoinedNumbers {
    bytes: [u8; CAPACITY],
    len: usize,
}

impl JoinedNumbers {
    /// `numbers` joined.
    pub(crate) fn new(numbers: [u64; JOINED]) -> Self {
        let mut bytes = [0; CAPACITY];
        let mut free = &mut bytes[..];
        for (index, number) in numbers.iter().enumerate() {
            let separator = if index == 0 { "" } else { " " };
            write!(free, "{separator}{number}").expect("room for JOINED numbers");
        }
        let len = CAPACITY - free.len();
        Self { bytes, len }
    }

    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_joined_by_single_spaces_up_to_the_longest() {
        assert_eq!(
            JoinedNumbers::new([3000, 0, 7, 30000]).as_bytes(),
            b"3000 0 7 30000"
        );
        let longest = JoinedNumbers::new([u64::MAX; JOINED]);
        assert_eq!(longest.as_bytes().len(), CAPACITY - 1);
    }
}
