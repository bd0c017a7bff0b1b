//! Calls gathered on one server (group commit, off by default): the acquisitions of
//! exclusive locks, and the releases of those granted from a queue, that come while one of
//! their connection is in flight go out together as one call when it ends, and each gets what
//! it would alone (a lock taken with nobody queued is released by plain commands). A waiter
//! that gives up while its look is gathered leaves no lock behind, whether its look was sent
//! or not; a release given up while gathered still frees its lock.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use futures_util::future::join_all;
use support::RedisServer;
use support::proxy::FaultProxy;
use tower_redis_lock::LockClient;

/// Lock names taken at once.
const AT_ONCE: usize = 16;

/// Well below the 30 s lease a lock nobody gives back keeps, and generous for a shared
/// machine: a lock freed within it was given back, not left to run out.
const GIVEN_BACK_WITHIN: Duration = Duration::from_secs(10);

/// Calls of `command` since the last `CONFIG RESETSTAT`.
fn calls(server: &RedisServer, command: &str) -> u64 {
    let stats: String = server.cmd(&["INFO", "commandstats"]);
    let counts: BTreeMap<&str, u64> = stats
        .lines()
        .filter_map(|line| {
            let (name, rest) = line.strip_prefix("cmdstat_")?.split_once(":calls=")?;
            Some((name, rest.split(',').next()?.parse().ok()?))
        })
        .collect();
    counts.get(command).copied().unwrap_or(0)
}

/// How many script calls the server ran: functions (`FCALL`), or scripts (`EVALSHA`).
fn script_calls(server: &RedisServer) -> u64 {
    calls(server, "fcall") + calls(server, "evalsha")
}

/// A server up past its first second (see `tests/redis_cost.rs`), a proxy in front of it, and
/// a client with group commit through the proxy on one command connection (5 s command
/// timeouts), warmed up: its connection open,
/// its script loaded, the epoch learned.
async fn through_proxy_on_one_connection() -> (RedisServer, FaultProxy, LockClient) {
    let server = RedisServer::start();
    server.wait_until_up_for(2);
    let proxy = FaultProxy::start(server.port()).await;
    let locks = LockClient::builder(&proxy.url())
        .connections(1)
        .group_commit(true)
        // Room for the slow proxy of the last test.
        .command_timeout(Duration::from_secs(5))
        .build()
        .await
        .expect("client");
    // Two at once: the second look goes out gathered, which loads that script too.
    let warm = join_all(["warm-up-1", "warm-up-2"].map(|name| {
        let lock = locks.lock(name).unwrap();
        async move { lock.acquire().await.unwrap().release().await.unwrap() }
    }));
    warm.await;
    (server, proxy, locks)
}

/// Waits until `locks` sent `calls` calls in all (counted when they go out).
async fn in_flight(locks: &LockClient, calls: u64) {
    assert!(
        support::eventually(GIVEN_BACK_WITHIN, || locks.round_trips() >= calls).await,
        "{calls} calls went out"
    );
}

/// Through a proxy whose calls take two seconds, a first lock's look goes out alone and
/// `name`'s is gathered behind it; returns the first lock, once held, and `name`'s waiting
/// acquisition, once its gathered call took the lock in Redis and while the reply is still on
/// its way (no signal for that: Redis's state is polled).
async fn gathered_and_taken_before_its_reply(
    server: &RedisServer,
    proxy: &FaultProxy,
    locks: &LockClient,
    name: &str,
) -> (
    tower_redis_lock::LockGuard,
    tokio::task::JoinHandle<tower_redis_lock::Result<tower_redis_lock::LockGuard>>,
) {
    proxy.set_latency(Duration::from_secs(1));
    let sent_before = locks.round_trips();
    let first = locks.lock("first").unwrap();
    let first = tokio::spawn(async move { first.acquire().await });
    in_flight(locks, sent_before + 1).await;
    let gathered = locks.lock(name).unwrap();
    let gathered = tokio::spawn(async move { gathered.acquire().await });
    let first = first.await.unwrap().expect("the first lock");
    let key = format!("lock:{{{name}}}");
    let taken = support::eventually(GIVEN_BACK_WITHIN, || {
        server.cmd::<i64>(&["EXISTS", &key]) == 1
    });
    assert!(taken.await, "the gathered look took its lock");
    (first, gathered)
}

