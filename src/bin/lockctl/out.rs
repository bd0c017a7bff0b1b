//! Standard output that outlives its reader: `lockctl list | head` and `lockctl --help |
//! grep -q` close the pipe early, and `print!` would panic there (Rust ignores SIGPIPE).
//! A command whose reader has gone carries on to its own end (a `hold` still releases its
//! lock) and its output is dropped; `watch` stops.

use std::fmt::Arguments;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

/// Set once a write to standard output failed: nobody reads what follows.
static READER_GONE: AtomicBool = AtomicBool::new(false);

/// Writes and flushes, so a reader sees each line as it happens; a failure marks the reader
/// gone and is otherwise ignored.
pub(crate) fn write(text: Arguments<'_>) {
    if READER_GONE.load(Ordering::Relaxed) {
        return;
    }
    let mut stdout = std::io::stdout().lock();
    if stdout
        .write_fmt(text)
        .and_then(|()| stdout.flush())
        .is_err()
    {
        READER_GONE.store(true, Ordering::Relaxed);
    }
}

/// Whether standard output's reader has gone, so an endless command can stop.
pub(crate) fn reader_gone() -> bool {
    READER_GONE.load(Ordering::Relaxed)
}

/// `print!` that never panics on a closed pipe.
macro_rules! say {
    ($($text:tt)*) => { $crate::out::write(format_args!($($text)*)) };
}

/// `println!` that never panics on a closed pipe.
macro_rules! sayln {
    ($($text:tt)*) => { $crate::out::write(format_args!("{}\n", format_args!($($text)*))) };
}

pub(crate) use {say, sayln};

/// One JSON event a line on stdout, so scripts and tests follow `hold` as it happens.
pub(crate) fn emit(event: serde_json::Value) {
    sayln!("{event}");
}
