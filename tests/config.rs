//! Settings past their bounds: each is a typed `InvalidConfig` error at `build()` or at the
//! acquisition, never a panic, a hang or a half-written lock.

mod support;

use std::time::Duration;

use support::{RedisServer, client};
use tower_redis_lock::{
    ErrorKind, Lease, LockClient, LockClientBuilder, MAX_CONNECTIONS, MAX_LEASE,
    MAX_LOCAL_HANDOVER_LIMIT,
};

/// Builds `builder` and returns the error it must fail with.
async fn refused(builder: LockClientBuilder) -> String {
    match builder.build().await {
        Ok(_) => panic!("a setting past its bound was accepted"),
        Err(err) => {
            assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err}");
            err.to_string()
        }
    }
}

#[tokio::test]
async fn every_setting_past_its_bound_fails_the_build_by_name() {
    let server = RedisServer::start();
    let url = server.url();
    let builder = || LockClient::builder(&url);
    let lease = Duration::from_secs(30);
    let cases = [
        (
            builder().watchdog_lease(Duration::from_millis(2)),
            "watchdog lease",
        ),
        (builder().watchdog_lease(Duration::MAX), "watchdog lease"),
        (
            builder().renew_interval(lease / 2 + Duration::from_millis(1)),
            "renew interval",
        ),
        (builder().renew_interval(Duration::ZERO), "renew interval"),
        (builder().repoll_interval(Duration::MAX), "re-poll interval"),
        (
            builder().repoll_interval(Duration::ZERO),
            "re-poll interval",
        ),
        (builder().command_timeout(Duration::MAX), "command timeout"),
        (builder().command_timeout(Duration::ZERO), "command timeout"),
        (
            builder().local_handover_window(Duration::MAX),
            "hand-over window",
        ),
        (
            builder().local_handover_window(lease.mul_f64(0.9)),
            "hand-over window",
        ),
        (builder().lease_limit(Duration::MAX), "lease limit"),
        (builder().connections(0), "connections"),
        (builder().connections(MAX_CONNECTIONS + 1), "connections"),
    ];
    for (builder, setting) in cases {
        let message = refused(builder).await;
        assert!(message.contains(setting), "{setting}: {message}");
    }
    // At the bounds themselves, a client starts and locks.
    let at_bounds = builder()
        .renew_interval(lease / 2)
        .local_handover_window(lease.mul_f64(0.89))
        .lease_limit(MAX_LEASE)
        .connections(MAX_CONNECTIONS)
        .build()
        .await
        .expect("settings at their bounds");
    let guard = at_bounds.lock("bounds").unwrap().acquire().await.unwrap();
    guard.release().await.unwrap();
}

#[tokio::test]
async fn a_fixed_lease_past_a_year_fails_before_anything_is_written() {
    let server = RedisServer::start();
    let locks = client(&server).await;
    for lease in [
        Duration::MAX,
        MAX_LEASE + Duration::from_secs(1),
        Duration::ZERO,
    ] {
        let lock = locks
            .lock("forever")
            .unwrap()
            .with_lease(Lease::Fixed(lease));
        let err = lock.acquire().await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{lease:?}: {err}");
        let err = lock.try_acquire().await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{lease:?}: {err}");
        let err = locks
            .acquire_all(&["forever", "other"], Lease::Fixed(lease))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{lease:?}: {err}");
    }
    assert_eq!(server.keys_besides_epoch(), 0, "nothing was written");
    // The longest fixed lease there is works with a lease limit as long, and leaves a lock
    // with a TTL.
    let locks = LockClient::builder(&server.url())
        .lease_limit(MAX_LEASE)
        .build()
        .await
        .unwrap();
    let lock = locks
        .lock("a-year")
        .unwrap()
        .with_lease(Lease::Fixed(MAX_LEASE));
    let guard = lock.acquire().await.unwrap();
    let ttl = lock.remaining_ttl().await.unwrap().expect("a TTL");
    assert!(ttl > MAX_LEASE - Duration::from_secs(60), "{ttl:?}");
    guard.release().await.unwrap();
}

/// The names of the previous release still build, deprecated, and mean what the new ones do.
#[test]
#[allow(deprecated)]
fn the_previous_names_of_the_hand_over_settings_still_build() {
    assert_eq!(
        tower_redis_lock::DEFAULT_LOCAL_HANDOFF_LIMIT,
        tower_redis_lock::DEFAULT_LOCAL_HANDOVER_LIMIT
    );
    assert_eq!(
        tower_redis_lock::DEFAULT_LOCAL_HANDOFF_WINDOW,
        tower_redis_lock::DEFAULT_LOCAL_HANDOVER_WINDOW
    );
    assert_eq!(
        tower_redis_lock::MAX_LOCAL_HANDOFF_LIMIT,
        MAX_LOCAL_HANDOVER_LIMIT
    );
    let _builder = LockClient::builder("redis://127.0.0.1:1")
        .local_handoff_limit(3)
        .local_handoff_window(Duration::from_millis(5));
}