#[tokio::test]
async fn first_looks_that_come_while_one_is_in_flight_go_out_in_one_call_and_each_gets_its_own_lock()
 {
    let (server, proxy, locks) = through_proxy_on_one_connection().await;
    // The first look is in flight for a while: every other one comes meanwhile.
    proxy.set_latency(Duration::from_millis(30));
    let names: Vec<String> = (0..AT_ONCE).map(|n| format!("gathered-{n}")).collect();
    let _: () = server.cmd(&["CONFIG", "RESETSTAT"]);
    log_every_command(&server);

    let guards = join_all(names.iter().map(|name| {
        let lock = locks.lock(name).unwrap();
        async move { lock.acquire().await }
    }))
    .await;
    let guards: Vec<_> = guards
        .into_iter()
        .map(|guard| guard.expect("every lock is free"))
        .collect();

    assert_eq!(
        script_calls(&server),
        2,
        "one call for the first look, sent alone, and one for the {} gathered behind it",
        AT_ONCE - 1
    );
    assert_eq!(
        calls(&server, "hset"),
        AT_ONCE as u64,
        "each lock taken once"
    );
    // What every item would read alone is read once per call.
    for once_per_call in ["lastsave", "time"] {
        assert_eq!(calls(&server, once_per_call), 2, "{once_per_call}");
    }
    // So are the epoch and its marker: the first look of each call reads them with its lock
    // and queue, the others their lock and queue alone.
    let looks: Vec<usize> = logged(&server, "exists")
        .iter()
        .map(|args| args.len() - 1)
        .collect();
    assert_eq!(looks.len(), AT_ONCE, "a look per lock: {looks:?}");
    assert_eq!(
        looks.iter().filter(|&&keys| keys == 8).count(),
        2,
        "{looks:?}"
    );
    assert_eq!(
        looks.iter().filter(|&&keys| keys == 2).count(),
        AT_ONCE - 2,
        "{looks:?}"
    );
    // The token counter is written by the first reservation of each call (`SET ... GET`),
    // and once more after the gathered items, whose tokens only the reply carries.
    assert_eq!(calls(&server, "set"), 3, "the token counter's writes");
    tokens_are_distinct_and_counted(&server, &guards);
    for name in &names {
        let held: i64 = server.cmd(&["EXISTS", &format!("lock:{{{name}}}")]);
        assert_eq!(held, 1, "{name} is held in Redis");
    }

    let _: () = server.cmd(&["CONFIG", "RESETSTAT"]);
    let released = join_all(guards.into_iter().map(|guard| guard.release())).await;
    assert!(released.iter().all(Result::is_ok), "{released:?}");
    assert_eq!(
        script_calls(&server),
        0,
        "locks taken with nobody queued are released by plain commands, not gathered"
    );
    assert_eq!(calls(&server, "hdel"), AT_ONCE as u64);
    for name in &names {
        let held: i64 = server.cmd(&["EXISTS", &format!("lock:{{{name}}}")]);
        assert_eq!(held, 0, "{name} was released");
    }
}

/// Checks that each of `guards` has a token of its own, and that the token counter is past
/// every one.
fn tokens_are_distinct_and_counted(server: &RedisServer, guards: &[tower_redis_lock::LockGuard]) {
    let tokens: BTreeSet<u64> = guards.iter().map(|guard| guard.fencing_token()).collect();
    assert_eq!(
        tokens.len(),
        guards.len(),
        "every holder has a token of its own"
    );
    let counter: u64 = server.cmd(&["GET", "lock:tokens"]);
    assert!(
        tokens.iter().all(|token| *token <= counter),
        "the counter {counter} is past every token given out: {tokens:?}"
    );
}

/// Makes the slow log keep every command from now on, and forgets what it kept.
fn log_every_command(server: &RedisServer) {
    let _: () = server.cmd(&["CONFIG", "SET", "slowlog-log-slower-than", "0"]);
    let _: () = server.cmd(&["CONFIG", "SET", "slowlog-max-len", "10000"]);
    let _: () = server.cmd(&["SLOWLOG", "RESET"]);
}

