//! AUTH, ACL users and TLS against real redis-server processes: what works with the right
//! credentials and certificates, and what a client gets, quickly and typed, without them.

mod support;

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use support::tls::TestPki;
use support::{RedisServer, acquire_within, eventually, queued, subscribers, wake_channel};
use tower_redis_lock::{ErrorKind, Lease, LockClient, LockClientBuilder, LockGuard};

/// Bound for waits that normally take milliseconds; generous because CI machines are shared
/// and a debug build on two cores can stall for a while.
const SLACK: Duration = Duration::from_secs(2);

/// The command timeout of clients expected to be refused: a refusal must come well within it.
const REFUSAL_BOUND: Duration = Duration::from_secs(2);

/// Every command the library sends, at the top level or from its scripts, as the ACL line of
/// the security chapter (`src/guide/security.md`) grants them.
const LIBRARY_COMMANDS: &str = "-@all +fcall +function|load +function|list +function|delete \
    +evalsha +script|load +eval +exists +hexists +hget +hgetall +hset +hincrby +hdel +del +get +set \
    +pexpire +pttl +time +lastsave +zadd +zrange +zrangebyscore +zremrangebyscore +zrem +zscore \
    +zpopmin +publish +subscribe +ping +unwatch +info";

/// The commands of [`LIBRARY_COMMANDS`] that run the scripts as Redis Functions.
const FUNCTION_COMMANDS: &str = " +fcall +function|load +function|list +function|delete";

const PASSWORD: &str = "s3cret-pass";

/// The keys the library's user is granted: the prefix's, and the witness of a promotion
/// that every prefix shares.
const LIBRARY_KEYS: &str = "~lock:* ~tower-redis-lock:promoted*";

/// Creates the ACL user `name` (password [`PASSWORD`]) with the keys and channels given and
/// `commands`.
fn add_user(server: &RedisServer, name: &str, keys: &str, channels: &str, commands: &str) {
    // Redis 6.2 knows no functions, and refuses to grant them.
    let commands = if support::has_functions(server) {
        commands.to_owned()
    } else {
        commands.replace(FUNCTION_COMMANDS, "")
    };
    let rules = format!("reset on >{PASSWORD} {keys} resetchannels {channels} {commands}");
    let mut args = vec!["ACL", "SETUSER", name];
    args.extend(rules.split_whitespace());
    let () = server.cmd(&args);
}

/// The URL of the ACL user `locker`: the lock prefix's keys and wake channels, and the
/// commands the library sends.
fn locker_url(server: &RedisServer) -> String {
    add_user(
        server,
        "locker",
        LIBRARY_KEYS,
        "&lock:wake:*",
        LIBRARY_COMMANDS,
    );
    server.url_as("locker", PASSWORD)
}

/// A client of `url` whose watchdog lease is `lease`.
async fn client_with_lease(url: &str, lease: Duration) -> LockClient {
    LockClient::builder(url)
        .watchdog_lease(lease)
        .build()
        .await
        .unwrap()
}

/// A client whose waiters rely on pub/sub alone: their re-poll bound is far beyond the
/// tests' bounds, so a waiter that gets the lock in time was woken by its grant message.
fn woken_only_by_pubsub(url: &str) -> LockClientBuilder {
    LockClient::builder(url).repoll_interval(Duration::from_secs(60))
}

/// `holder` holds `name`; a task of `waiter` waits for it, subscribed and queued in Redis;
/// `holder` releases, and the waiter must get the lock well before any re-poll.
async fn hand_over_through_pubsub(
    server: &RedisServer,
    holder: &LockClient,
    waiter: &LockClient,
    name: &str,
) -> LockGuard {
    let held = acquire_within(holder, name, SLACK, "the lock is free").await;
    let waiting = {
        let lock = waiter.lock(name).unwrap();
        tokio::spawn(async move { lock.acquire_timeout(SLACK * 5).await })
    };
    assert!(
        eventually(SLACK, || subscribers(server, &wake_channel(waiter)) == 1).await,
        "the waiter's pub/sub connection subscribes to its wake channel"
    );
    assert!(
        eventually(SLACK, || queued(server, name).len() == 1).await,
        "the waiter queues in Redis"
    );
    held.release().await.expect("the holder releases");
    tokio::time::timeout(SLACK * 5, waiting)
        .await
        .expect("the waiter is woken by its grant message")
        .unwrap()
        .expect("the waiter gets the lock")
}

