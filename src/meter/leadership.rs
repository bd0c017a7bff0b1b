//! What singleton tasks count: whether this instance leads each singleton, and how its
//! leaderships began and ended. The `name` label is a singleton's name: a job the code names
//! (a reconciliation loop, a consumer), a fixed few per service, never a tenant or an order.

/// `redis_lock_leader{name}`.
pub(crate) const LEADER: &str = "redis_lock_leader";
/// `redis_lock_leadership_changes_total{name, change}`.
pub(crate) const LEADERSHIP_CHANGES: &str = "redis_lock_leadership_changes_total";

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
    /// Every value of the `change` label.
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

/// Counts a change of this instance's leadership of `name`, and sets whether it leads.
pub(crate) fn leadership_changed(name: &str, change: LeadershipChange) {
    #[cfg(feature = "metrics")]
    {
        metrics::counter!(LEADERSHIP_CHANGES, "name" => name.to_owned(), "change" => change.as_str())
            .increment(1);
        let leads = if change == LeadershipChange::Gained {
            1.0
        } else {
            0.0
        };
        metrics::gauge!(LEADER, "name" => name.to_owned()).set(leads);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (name, change.as_str());
}