/// The commands the slow log kept (see [`log_every_command`]) named `name`, with their
/// arguments, scripts' own included.
fn logged(server: &RedisServer, name: &str) -> Vec<Vec<String>> {
    type Entry = (i64, i64, i64, Vec<String>, String, String);
    let entries: Vec<Entry> = server.cmd(&["SLOWLOG", "GET", "-1"]);
    entries
        .into_iter()
        .map(|(_, _, _, args, _, _)| args)
        .filter(|args| {
            args.first()
                .is_some_and(|first| first.eq_ignore_ascii_case(name))
        })
        .collect()
}

/// The script calls logged whose first key is `key`: a gathered acquire names the token
/// counter first, an acquire sent alone its lock.
fn script_calls_with_first_key(server: &RedisServer, key: &str) -> usize {
    let mut scripts = logged(server, "fcall");
    scripts.extend(logged(server, "evalsha"));
    scripts
        .iter()
        .filter(|args| args.get(3).is_some_and(|first_key| first_key == key))
        .count()
}

#[tokio::test]
async fn after_a_snapshot_the_first_gathered_look_checks_the_epoch_and_the_rest_take_their_locks() {
    let (server, proxy, locks) = through_proxy_on_one_connection().await;
    // Long enough that the snapshot and every other look come while the first's reply is on
    // its way.
    proxy.set_latency(Duration::from_secs(1));
    let sent_before = locks.round_trips();
    let first = locks.lock("before-the-snapshot").unwrap();
    let first = tokio::spawn(async move { first.acquire().await });
    in_flight(&locks, sent_before + 1).await;
    // Taken in Redis while its reply is on its way (no signal for that: Redis's state is
    // polled).
    let taken = support::eventually(GIVEN_BACK_WITHIN, || {
        server.cmd::<i64>(&["EXISTS", "lock:{before-the-snapshot}"]) == 1
    });
    assert!(taken.await, "the first look took its lock");
    log_every_command(&server);
    // A snapshot moves the last save, which ends the name of the epoch's marker: the marker
    // the client names is missing until a check of the epoch writes it.
    let saved: i64 = server.cmd(&["LASTSAVE"]);
    let _: () = server.cmd(&["SAVE"]);
    assert_ne!(
        server.cmd::<i64>(&["LASTSAVE"]),
        saved,
        "the snapshot moved the last save"
    );
    let names: Vec<String> = (1..AT_ONCE)
        .map(|n| format!("after-the-snapshot-{n}"))
        .collect();
    let gathered = join_all(names.iter().map(|name| {
        let lock = locks.lock(name).unwrap();
        async move { lock.acquire().await }
    }));
    let (first, gathered) = tokio::join!(first, gathered);
    let guards: Vec<_> = std::iter::once(first.unwrap())
        .chain(gathered)
        .map(|guard| guard.expect("every lock is free"))
        .collect();

    assert_eq!(
        script_calls_with_first_key(&server, "lock:tokens"),
        1,
        "the looks after the first went out in one gathered call"
    );
    // The slow log keeps the newest first. The gathered call's first look finds the marker
    // missing and checks the epoch, which writes it; so the next looks at the epoch again, and
    // finds it current, and the rest look at their lock and queue alone.
    let looks: Vec<usize> = logged(&server, "exists")
        .iter()
        .map(|args| args.len() - 1)
        .collect();
    let mut expected = vec![2; AT_ONCE - 3];
    expected.extend([8, 8]);
    assert_eq!(looks, expected, "the keys each look named, newest first");
    tokens_are_distinct_and_counted(&server, &guards);
}

#[tokio::test]
async fn a_gathered_call_that_takes_one_lock_free_writes_the_token_counter_once() {
    let (server, proxy, locks) = through_proxy_on_one_connection().await;
    // Long enough that the second look surely comes while the first is in flight.
    proxy.set_latency(Duration::from_secs(1));
    log_every_command(&server);
    let _: () = server.cmd(&["CONFIG", "RESETSTAT"]);
    let sent_before = locks.round_trips();
    let first = locks.lock("alone").unwrap();
    let first = tokio::spawn(async move { first.acquire().await });
    in_flight(&locks, sent_before + 1).await;
    let gathered = locks.lock("gathered-alone").unwrap().acquire().await;
    let guards = [first.await.unwrap(), gathered].map(|guard| guard.expect("both are free"));

    assert_eq!(script_calls_with_first_key(&server, "lock:{alone}"), 1);
    assert_eq!(
        script_calls_with_first_key(&server, "lock:tokens"),
        1,
        "the second look gathered behind the first, as a call of one item"
    );
    // Each call's one reservation wrote the counter (`SET ... GET`): nothing left to catch up.
    assert_eq!(calls(&server, "set"), 2, "the token counter's writes");
    tokens_are_distinct_and_counted(&server, &guards);
    for guard in guards {
        guard.release().await.expect("released");
    }
}

