//! A server wall clock a test can step: `clock_shim.c`, built here with `cc` and loaded into
//! the server with LD_PRELOAD, adds the offset this file holds to its wall clock. Steps of
//! any size and direction, at any moment, as NTP makes them; the monotonic clock goes on.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

/// The wall clock of the servers started with it (see `RedisServer::start_with_clock`).
#[derive(Debug)]
pub struct FakeClock {
    file: PathBuf,
    offset_us: std::sync::atomic::AtomicI64,
}

impl FakeClock {
    /// A clock that starts on time.
    pub fn new() -> Self {
        let file = std::env::temp_dir().join(format!(
            "tower-redis-lock-clock-{}-{}",
            std::process::id(),
            rand::random::<u64>()
        ));
        std::fs::write(&file, 0i64.to_le_bytes()).expect("write the clock file");
        Self {
            file,
            offset_us: std::sync::atomic::AtomicI64::new(0),
        }
    }

    /// Steps the clock by `by` (forward), or back with [`FakeClock::step_back`].
    pub fn step_forward(&self, by: Duration) {
        self.set_offset(self.offset() + by.as_micros() as i64);
    }

    /// Steps the clock back by `by`.
    pub fn step_back(&self, by: Duration) {
        self.set_offset(self.offset() - by.as_micros() as i64);
    }

    /// How far the clock is from the real one now, in µs (negative: behind).
    pub fn offset(&self) -> i64 {
        self.offset_us.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Puts the clock `offset_us` µs from the real one.
    pub fn set_offset(&self, offset_us: i64) {
        self.offset_us
            .store(offset_us, std::sync::atomic::Ordering::SeqCst);
        // In place: the servers map the file, and a truncation would fault them.
        File::options()
            .write(true)
            .open(&self.file)
            .and_then(|file| file.write_all_at(&offset_us.to_le_bytes(), 0))
            .expect("step the clock");
    }

    /// The environment a server needs to run on this clock.
    pub fn env(&self) -> Vec<(String, String)> {
        vec![
            ("LD_PRELOAD".to_owned(), shim().display().to_string()),
            (
                "FAKE_CLOCK_FILE".to_owned(),
                self.file.display().to_string(),
            ),
        ]
    }
}

impl Default for FakeClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for FakeClock {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.file);
    }
}

/// The shim, built once per test process.
fn shim() -> &'static Path {
    static SHIM: OnceLock<PathBuf> = OnceLock::new();
    SHIM.get_or_init(|| {
        let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/clock_shim.c");
        let out = std::env::temp_dir().join(format!(
            "tower-redis-lock-clock-shim-{}.so",
            std::process::id()
        ));
        let status = Command::new("cc")
            .args(["-shared", "-fPIC", "-O2", "-o"])
            .arg(&out)
            .arg(&source)
            .status()
            .expect("run cc to build the clock shim (./scripts/setup.sh installs it)");
        assert!(status.success(), "cc could not build the clock shim");
        out
    })
}