/// Runs `attempt` and checks that it fails with [`ErrorKind::AccessDenied`] within
/// [`REFUSAL_BOUND`].
async fn assert_refused<T: std::fmt::Debug>(
    what: &str,
    attempt: impl Future<Output = tower_redis_lock::Result<T>>,
) {
    let started = Instant::now();
    let outcome = tokio::time::timeout(REFUSAL_BOUND * 2, attempt)
        .await
        .unwrap_or_else(|_| panic!("{what}: no answer within {:?}", REFUSAL_BOUND * 2));
    let err = outcome.expect_err(what);
    assert_eq!(err.kind(), ErrorKind::AccessDenied, "{what}: {err}");
    assert!(
        started.elapsed() < REFUSAL_BOUND,
        "{what}: refused only after {:?}",
        started.elapsed()
    );
}

/// The commands (without their subcommand), keys or channels in Redis's ACL LOG, but for
/// `client|setinfo`: redis-rs sends that on connect and ignores a refusal.
fn denied_commands(server: &RedisServer) -> Vec<String> {
    let log: Vec<HashMap<String, redis::Value>> = server.cmd(&["ACL", "LOG"]);
    log.iter()
        .map(|entry| match entry.get("object") {
            Some(redis::Value::BulkString(object)) => String::from_utf8_lossy(object).into_owned(),
            other => format!("{other:?}"),
        })
        // Commands alone: Redis 6.2 logs `script` where 7.0 logs `script|load`.
        .map(|object| object.split('|').next().unwrap_or_default().to_owned())
        // redis-rs's own CLIENT SETINFO, whose refusal it ignores.
        .filter(|command| command != "client")
        .collect()
}

/// How many times the server's ACL refused `command` (its log counts the refusals of one
/// command by one user in one entry).
fn refusals_of(server: &RedisServer, command: &str) -> i64 {
    let log: Vec<HashMap<String, redis::Value>> = server.cmd(&["ACL", "LOG"]);
    log.iter()
        .filter(|entry| {
            matches!(entry.get("object"), Some(redis::Value::BulkString(object))
                if object.as_slice() == command.as_bytes())
        })
        .map(|entry| match entry.get("count") {
            Some(redis::Value::Int(count)) => *count,
            other => panic!("an ACL LOG entry's count: {other:?}"),
        })
        .sum()
}

fn db_size(server: &RedisServer) -> i64 {
    server.keys_besides_epoch()
}

#[tokio::test]
async fn a_password_in_the_url_authenticates_commands_and_wake_ups() {
    let server = RedisServer::start_with(&["--requirepass", PASSWORD]);
    let url = server.url_as("", PASSWORD);
    let holder = LockClient::connect(&url).await.unwrap();
    let waiter = woken_only_by_pubsub(&url).build().await.unwrap();

    let guard = hand_over_through_pubsub(&server, &holder, &waiter, "with-auth").await;
    assert!(guard.is_held());
    guard.release().await.unwrap();
    assert!(!holder.lock("with-auth").unwrap().is_locked().await.unwrap());
}

#[tokio::test]
async fn a_wrong_or_missing_password_is_access_denied_quickly() {
    let server = RedisServer::start_with(&["--requirepass", PASSWORD]);
    for (what, url) in [
        ("a wrong password", server.url_as("", "wrong")),
        ("no password", server.url()),
        ("an unknown user", server.url_as("nobody", PASSWORD)),
    ] {
        let locks = LockClient::builder(&url)
            .command_timeout(REFUSAL_BOUND)
            .build()
            .await
            .expect("the client builds without connecting");
        let lock = locks.lock("guarded").unwrap();
        assert_refused(what, lock.acquire()).await;
        assert_refused(what, lock.try_acquire()).await;
    }
    assert_eq!(db_size(&server), 0, "refused clients wrote nothing");
}