/// `locks` holds each of `names` after `other` held it and `locks` queued for it: each
/// granted from the queue, so each last release is the release script's.
async fn granted_from_the_queue(
    locks: &LockClient,
    other: &LockClient,
    names: &[String],
) -> Vec<tower_redis_lock::LockGuard> {
    let held = join_all(names.iter().map(|name| {
        let lock = other.lock(name).unwrap();
        async move { lock.acquire().await }
    }))
    .await;
    let waiting: Vec<_> = names
        .iter()
        .map(|name| {
            let lock = locks.lock(name).unwrap();
            tokio::spawn(async move { lock.acquire().await })
        })
        .collect();
    let queued = support::eventually(GIVEN_BACK_WITHIN, || locks.queued_waiters() == names.len());
    assert!(queued.await, "every look queued");
    join_all(held.into_iter().map(|guard| guard.unwrap().release())).await;
    let granted = join_all(waiting).await;
    granted
        .into_iter()
        .map(|guard| guard.unwrap().expect("granted from the queue"))
        .collect()
}

#[tokio::test]
async fn last_releases_that_come_while_one_is_in_flight_go_out_in_one_call() {
    let (server, proxy, locks) = through_proxy_on_one_connection().await;
    let other = support::client(&server).await;
    // Two at once first: the second release goes out gathered, which loads that script.
    let warm_up = [
        "warm-up-granted-1".to_owned(),
        "warm-up-granted-2".to_owned(),
    ];
    let warm_up = granted_from_the_queue(&locks, &other, &warm_up).await;
    join_all(warm_up.into_iter().map(|guard| guard.release())).await;
    let names: Vec<String> = (0..AT_ONCE).map(|n| format!("granted-{n}")).collect();
    let guards = granted_from_the_queue(&locks, &other, &names).await;
    // The first release is in flight for a while: every other one comes meanwhile.
    proxy.set_latency(Duration::from_millis(30));
    let _: () = server.cmd(&["CONFIG", "RESETSTAT"]);

    let released = join_all(guards.into_iter().map(|guard| guard.release())).await;
    assert!(released.iter().all(Result::is_ok), "{released:?}");
    assert_eq!(
        script_calls(&server),
        2,
        "one call for the first release, and one for those gathered behind it"
    );
    for name in &names {
        let held: i64 = server.cmd(&["EXISTS", &format!("lock:{{{name}}}")]);
        assert_eq!(held, 0, "{name} was released");
    }
}

#[tokio::test]
async fn without_group_commit_each_acquisition_and_release_goes_out_alone() {
    let server = RedisServer::start();
    server.wait_until_up_for(2);
    let locks = LockClient::builder(&server.url())
        .connections(1)
        .build()
        .await
        .expect("client");
    locks
        .lock("warm-up")
        .unwrap()
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let _: () = server.cmd(&["CONFIG", "RESETSTAT"]);

    let guards = join_all((0..AT_ONCE).map(|n| {
        let lock = locks.lock(&format!("alone-{n}")).unwrap();
        async move { lock.acquire().await.unwrap() }
    }))
    .await;
    join_all(guards.into_iter().map(|guard| guard.release())).await;

    assert_eq!(
        script_calls(&server),
        AT_ONCE as u64,
        "a call per acquisition, and plain commands per release"
    );
    assert_eq!(calls(&server, "hdel"), AT_ONCE as u64);
}

