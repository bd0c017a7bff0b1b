//! The client's settings, and what they make of a lock's terms in Redis.

use std::time::Duration;

use crate::error::{ErrorKind, LockError, Result};
use crate::lease::{Lease, MAX_LEASE};
use crate::lock_kind::LockKind;
use crate::wire::scripts::AcquireTerms;

/// The client's settings; every field has a documented default.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub(crate) prefix: String,
    pub(crate) watchdog_lease: Duration,
    pub(crate) renew_interval: Duration,
    pub(crate) repoll_interval: Duration,
    pub(crate) command_timeout: Duration,
    pub(crate) local_handover_limit: u32,
    pub(crate) local_handover_window: Duration,
    /// The longest lease this client grants, and the quarantine after Redis lost its data.
    pub(crate) lease_limit: Duration,
    /// The servers fsync every write (`appendfsync always`): a restart from their files is
    /// no loss and starts no quarantine.
    pub(crate) restart_keeps_writes: bool,
    /// Replicas that must acknowledge an acquisition before its holder is told it holds it.
    pub(crate) replica_ack: Option<ReplicaAck>,
    /// A label for this instance, the start of its instance id (and of every owner id), so an
    /// operator sees where a holder runs.
    pub(crate) instance_name: Option<String>,
    /// Command connections the client keeps, lock names spread over them.
    pub(crate) connections: usize,
    /// Whether calls that come while one of their kind is in flight go out together (see
    /// `engine/gathered.rs`).
    pub(crate) group_commit: bool,
}

/// The longest instance name: owner ids travel in every script's arguments and every wake
/// message.
pub(crate) const MAX_INSTANCE_NAME: usize = 64;

/// The most command connections a client keeps (`LockClientBuilder::connections`).
pub const MAX_CONNECTIONS: usize = 64;
/// Most [`LockClientBuilder::local_handover_limit`](crate::LockClientBuilder::local_handover_limit)
/// allows. Each acquisition reserves up to one fencing token more than the limit, in a counter
/// that also stays past the server clock in µs, the floor of the tokens once Redis lost that
/// counter; blocks are cut so that the counter is never more than 2 ms ahead of that clock,
/// which a block of at most a millisecond leaves room for.
pub const MAX_LOCAL_HANDOVER_LIMIT: u32 = 1000;

/// How many replicas must acknowledge an acquisition (Redis's WAIT), and how long it waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReplicaAck {
    pub(crate) replicas: u32,
    pub(crate) timeout: Duration,
}

impl Config {
    /// Checks every setting against its bounds, so that none can overflow a clock, renew a
    /// lease too late to keep it, or hand a lock over locally past its lease. Each error
    /// names the setting and its bound.
    pub(crate) fn validate(&self) -> Result<()> {
        let mut checks = self.lease_checks().into_iter().chain(self.other_checks());
        match checks.find(|(holds, _)| !holds) {
            Some((_, bound)) => Err(LockError::new(ErrorKind::InvalidConfig, bound)),
            None => Ok(()),
        }
    }

