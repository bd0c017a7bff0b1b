//! The fairness budget of one Redis acquisition: how many local hand-overs it may still
//! make, and until when, and the fencing tokens reserved for them (see `hold.rs`).

use std::time::Duration;

use tokio::time::Instant;

/// What is left of the fairness budget of one Redis acquisition.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Budget {
    next_token: u64,
    tokens_left: u64,
    until: Instant,
}

impl Budget {
    /// The budget of an acquisition whose token block starts at `first_token`; the first
    /// token is the acquirer's own.
    pub(crate) fn new(first_token: u64, block: u64, window: Duration) -> Self {
        Self::reserved(first_token + 1, block.saturating_sub(1), window)
    }

    /// The budget of a block of `block` tokens from `first_token` that nobody holds yet: the
    /// first is the next holder's (a lock a hand-over through Redis kept for this client).
    pub(crate) fn reserved(first_token: u64, block: u64, window: Duration) -> Self {
        Self {
            next_token: first_token,
            tokens_left: block,
            until: Instant::now() + window,
        }
    }

    /// Whether one more hand-over without Redis is allowed now.
    pub(crate) fn allows_handover(&self) -> bool {
        self.allows_handover_at(Instant::now())
    }

    /// Whether a token is left and `now` is within the window.
    fn allows_handover_at(&self, now: Instant) -> bool {
        self.tokens_left > 0 && now < self.until
    }

    /// Whether a token of the block is left.
    pub(crate) fn has_tokens(&self) -> bool {
        self.tokens_left > 0
    }

    /// The next token of the block; `None` once the block is spent.
    pub(crate) fn take_token(&mut self) -> Option<u64> {
        self.tokens_left = self.tokens_left.checked_sub(1)?;
        let token = self.next_token;
        self.next_token += 1;
        Some(token)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Time is given, not slept: the budget is read at chosen instants.
    #[test]
    fn a_budget_hands_out_its_block_in_order_within_its_window() {
        let window = Duration::from_millis(25);
        let start = Instant::now();
        // An acquisition's own token is the block's first; the rest go to local successors.
        let mut budget = Budget::new(100, 3, window);
        assert!(budget.allows_handover_at(start));
        assert_eq!(budget.take_token(), Some(101));
        assert_eq!(budget.take_token(), Some(102));
        assert!(!budget.allows_handover_at(start), "the block is spent");
        assert_eq!(budget.take_token(), None);

        let budget = Budget::new(200, 17, window);
        assert!(budget.allows_handover_at(start + window / 2));
        let past = start + window + Duration::from_millis(1);
        assert!(
            !budget.allows_handover_at(past),
            "past the window, whatever tokens are left"
        );
    }

    #[test]
    fn a_block_kept_by_a_hand_over_through_redis_starts_with_the_next_holders_token() {
        // A limit of 0 reserves a block of one: the next task's own, and no more.
        let mut budget = Budget::reserved(300, 1, Duration::from_millis(25));
        assert_eq!(budget.take_token(), Some(300));
        assert_eq!(budget.take_token(), None);
        assert!(!budget.allows_handover());
    }
}
