//! The documented code can never drift from the API: every block of the README or of a
//! rustdoc page under `src/` marked `<!-- from FILE -->` is a piece of that file (an example
//! or a test), which `cargo test` compiles and runs, and the axum quick start runs here
//! against a real redis-server. (Blocks on rustdoc pages also compile as doc tests; their
//! hidden `# ` lines are the scaffolding, not the piece.)

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::{ChildGuard, RedisServer, example_path};

const MARKER: &str = "<!-- from ";

/// A marked block: the page it is on, the file it comes from, and its shown lines.
struct MarkedBlock {
    page: String,
    source: String,
    lines: Vec<String>,
}

/// The marked blocks of `page`: a rustdoc page hides lines starting with `# `.
fn marked_blocks_of(page: &str, text: &str) -> Vec<MarkedBlock> {
    let mut blocks = Vec::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        let Some(source) = line
            .strip_prefix(MARKER)
            .and_then(|rest| rest.strip_suffix(" -->"))
        else {
            continue;
        };
        let fence = lines.next().unwrap_or_default();
        assert!(
            fence == "```rust" || fence == "```no_run",
            "{page}: a Rust code block follows {line}"
        );
        let shown = lines
            .by_ref()
            .take_while(|line| *line != "```")
            .filter(|line| *line != "#" && !line.starts_with("# "))
            .map(str::to_owned)
            .collect();
        blocks.push(MarkedBlock {
            page: page.to_owned(),
            source: source.to_owned(),
            lines: shown,
        });
    }
    blocks
}

/// Every Markdown page under `folder`.
fn pages_under(folder: &Path) -> Vec<PathBuf> {
    let mut pages = Vec::new();
    for entry in std::fs::read_dir(folder).expect("a readable folder") {
        let path = entry.expect("an entry").path();
        if path.is_dir() {
            pages.extend(pages_under(&path));
        } else if path.extension().is_some_and(|ext| ext == "md") {
            pages.push(path);
        }
    }
    pages
}

/// The README's marked blocks, then those of every rustdoc page under `src/`.
fn marked_blocks() -> (Vec<MarkedBlock>, Vec<MarkedBlock>) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = marked_blocks_of("README.md", include_str!("../README.md"));
    let mut docs = Vec::new();
    for page in pages_under(&root.join("src")) {
        let text = std::fs::read_to_string(&page).expect("a readable page");
        let name = page.strip_prefix(root).unwrap().display().to_string();
        docs.extend(marked_blocks_of(&name, &text));
    }
    (readme, docs)
}

#[test]
fn every_marked_block_is_a_piece_of_its_compiled_example() {
    let (readme, docs) = marked_blocks();
    assert!(
        readme.len() >= 2,
        "the axum and tonic quick starts are marked"
    );
    assert!(
        docs.len() >= 2,
        "the layer page's JSON keys and handler recipe are marked"
    );
    for block in readme.into_iter().chain(docs) {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(&block.source);
        let file = std::fs::read_to_string(&path)
            .unwrap_or_else(|err| panic!("{} named in {}: {err}", block.source, block.page));
        // Indentation aside: an excerpt may come from inside a function.
        let trimmed = |lines: &[String]| -> Vec<String> {
            lines.iter().map(|line| line.trim().to_owned()).collect()
        };
        let wanted = trimmed(&block.lines);
        let lines: Vec<String> = file.lines().map(str::to_owned).collect();
        let found = trimmed(&lines)
            .windows(wanted.len())
            .any(|window| window == wanted.as_slice());
        assert!(
            found,
            "the block of {} from {} is not in it:\n{:#?}",
            block.page, block.source, block.lines
        );
    }
}

#[test]
fn the_axum_quick_start_serves_locked_invoices() {
    let server = RedisServer::start();
    let (addr, _child) = start_quick_start(&server);
    let addr = addr.as_str();

    let first = post(addr, "/tenants/acme/invoices");
    let second = post(addr, "/tenants/acme/invoices");
    let token = |response: &str| -> u64 {
        response
            .rsplit("fencing token ")
            .next()
            .and_then(|rest| rest.trim().parse().ok())
            .unwrap_or_else(|| panic!("no token in {response}"))
    };
    assert!(first.starts_with("HTTP/1.1 200"), "{first}");
    assert!(token(&second) > token(&first), "tokens grow per tenant");
    let health = post_or_get(addr, "GET", "/health");
    assert!(health.starts_with("HTTP/1.1 200") && health.ends_with("ok\n"));
}

/// The quick start drains on SIGTERM: a request waiting for its tenant's lock when the signal
/// comes still gets its answer, no new connection is taken, and the process ends by itself
/// (exit 0, after `shutdown()`), rather than dying with its locks left to their lease.
#[test]
fn the_axum_quick_start_drains_on_sigterm_and_exits() {
    let server = RedisServer::start();
    let (addr, mut child) = start_quick_start(&server);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let holder = runtime.block_on(support::client(&server));
    let lock = holder.lock("acme").unwrap();
    let guard = runtime.block_on(lock.acquire()).unwrap();

    let waiting = std::thread::spawn({
        let addr = addr.clone();
        move || post(&addr, "/tenants/acme/invoices")
    });
    until("the request waits in the lock's queue", || {
        !runtime
            .block_on(holder.inspect("acme"))
            .unwrap()
            .waiters
            .is_empty()
    });
    let pid = child.0.id().to_string();
    let killed = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    assert!(killed.success(), "SIGTERM sent");
    until("the quick start stops taking connections", || {
        TcpStream::connect(&addr).is_err()
    });
    runtime.block_on(guard.release()).unwrap();

    let answer = waiting.join().unwrap();
    assert!(
        answer.starts_with("HTTP/1.1 200"),
        "the waiting request is answered: {answer}"
    );
    until("the quick start exits", || {
        child.0.try_wait().unwrap().is_some()
    });
    let status = child.0.wait().unwrap();
    assert!(
        status.success(),
        "it ends by itself after draining, not by the signal: {status}"
    );
    runtime.block_on(holder.shutdown());
}

/// Starts the quick start on a free port of `server`; its address and the process.
fn start_quick_start(server: &RedisServer) -> (String, ChildGuard) {
    let mut child = ChildGuard(
        Command::new(example_path("quickstart_axum"))
            .env("REDIS_URL", server.url())
            .env("ADDR", "127.0.0.1:0")
            .stdout(Stdio::piped())
            .spawn()
            .expect("the quick start starts"),
    );
    let mut line = String::new();
    BufReader::new(child.0.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected first line: {line}"))
        .to_owned();
    (addr, child)
}

/// Checks `done` every 20 ms until it holds; fails after 20 s, far beyond what each wait
/// here takes (milliseconds), so a loaded machine cannot fail it.
fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within 20 s");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn post(addr: &str, path: &str) -> String {
    post_or_get(addr, "POST", path)
}

/// One HTTP/1.1 request on a fresh connection; the whole response.
fn post_or_get(addr: &str, method: &str, path: &str) -> String {
    let mut stream = TcpStream::connect(addr).unwrap();
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response
}