#[tokio::test]
async fn a_gathered_look_given_up_before_its_call_goes_out_is_never_sent() {
    let (server, proxy, locks) = through_proxy_on_one_connection().await;
    let _: () = server.cmd(&["CONFIG", "RESETSTAT"]);
    // The first look stalls in the proxy: the second is gathered behind it, and given up.
    proxy.black_hole();
    let sent_before = locks.round_trips();
    let first = locks.lock("first").unwrap();
    let first = tokio::spawn(async move { first.acquire().await });
    in_flight(&locks, sent_before + 1).await;
    let given_up = tokio::time::timeout(
        Duration::from_millis(200),
        locks.lock("given-up").unwrap().acquire(),
    )
    .await;
    assert!(given_up.is_err(), "the gathered look waits for the first");
    proxy.heal();
    let first = first.await.unwrap().expect("the first lock");
    // A look after it, on the same connection, goes out behind anything gathered before.
    let after = locks.lock("after").unwrap().acquire().await.unwrap();

    assert_eq!(
        calls(&server, "hset"),
        2,
        "only the first lock and the one after were taken: the given-up look never went out"
    );
    let held: i64 = server.cmd(&["EXISTS", "lock:{given-up}"]);
    assert_eq!(held, 0, "nothing of the given-up look is in Redis");
    first.release().await.unwrap();
    after.release().await.unwrap();
}

#[tokio::test]
async fn a_gathered_look_given_up_while_its_call_is_in_flight_has_its_lock_given_back() {
    let (server, proxy, locks) = through_proxy_on_one_connection().await;
    let other = support::client(&server).await;
    // The gathered call's reply is still on its way when its waiter gives up.
    let (first, given_up) =
        gathered_and_taken_before_its_reply(&server, &proxy, &locks, "given-up").await;
    given_up.abort();
    assert!(given_up.await.unwrap_err().is_cancelled());
    proxy.set_latency(Duration::ZERO);

    let taken = support::acquire_within(
        &other,
        "given-up",
        GIVEN_BACK_WITHIN,
        "the lock the given-up look took is given back when its answer comes",
    )
    .await;
    taken.release().await.unwrap();
    first.release().await.unwrap();
}

#[tokio::test]
async fn a_gathered_release_given_up_still_frees_its_lock() {
    let (server, proxy, locks) = through_proxy_on_one_connection().await;
    let other = support::client(&server).await;
    let names = ["first".to_owned(), "given-up".to_owned()];
    let [first, given_up]: [_; 2] = granted_from_the_queue(&locks, &other, &names)
        .await
        .try_into()
        .expect("two guards");
    // The first release stalls in the proxy: the second is gathered behind it, and given up.
    proxy.black_hole();
    let sent_before = locks.round_trips();
    let first = tokio::spawn(first.release());
    in_flight(&locks, sent_before + 1).await;
    let abandoned = tokio::time::timeout(Duration::from_millis(200), given_up.release()).await;
    assert!(
        abandoned.is_err(),
        "the gathered release waits for the first"
    );
    proxy.heal();
    first.await.unwrap().expect("the first release");

    let taken = support::acquire_within(
        &other,
        "given-up",
        GIVEN_BACK_WITHIN,
        "a release given up while gathered still goes out",
    )
    .await;
    taken.release().await.unwrap();
}

#[tokio::test]
async fn a_gathered_look_whose_connection_is_cut_after_it_ran_gets_the_lock_it_took_once() {
    let (server, proxy, locks) = through_proxy_on_one_connection().await;
    // The gathered call's reply is still on its way when the connection is cut.
    let (first, cut_off) =
        gathered_and_taken_before_its_reply(&server, &proxy, &locks, "cut-off").await;
    proxy.set_latency(Duration::ZERO);
    assert!(proxy.cut_all() > 0, "a connection was cut");

    let guard = tokio::time::timeout(GIVEN_BACK_WITHIN, cut_off)
        .await
        .expect("the cut-off look is answered again on a fresh connection")
        .unwrap()
        .expect("the lock it took is its own");
    let holds: Vec<String> = server.cmd(&["HVALS", "lock:{cut-off}"]);
    assert_eq!(
        holds,
        ["1"],
        "one hold, by its owner: the look did not count twice"
    );
    guard.release().await.unwrap();
    let held: i64 = server.cmd(&["EXISTS", "lock:{cut-off}"]);
    assert_eq!(held, 0, "released whole");
    first.release().await.unwrap();
}