/// The watchdog lease of the ACL users' clients: short, so that renewals are seen, and long
/// enough that a stall of a busy machine under half of it costs no renewal.
const ACL_LEASE: Duration = Duration::from_millis(1200);

/// A holder of `url` hands `name` over to a waiter by pub/sub, and holds `renewed` for three
/// leases, kept by its watchdog. Returns the holder, the waiter's guard and the renewed one.
async fn hand_over_and_renew(
    server: &RedisServer,
    url: &str,
    name: &str,
) -> (LockClient, LockGuard, LockGuard) {
    let holder = client_with_lease(url, ACL_LEASE).await;
    let waiter = woken_only_by_pubsub(url).build().await.unwrap();
    let handed_over = hand_over_through_pubsub(server, &holder, &waiter, name).await;
    let renewed = acquire_within(&holder, "renewed", SLACK, "the lock is free").await;
    // Time passing is what is under test: without renewals the lease would run out and the
    // lost signal fire within three leases.
    let lost = tokio::time::timeout(ACL_LEASE * 3, renewed.lost_signal().lost()).await;
    assert!(lost.is_err(), "the watchdog renewed the lease: {lost:?}");
    (holder, handed_over, renewed)
}

#[tokio::test]
async fn an_acl_user_of_the_lock_prefix_acquires_waits_renews_and_releases() {
    let server = RedisServer::start();
    let url = locker_url(&server);
    // The scripts are not loaded yet: the user loads them itself.
    let (holder, guard, again) = hand_over_and_renew(&server, &url, "acl").await;
    assert!(again.is_held());
    let ttl: i64 = server.cmd(&["PTTL", "lock:{renewed}"]);
    assert!(ttl > 0 && ttl <= ACL_LEASE.as_millis() as i64, "ttl {ttl}");
    let reentered = again.reenter().await.unwrap();
    let holds = holder.lock("renewed").unwrap().hold_count().await.unwrap();
    assert_eq!(holds, 2);
    reentered.release().await.unwrap();

    again.release().await.unwrap();
    guard.release().await.unwrap();
    for name in ["acl", "renewed"] {
        assert!(!holder.lock(name).unwrap().is_locked().await.unwrap());
    }
    assert_eq!(denied_commands(&server), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_without_the_promotion_witness_takes_locks_and_is_refused_it_once() {
    let server = RedisServer::start();
    add_user(
        &server,
        "prefix-only",
        "~lock:*",
        "&lock:wake:*",
        LIBRARY_COMMANDS,
    );
    let url = server.url_as("prefix-only", PASSWORD);
    let locks = LockClient::builder(&url)
        .lease_limit(Duration::from_secs(1))
        .watchdog_lease(Duration::from_secs(1))
        .build()
        .await
        .unwrap();
    let guard = locks.lock("plain").unwrap().acquire().await.unwrap();
    guard.release().await.unwrap();
    // Eight looks' time (a quarter of the lease limit apart): nothing tells of a look not
    // made, so the test waits.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let log: Vec<HashMap<String, redis::Value>> = server.cmd(&["ACL", "LOG"]);
    let refusals: Vec<&redis::Value> = log
        .iter()
        .filter(|entry| {
            matches!(entry.get("object"), Some(redis::Value::BulkString(object))
                if object == b"tower-redis-lock:promoted")
        })
        .filter_map(|entry| entry.get("count"))
        .collect();
    assert_eq!(
        refusals,
        [&redis::Value::Int(1)],
        "the witness was asked for once, then never again"
    );
}

/// A script that cannot be loaded (here an ACL that refuses `SCRIPT LOAD`; in a cluster, a
/// replica promoted after the load went to the masters) runs by its source, `EVAL`: the
/// scripts that acquire, queue, hand over, renew and release all work from a server that has
/// none of them.
#[tokio::test]
async fn scripts_that_cannot_be_loaded_run_by_their_source() {
    let server = RedisServer::start();
    let without_load = LIBRARY_COMMANDS
        .replace(" +script|load", "")
        .replace(FUNCTION_COMMANDS, "");
    add_user(
        &server,
        "no-load",
        LIBRARY_KEYS,
        "&lock:wake:*",
        &without_load,
    );
    let url = server.url_as("no-load", PASSWORD);
    let (holder, guard, renewed) = hand_over_and_renew(&server, &url, "unloaded").await;
    renewed.release().await.unwrap();
    guard.release().await.unwrap();
    for name in ["unloaded", "renewed"] {
        assert!(!holder.lock(name).unwrap().is_locked().await.unwrap());
    }
    let mut denied = denied_commands(&server);
    denied.sort();
    denied.dedup();
    let expected: &[&str] = if support::has_functions(&server) {
        &["fcall", "script"]
    } else {
        &["script"]
    };
    assert_eq!(
        denied, expected,
        "only functions and the loads were refused"
    );
}

/// A user whose ACL has no functions (one written for the scripts alone) runs the scripts:
/// each connection is refused `FCALL` once, and sends scripts from then on.
#[tokio::test]
async fn a_user_without_functions_runs_the_scripts_and_is_refused_them_once_per_connection() {
    let server = RedisServer::start();
    let without_functions = LIBRARY_COMMANDS.replace(FUNCTION_COMMANDS, "");
    add_user(
        &server,
        "scripts-only",
        LIBRARY_KEYS,
        "&lock:wake:*",
        &without_functions,
    );
    let url = server.url_as("scripts-only", PASSWORD);
    let (holder, guard, renewed) = hand_over_and_renew(&server, &url, "scripted").await;
    renewed.release().await.unwrap();
    guard.release().await.unwrap();
    for name in ["scripted", "renewed"] {
        assert!(!holder.lock(name).unwrap().is_locked().await.unwrap());
    }
    let mut denied = denied_commands(&server);
    denied.sort();
    denied.dedup();
    let expected: &[&str] = if support::has_functions(&server) {
        &["fcall"]
    } else {
        &[]
    };
    assert_eq!(denied, expected);
    let scripts = support::command_calls(&server, "evalsha");
    let refusals = refusals_of(&server, "fcall");
    assert!(
        scripts >= 10 && refusals <= 4,
        "{refusals} refusals of FCALL for {scripts} scripts"
    );
}

#[tokio::test]
async fn an_acl_user_of_the_lock_prefix_shares_reads_renews_readers_and_expires_dead_ones() {
    let server = RedisServer::start();
    let url = locker_url(&server);
    let lease = Duration::from_millis(1200);
    let readers = client_with_lease(&url, lease).await;
    let writer = woken_only_by_pubsub(&url).build().await.unwrap();
    let rw = readers.read_write_lock("shared").unwrap();

    let renewed = rw.read().acquire().await.unwrap();
    // A reader that dies: its fixed lease runs out and the next script drops it.
    let dead = rw
        .read()
        .with_lease(Lease::Fixed(lease / 2))
        .acquire()
        .await
        .unwrap();
    // Time passing is what is under test: the watchdog renews the live reader's own lease.
    let lost = tokio::time::timeout(lease * 3, renewed.lost_signal().lost()).await;
    assert!(lost.is_err(), "the watchdog renewed the reader: {lost:?}");
    assert!(!dead.is_held(), "the fixed lease ran out");

    // The writer's look at the lock drops the dead reader and queues behind the live one.
    let write = writer.read_write_lock("shared").unwrap().write();
    let waiting = tokio::spawn(async move { write.acquire().await.unwrap() });
    assert!(eventually(SLACK, || queued(&server, "shared").len() == 1).await);
    let holders = rw.read().inspect().await.unwrap().holders;
    assert_eq!(holders.len(), 1, "the dead reader is dropped: {holders:?}");
    renewed.release().await.unwrap();
    let written = tokio::time::timeout(SLACK, waiting).await.unwrap().unwrap();
    written.release().await.unwrap();
    drop(dead);

    let held = rw.read().acquire().await.unwrap();
    assert!(rw.write().force_unlock().await.unwrap());
    drop(held);
    let left: i64 = server.cmd(&["EXISTS", "lock:{shared}", "lock:{shared}:readers"]);
    assert_eq!(
        left, 0,
        "force-unlock removes the readers' index with the hash"
    );
    assert_eq!(denied_commands(&server), Vec::<String>::new());
}

#[tokio::test]
async fn a_user_without_the_lock_keys_is_access_denied_and_leaves_nothing() {
    let server = RedisServer::start();
    add_user(
        &server,
        "outsider",
        "~other:*",
        "&lock:wake:*",
        LIBRARY_COMMANDS,
    );
    let locks = LockClient::builder(&server.url_as("outsider", PASSWORD))
        .command_timeout(REFUSAL_BOUND)
        .build()
        .await
        .unwrap();
    let lock = locks.lock("guarded").unwrap();
    assert_refused("try_acquire", lock.try_acquire()).await;
    assert_refused("acquire", lock.acquire()).await;
    assert_refused("force_unlock", lock.force_unlock()).await;
    assert_eq!(db_size(&server), 0);
}

#[tokio::test]
async fn a_key_prefix_outside_the_users_keys_is_access_denied_and_leaves_nothing() {
    let server = RedisServer::start();
    add_user(
        &server,
        "locker",
        LIBRARY_KEYS,
        "&lock:wake:*",
        LIBRARY_COMMANDS,
    );
    let locks = LockClient::builder(&server.url_as("locker", PASSWORD))
        .key_prefix("other:")
        .command_timeout(REFUSAL_BOUND)
        .build()
        .await
        .unwrap();
    let lock = locks.lock("guarded").unwrap();
    assert_refused("try_acquire", lock.try_acquire()).await;
    assert_refused("acquire", lock.acquire()).await;
    assert_eq!(db_size(&server), 0);
}

#[tokio::test]
async fn a_command_the_scripts_need_but_the_user_lacks_is_access_denied() {
    let server = RedisServer::start();
    // The epoch's marker is written once the server is past the second of its last save
    // (its start here; see `lua/lib/life.lua`).
    server.wait_until_up_for(2);
    let without_hset = LIBRARY_COMMANDS.replace(" +hset", "");
    add_user(
        &server,
        "locker",
        LIBRARY_KEYS,
        "&lock:wake:*",
        &without_hset,
    );
    let locks = LockClient::builder(&server.url_as("locker", PASSWORD))
        .command_timeout(REFUSAL_BOUND)
        .build()
        .await
        .unwrap();
    // Taking a free lock starts with HSET inside the script, after the server's epoch key and
    // its marker are set: denied there, before the lock's keys are written.
    assert_refused("try_acquire", locks.lock("guarded").unwrap().try_acquire()).await;
    assert_eq!(denied_commands(&server), ["hset"]);
    let mut keys: Vec<String> = server.cmd(&["KEYS", "*"]);
    keys.sort();
    assert_eq!(keys.len(), 2, "{keys:?}");
    assert_eq!(keys[0], "lock:epoch");
    assert!(keys[1].starts_with("lock:epoch:"), "{keys:?}");
}

#[test]
fn the_security_chapter_grants_the_commands_the_tests_grant() {
    let chapter = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/src/guide/security.md"
    ))
    .expect("the security chapter");
    let line = format!(
        "ACL SETUSER locker reset on >CHANGE-ME {LIBRARY_KEYS} resetchannels &lock:wake:* {}",
        LIBRARY_COMMANDS
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    );
    assert!(
        chapter.contains(&line),
        "the security chapter (src/guide/security.md) must show the ACL line the tests use:\n{line}"
    );
}

