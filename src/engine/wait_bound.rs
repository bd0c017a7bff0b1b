//! The wait bound of the acquisition a task makes, where the acquire loop can see it: a
//! restart quarantine that outlasts it fails the acquisition at once with the time left (the
//! layer's `Retry-After`), rather than at the bound with nothing gained by waiting.

use std::future::Future;

use tokio::time::error::Elapsed;
use tokio::time::{Duration, Instant};

tokio::task_local! {
    /// When the acquisition this task makes must be done by.
    static WAIT_UNTIL: Instant;
}

/// Runs `acquisition` until `deadline`, which the acquire loop beneath it sees.
pub(crate) async fn until<F: Future>(
    deadline: Instant,
    acquisition: F,
) -> Result<F::Output, Elapsed> {
    WAIT_UNTIL
        .scope(deadline, tokio::time::timeout_at(deadline, acquisition))
        .await
}

/// Whether something `left` from now ends after this task's wait bound (never, without one).
pub(crate) fn outlasted_by(left: Duration) -> bool {
    WAIT_UNTIL
        .try_with(|deadline| Instant::now() + left > *deadline)
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_bound_is_seen_inside_and_passes_as_a_timeout_would() {
        assert!(
            !outlasted_by(Duration::MAX / 2),
            "no bound, nothing outlasts it"
        );
        let deadline = Instant::now() + Duration::from_secs(2);
        let seen = until(deadline, async {
            (
                outlasted_by(Duration::from_secs(3)),
                outlasted_by(Duration::from_secs(1)),
            )
        })
        .await;
        assert_eq!(seen.unwrap(), (true, false));
        let passed = until(deadline, std::future::pending::<()>()).await;
        assert!(passed.is_err());
        assert_eq!(Instant::now(), deadline);
    }
}
