//! What singleton tasks and schedules count: whether this instance leads each singleton, how
//! its leaderships began and ended, and what became of each schedule's ticks. The `name`
//! label is a singleton's or a schedule's name: a job the code names (a reconciliation loop,
//! a consumer), a fixed few per service, never a tenant or an order.

/// `redis_lock_leader{name}`.
#[cfg(feature = "metrics")]
pub(crate) const LEADER: &str = "redis_lock_leader";
/// `redis_lock_leadership_changes_total{name, change}`.
#[cfg(feature = "metrics")]
pub(crate) const LEADERSHIP_CHANGES: &str = "redis_lock_leadership_changes_total";

/// `redis_lock_ticks_total{name, outcome}`.
#[cfg(feature = "metrics")]
pub(crate) const TICKS: &str = "redis_lock_ticks_total";

/// What became of a schedule's tick, as the instance that saw it counts it (each tick is
/// counted by one instance).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TickOutcome {
    /// This instance ran the tick's job.
    Run,
    /// The tick came while this instance's job of an earlier tick still ran, and was not run
    /// ([`Overrun::Skip`](crate::singleton::Overrun::Skip)), or it may have run before Redis
    /// lost its data.
    Skipped,
    /// No instance ran the tick (every instance down, or its runner's lock lost): found by
    /// the next instance that claimed a tick.
    Missed,
}

impl TickOutcome {
    /// Every value of the `outcome` label, for the series started at 0.
    #[cfg(feature = "metrics")]
    pub(crate) const ALL: [TickOutcome; 3] = [Self::Run, Self::Skipped, Self::Missed];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Run => "run",
            Self::Skipped => "skipped",
            Self::Missed => "missed",
        }
    }
}

/// Records the schedule `name`'s tick series at 0, when it is made.
pub(crate) fn start_ticks_at_zero(name: &str) {
    #[cfg(feature = "metrics")]
    for outcome in TickOutcome::ALL {
        metrics::counter!(TICKS, "name" => name.to_owned(), "outcome" => outcome.as_str())
            .increment(0);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = name;
}

/// Counts `count` ticks of the schedule `name` that ended with `outcome`.
pub(crate) fn ticks(name: &str, outcome: TickOutcome, count: u64) {
    #[cfg(feature = "metrics")]
    if count > 0 {
        metrics::counter!(TICKS, "name" => name.to_owned(), "outcome" => outcome.as_str())
            .increment(count);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (name, outcome.as_str(), count);
}

/// How a leadership of this instance began or ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LeadershipChange {
    /// This instance began to lead.
    Gained,
    /// Its lease was lost while it led.
    Lost,
    /// It stepped down on purpose: a shutdown, or a task that ended.
    Resigned,
}

impl LeadershipChange {
    /// Every value of the `change` label, for the series started at 0.
    #[cfg(feature = "metrics")]
    pub(crate) const ALL: [LeadershipChange; 3] = [Self::Gained, Self::Lost, Self::Resigned];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Gained => "gained",
            Self::Lost => "lost",
            Self::Resigned => "resigned",
        }
    }
}

/// Records the singleton `name`'s series at 0, when it is made: an alert on its first change
/// sees an increase.
pub(crate) fn start_leadership_at_zero(name: &str) {
    #[cfg(feature = "metrics")]
    {
        for change in LeadershipChange::ALL {
            metrics::counter!(LEADERSHIP_CHANGES, "name" => name.to_owned(), "change" => change.as_str())
                .increment(0);
        }
        metrics::gauge!(LEADER, "name" => name.to_owned()).increment(0.0);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = name;
}

/// Counts a change of this instance's leadership of `name`, and moves whether it leads.
pub(crate) fn leadership_changed(name: &str, change: LeadershipChange) {
    #[cfg(feature = "metrics")]
    {
        metrics::counter!(LEADERSHIP_CHANGES, "name" => name.to_owned(), "change" => change.as_str())
            .increment(1);
        // Moved up and down, as the other gauges are: a leadership gained is ended once.
        let leader = metrics::gauge!(LEADER, "name" => name.to_owned());
        if change == LeadershipChange::Gained {
            leader.increment(1.0);
        } else {
            leader.decrement(1.0);
        }
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (name, change.as_str());
}