#[tokio::test]
async fn tls_with_an_own_ca_acquires_waits_and_releases() {
    let pki = TestPki::create();
    let server = RedisServer::start_tls(&pki.server(false), &[]);
    assert!(server.url().starts_with("rediss://127.0.0.1:"));
    let trusting = |builder: LockClientBuilder| builder.tls_root_certificate(pki.ca_pem());
    let holder = trusting(LockClient::builder(&server.url()))
        .build()
        .await
        .unwrap();
    let waiter = trusting(woken_only_by_pubsub(&server.url()))
        .build()
        .await
        .unwrap();

    let guard = hand_over_through_pubsub(&server, &holder, &waiter, "over-tls").await;
    assert!(guard.fencing_token() > 0);
    guard.release().await.unwrap();
    assert!(!holder.lock("over-tls").unwrap().is_locked().await.unwrap());
}

#[tokio::test]
async fn a_client_that_does_not_trust_the_servers_ca_is_access_denied_quickly() {
    let pki = TestPki::create();
    let foreign = TestPki::create();
    let server = RedisServer::start_tls(&pki.server(false), &[]);
    let foreign_ca = LockClient::builder(&server.url())
        .tls_root_certificate(foreign.ca_pem())
        .command_timeout(REFUSAL_BOUND)
        .build()
        .await
        .unwrap();
    let system_roots = LockClient::builder(&server.url())
        .command_timeout(REFUSAL_BOUND)
        .build()
        .await
        .unwrap();
    for (what, locks) in [("a foreign CA", foreign_ca), ("system roots", system_roots)] {
        assert_refused(what, locks.lock("over-tls").unwrap().try_acquire()).await;
    }
    assert_eq!(db_size(&server), 0);
}

