//! Why a release may wait a few microseconds. A lock found free with nobody queued takes its
//! token block past the Redis clock without writing the fencing counter (`take_free` in
//! `lua/tokens.lua`): the block ends at most `block` µs past the clock, and the next holder's
//! tokens start past the clock of its own acquisition. So the holder's release must reach
//! Redis no sooner than `block` µs, on Redis's clock, after the acquisition ran. The script
//! ran before its reply arrived and the release runs after it is sent, so twice `block` µs on
//! this client's monotonic clock between the two is enough, whatever the two clocks' rates
//! (NTP slews either by well under 0.1 %). Only a guard released within a few dozen µs of its
//! acquisition (17 tokens by default: 34 µs) ever waits, and then at most that long.

use std::time::{Duration, Instant};

use crate::kind::LockKind;

/// The largest block the scripts take from the clock alone (`CLOCK_BLOCK_MAX` in
/// `lua/tokens.lua`); a larger one writes the counter, and its release need not wait.
const CLOCK_BLOCK_MAX: u64 = 1000;

/// The earliest instant a release of one acquisition may be sent.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ReleaseGate {
    /// `None`: the acquisition's tokens are in the counter, or came from no free-lock take.
    opens_at: Option<Instant>,
}

impl ReleaseGate {
    /// A release that may go at once.
    pub(crate) const OPEN: Self = Self { opens_at: None };

    /// The gate of an acquisition of `kind` with a block of `block` tokens, whose reply
    /// arrived just now. Only an exclusive lock (fair or not) takes a free lock's block from
    /// the clock.
    pub(crate) fn after_grant(kind: LockKind, block: u64) -> Self {
        let from_clock = matches!(kind, LockKind::Exclusive | LockKind::Fair);
        if !from_clock || block > CLOCK_BLOCK_MAX {
            return Self::OPEN;
        }
        Self {
            opens_at: Some(Instant::now() + Duration::from_micros(2 * block)),
        }
    }

    /// Returns once a release may be sent. The wait is far below a timer's resolution, so the
    /// task yields to others until the instant has passed.
    pub(crate) async fn passed(self) {
        let Some(opens_at) = self.opens_at else {
            return;
        };
        while Instant::now() < opens_at {
            tokio::task::yield_now().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_block_cap_is_the_scripts_own() {
        let tokens = include_str!("../wire/lua/tokens.lua");
        let declared = format!("local CLOCK_BLOCK_MAX = {CLOCK_BLOCK_MAX}\n");
        assert!(
            tokens.contains(&declared),
            "tokens.lua declares another cap"
        );
    }

    #[test]
    fn only_an_exclusive_lock_with_a_block_the_clock_gives_waits() {
        let cases = [
            (LockKind::Exclusive, 17, true),
            (LockKind::Fair, 1, true),
            (LockKind::Exclusive, 1001, false),
            (LockKind::Read, 1, false),
            (LockKind::Write, 1, false),
        ];
        for (kind, block, waits) in cases {
            let gate = ReleaseGate::after_grant(kind, block);
            assert_eq!(gate.opens_at.is_some(), waits, "{kind:?}, block {block}");
        }
    }

    #[tokio::test]
    async fn a_release_goes_no_sooner_than_twice_the_block_in_microseconds() {
        let granted = Instant::now();
        ReleaseGate::after_grant(LockKind::Exclusive, 500)
            .passed()
            .await;
        assert!(granted.elapsed() >= Duration::from_micros(1000));
    }
}
