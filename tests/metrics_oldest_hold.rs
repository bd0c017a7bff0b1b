//! The gauge an alert reads while a hold lasts, `redis_lock_oldest_hold_start_time_seconds`,
//! through the exporter the examples use: when the longest-running hold of the process
//! began, moved to the next hold when it ends, 0 without one, a singleton's leadership left
//! out.
//!
//! Alone in its test binary: the holds of a process are one set, and a binary's tests run on
//! threads of one process, each with its own recorder, so another test's older hold would
//! keep this one's out of the gauge this test's recorder sees.

#![cfg(feature = "metrics")]

mod support;

#[path = "support/exported.rs"]
mod exported;

use exported::{exporter, gauge, unix_now};
use support::{RedisServer, client};

#[tokio::test]
async fn the_oldest_hold_gauge_shows_when_the_longest_running_hold_began_and_0_without_one() {
    let recorder = exporter();
    let server = RedisServer::start();
    let locks = client(&server).await;
    let oldest = "redis_lock_oldest_hold_start_time_seconds";
    assert_eq!(gauge(recorder, oldest), 0.0);

    // Whole milliseconds: the gauge is read back from text, and the two clocks are read apart.
    let tolerance = 0.001;
    let before_first = unix_now();
    let first = locks.lock("first").unwrap().acquire().await.unwrap();
    let after_first = unix_now();
    let began = gauge(recorder, oldest);
    assert!(
        began >= before_first - tolerance && began <= after_first + tolerance,
        "{before_first} <= {began} <= {after_first}"
    );
    // A later hold leaves the oldest where it was; its end moves the gauge to the next.
    let before_second = unix_now();
    let second = locks.lock("second").unwrap().acquire().await.unwrap();
    assert_eq!(gauge(recorder, oldest), began);
    first.release().await.unwrap();
    let next = gauge(recorder, oldest);
    assert!(
        next >= before_second - tolerance && next <= unix_now() + tolerance,
        "{before_second} <= {next}"
    );
    second.release().await.unwrap();
    assert_eq!(gauge(recorder, oldest), 0.0);

    // A singleton's leadership is held for its whole term by design: no stuck hold.
    let (led, leading) = tokio::sync::oneshot::channel();
    let mut led = Some(led);
    let handle = locks
        .singleton("reconcile")
        .unwrap()
        .spawn(move |leadership| {
            if let Some(led) = led.take() {
                let _ = led.send(());
            }
            async move {
                leadership.stopping().await;
            }
        });
    leading.await.expect("the singleton leads");
    assert_eq!(gauge(recorder, "redis_lock_held"), 1.0);
    assert_eq!(gauge(recorder, oldest), 0.0);
    handle.shutdown().await.unwrap();
}