    /// The watchdog lease, and the intervals and timeouts measured against it: whether each
    /// keeps to its bound, and the bound.
    fn lease_checks(&self) -> [(bool, &'static str); 8] {
        let lease = self.watchdog_lease;
        [
            (
                lease >= Duration::from_millis(3) && lease <= MAX_LEASE,
                "the watchdog lease must be from 3 ms to MAX_LEASE (a year)",
            ),
            (
                lease <= self.lease_limit,
                "the watchdog lease must be at most the lease limit (a restart quarantine lasts \
                 the lease limit, and must outlast every lease)",
            ),
            (
                !self.renew_interval.is_zero() && self.renew_interval <= lease / 2,
                "the renew interval must be positive and at most half the watchdog lease",
            ),
            (
                !self.repoll_interval.is_zero(),
                "the re-poll interval must be positive",
            ),
            (
                self.repoll_interval <= MAX_LEASE / 3,
                "the re-poll interval must be at most a third of MAX_LEASE (a waiter's place \
                 lives three re-polls)",
            ),
            (
                !self.command_timeout.is_zero(),
                "the command timeout must be positive",
            ),
            (
                self.command_timeout <= MAX_LEASE,
                "the command timeout must be at most MAX_LEASE (a year)",
            ),
            (
                self.local_handover_window < lease.mul_f64(0.9),
                "the local hand-over window must be shorter than nine tenths of the watchdog \
                 lease",
            ),
        ]
    }

    /// The other settings, after those of `lease_checks`: whether each keeps to its
    /// bound, and the bound.
    fn other_checks(&self) -> [(bool, &'static str); 5] {
        let lease = self.watchdog_lease;
        [
            (
                self.local_handover_limit <= MAX_LOCAL_HANDOVER_LIMIT,
                "the local hand-over limit must be at most MAX_LOCAL_HANDOVER_LIMIT (1,000): each \
                 acquisition reserves that many tokens more, past the server clock in µs",
            ),
            (
                self.lease_limit <= MAX_LEASE,
                "the lease limit must be at most MAX_LEASE (a year)",
            ),
            (
                self.replica_ack.is_none_or(|ack| {
                    ack.replicas > 0 && !ack.timeout.is_zero() && ack.timeout < lease / 2
                }),
                "replica acknowledgement needs at least one replica and a timeout from 1 ms to \
                 half the watchdog lease (WAIT 0 would block forever)",
            ),
            (
                self.instance_name
                    .as_deref()
                    .is_none_or(valid_instance_name),
                "the instance name must be 1 to 64 ASCII letters, digits, '-' or '_' (it becomes \
                 part of every owner id and wake channel)",
            ),
            (
                (1..=MAX_CONNECTIONS).contains(&self.connections),
                "the connections must be from 1 to MAX_CONNECTIONS (64)",
            ),
        ]
    }

    /// How long a waiter's place in a Redis queue lives without a refresh: three re-polls,
    /// so a live waiter never loses it and a dead one blocks nobody for longer.
    pub(crate) fn waiter_alive(&self) -> Duration {
        self.repoll_interval * 3
    }

    /// What a lock of `kind` held on `lease_mode` asks of Redis: its lease, how long a queued place
    /// lives without a refresh, the lease of a hand-over from the queue, and the token block.
    pub(crate) fn terms(&self, lease_mode: Lease, kind: LockKind) -> AcquireTerms {
        let alive_ms = millis(self.waiter_alive());
        match lease_mode {
            Lease::Watchdog => {
                let lease_ms = millis(self.watchdog_lease);
                AcquireTerms {
                    lease_ms,
                    alive_ms,
                    // Tokens for the local hand-overs, which only an exclusive lock makes.
                    block: if kind.queues_locally() {
                        u64::from(self.local_handover_limit) + 1
                    } else {
                        1
                    },
                    kind,
                }
            }
            Lease::Fixed(lease) => AcquireTerms {
                lease_ms: millis(lease),
                alive_ms,
                block: 1,
                kind,
            },
        }
    }
}

/// Whether `name` may start an instance id: it is followed by `.` and random hex, and owner ids
/// are split on `:` and spaces in Redis.
fn valid_instance_name(name: &str) -> bool {
    (1..=MAX_INSTANCE_NAME).contains(&name.len())
        && name
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || byte == b'-' || byte == b'_')
}

/// Whole milliseconds, at least one.
pub(crate) fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis())
        .unwrap_or(u64::MAX)
        .max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DEFAULT_WATCHDOG_LEASE;

    fn defaults() -> Config {
        Config {
            prefix: "lock:".into(),
            watchdog_lease: DEFAULT_WATCHDOG_LEASE,
            renew_interval: DEFAULT_WATCHDOG_LEASE / 3,
            repoll_interval: Duration::from_secs(1),
            command_timeout: Duration::from_secs(2),
            local_handover_limit: 16,
            local_handover_window: Duration::from_millis(25),
            lease_limit: Duration::from_secs(60),
            restart_keeps_writes: false,
            replica_ack: None,
            instance_name: None,
            connections: 1,
            group_commit: false,
        }
    }

    /// A change to the default settings.
    type Change = Box<dyn FnOnce(&mut Config)>;

    /// Whether `change` applied to the defaults is refused, and with which message.
    fn refused(change: impl FnOnce(&mut Config)) -> Option<String> {
        let mut config = defaults();
        change(&mut config);
        config.validate().err().map(|err| err.to_string())
    }

    #[test]
    fn the_defaults_and_the_bounds_themselves_are_accepted() {
        assert_eq!(refused(|_| {}), None);
        assert_eq!(refused(|c| c.renew_interval = c.watchdog_lease / 2), None);
        assert_eq!(
            refused(|c| {
                c.watchdog_lease = MAX_LEASE;
                c.lease_limit = MAX_LEASE;
            }),
            None
        );
        assert_eq!(refused(|c| c.watchdog_lease = c.lease_limit), None);
        assert_eq!(refused(|c| c.repoll_interval = MAX_LEASE / 3), None);
        assert_eq!(refused(|c| c.lease_limit = MAX_LEASE), None);
        assert_eq!(
            refused(|c| c.instance_name = Some("n".repeat(MAX_INSTANCE_NAME))),
            None
        );
        assert_eq!(
            refused(|c| c.instance_name = Some("orders-7f9c_A".into())),
            None
        );
    }

    #[test]
    fn each_setting_past_its_bound_is_refused_by_name() {
        let cases: [(&str, Change); 13] = [
            (
                "watchdog lease",
                Box::new(|c| c.watchdog_lease = Duration::from_millis(2)),
            ),
            (
                "the lease limit",
                Box::new(|c| c.watchdog_lease = c.lease_limit + Duration::from_millis(1)),
            ),
            (
                "watchdog lease",
                Box::new(|c| c.watchdog_lease = Duration::MAX),
            ),
            (
                "renew interval",
                Box::new(|c| c.renew_interval = c.watchdog_lease * 2 / 3),
            ),
            (
                "renew interval",
                Box::new(|c| c.renew_interval = Duration::ZERO),
            ),
            (
                "re-poll interval",
                Box::new(|c| c.repoll_interval = Duration::MAX),
            ),
            (
                "command timeout",
                Box::new(|c| c.command_timeout = Duration::MAX),
            ),
            (
                "hand-over window",
                Box::new(|c| c.local_handover_window = Duration::MAX),
            ),
            (
                "hand-over window",
                Box::new(|c| c.local_handover_window = c.watchdog_lease.mul_f64(0.9)),
            ),
            ("lease limit", Box::new(|c| c.lease_limit = Duration::MAX)),
            (
                "instance name",
                Box::new(|c| c.instance_name = Some(String::new())),
            ),
            (
                "instance name",
                Box::new(|c| c.instance_name = Some("orders:7".into())),
            ),
            (
                "instance name",
                Box::new(|c| c.instance_name = Some("n".repeat(MAX_INSTANCE_NAME + 1))),
            ),
        ];
        for (setting, change) in cases {
            let message = refused(change).unwrap_or_else(|| panic!("{setting}: accepted"));
            assert!(message.contains(setting), "{setting}: {message}");
            assert!(message.starts_with("invalid configuration"), "{message}");
        }
    }

    #[test]
    fn terms_follow_the_lease_the_kind_and_the_settings() {
        let config = defaults();
        let watchdog = config.terms(Lease::Watchdog, LockKind::Exclusive);
        assert_eq!(watchdog.lease_ms, 30_000);
        assert_eq!(watchdog.alive_ms, 3_000, "three re-polls");
        assert_eq!(
            watchdog.block, 17,
            "the acquisition and 16 local hand-overs"
        );
        assert_eq!(config.terms(Lease::Watchdog, LockKind::Read).block, 1);
        assert_eq!(config.terms(Lease::Watchdog, LockKind::Fair).block, 1);
        let fixed = config.terms(Lease::Fixed(Duration::from_secs(60)), LockKind::Exclusive);
        assert_eq!((fixed.lease_ms, fixed.block), (60_000, 1));
        assert_eq!(
            millis(Duration::from_micros(10)),
            1,
            "at least a millisecond"
        );
    }

    #[test]
    fn fixed_leases_outside_a_millisecond_to_the_lease_limit_are_refused() {
        let limit = Duration::from_secs(60);
        assert!(
            Lease::Fixed(Duration::from_millis(1))
                .validate(limit)
                .is_ok()
        );
        assert!(Lease::Fixed(limit).validate(limit).is_ok());
        assert!(Lease::Fixed(MAX_LEASE).validate(MAX_LEASE).is_ok());
        assert!(Lease::Watchdog.validate(limit).is_ok());
        for lease in [
            Duration::ZERO,
            limit + Duration::from_millis(1),
            MAX_LEASE + Duration::from_millis(1),
            Duration::MAX,
        ] {
            let err = Lease::Fixed(lease).validate(limit).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{lease:?}");
            assert!(err.to_string().contains("lease limit"), "{err}");
        }
    }
}
