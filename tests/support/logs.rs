//! The log lines the library writes, captured for assertions.
//!
//! The capture is the calling thread's default subscriber, so it sees everything a
//! `#[tokio::test]` (a current-thread runtime) does: the test's own futures and every task
//! the client spawns on that runtime.

use std::io::Write;
use std::sync::{Arc, Mutex};

use tracing::subscriber::DefaultGuard;

/// Log lines (INFO and above) written on this thread until dropped.
pub struct CapturedLogs {
    written: Arc<Mutex<Vec<u8>>>,
    _guard: DefaultGuard,
}

/// Where the subscriber writes: the shared buffer.
struct Sink(Arc<Mutex<Vec<u8>>>);

impl Write for Sink {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl CapturedLogs {
    /// Starts capturing on this thread.
    pub fn start() -> Self {
        let written = Arc::new(Mutex::new(Vec::new()));
        let sink = written.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::INFO)
            .with_writer(move || Sink(sink.clone()))
            .finish();
        Self {
            written,
            _guard: tracing::subscriber::set_default(subscriber),
        }
    }

    /// Every line so far.
    pub fn lines(&self) -> Vec<String> {
        String::from_utf8_lossy(&self.written.lock().unwrap())
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// The lines so far that contain `text`.
    pub fn lines_with(&self, text: &str) -> Vec<String> {
        self.lines()
            .into_iter()
            .filter(|line| line.contains(text))
            .collect()
    }
}