#[tokio::test]
async fn mutual_tls_takes_the_client_certificate_and_refuses_a_client_without_one() {
    let pki = TestPki::create();
    let server = RedisServer::start_tls(&pki.server(true), &[]);
    let with_certificate = LockClient::builder(&server.url())
        .tls_root_certificate(pki.ca_pem())
        .tls_client_certificate(pki.client_cert_pem(), pki.client_key_pem())
        .build()
        .await
        .unwrap();
    let guard = acquire_within(&with_certificate, "mtls", SLACK, "the certificate is valid").await;
    guard.release().await.unwrap();

    let without = LockClient::builder(&server.url())
        .tls_root_certificate(pki.ca_pem())
        .command_timeout(REFUSAL_BOUND)
        .build()
        .await
        .unwrap();
    assert_refused(
        "no client certificate",
        without.lock("mtls").unwrap().try_acquire(),
    )
    .await;
}

#[tokio::test]
async fn unusable_tls_settings_are_invalid_config() {
    let pki = TestPki::create();
    let cases = [
        (
            "PEM without a certificate",
            LockClient::builder("rediss://127.0.0.1:1").tls_root_certificate("not a certificate"),
        ),
        (
            "a certificate for a URL without TLS",
            LockClient::builder("redis://127.0.0.1:1").tls_root_certificate(pki.ca_pem()),
        ),
        (
            "certificate checks turned off",
            LockClient::builder("rediss://127.0.0.1:1/#insecure"),
        ),
        (
            "a client certificate without a key",
            LockClient::builder("rediss://127.0.0.1:1")
                .tls_client_certificate(pki.client_cert_pem(), "no key here"),
        ),
    ];
    for (what, builder) in cases {
        let err = builder.build().await.expect_err(what);
        assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{what}: {err}");
    }
}

#[tokio::test]
async fn instance_ids_are_128_bit_hex_distinct_and_start_every_owner_id() {
    let server = RedisServer::start();
    let mut clients = Vec::new();
    for _ in 0..8 {
        clients.push(support::client(&server).await);
    }
    let ids: HashSet<&str> = clients.iter().map(LockClient::instance_id).collect();
    assert_eq!(ids.len(), clients.len(), "instance ids are distinct");
    for id in &ids {
        assert_eq!(id.len(), 32, "{id}");
        assert!(id.bytes().all(|b| b.is_ascii_hexdigit()), "{id}");
    }
    let guard = acquire_within(&clients[0], "owned", SLACK, "the lock is free").await;
    let state = clients[1].lock("owned").unwrap().inspect().await.unwrap();
    let owners: Vec<&str> = state
        .holders
        .iter()
        .map(|(owner, _)| owner.as_str())
        .collect();
    assert_eq!(owners.len(), 1);
    assert!(
        owners[0].starts_with(&format!("{}:", clients[0].instance_id())),
        "owner id {} starts with the holder's instance id",
        owners[0]
    );
    guard.release().await.unwrap();
}
