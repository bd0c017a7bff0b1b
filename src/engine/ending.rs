//! How an acquisition ends, decided in one place: what a released guard, an answer from
//! Redis, a lost lease or a task that comes or leaves does to the key's local entry. Pure:
//! it sees the entry as plain facts and names a step; `release.rs` and the acquire loop
//! carry the step out. Keeping it here, apart from the work, is what keeps two rules visible:
//! the lock passes to a local task only while its lease can be vouched for and within the
//! fairness budget, and no later task overtakes a release Redis has not confirmed (the turn
//! stays with the releasing holder until its answer is carried out).

/// Where an acquisition is in its end, as the key's local entry holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Entry {
    /// Nothing waits in the key's turn: the next task asks Redis.
    Free,
    /// A task of this client holds the lock.
    Held(Holding),
    /// The last guard is released and its Redis work (a release or a hand-over) is out; the
    /// holder keeps its turn on the key until the answer is carried out.
    Releasing,
    /// The lock, still held in Redis, waits in the key's turn for the next local task;
    /// `usable` while its lease can be vouched for and a token of its block is left.
    Passing {
        /// Whether a task that arrives could take it.
        usable: bool,
    },
    /// A place in the Redis queue, taken by the release that passed the lock on, waits in the
    /// key's turn for the next local task.
    Queued,
}

/// What a release needs to know of the task that holds the lock, read at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Holding {
    /// Its guards not yet released, the one being released included.
    pub(crate) guards: usize,
    /// A re-entry is on its way to Redis: the lock must not pass on meanwhile.
    pub(crate) reentering: bool,
    /// The watchdog renews the lease and it can still be vouched for: only such a lock
    /// passes to another task of this client.
    pub(crate) carriable: bool,
    /// Who of this client waits for the key behind the holder.
    pub(crate) next: NextLocal,
}

/// Who of this client waits for the key behind its holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NextLocal {
    /// Nobody (or the holder no longer has the key's turn: its lease was lost).
    Nobody,
    /// Another task; `budget_left` while the acquisition's fairness budget allows one more
    /// hand-over without Redis.
    Waits {
        /// Whether a token and time are left in the budget.
        budget_left: bool,
    },
}

/// What happens to the entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Event {
    /// A guard is released, on purpose or dropped (a dropped guard's Redis work runs in the
    /// background; the decision is the same).
    GuardReleased,
    /// Redis answered what a release sent (or did not).
    Answered {
        /// What the release sent.
        sent: Sent,
        /// How Redis answered.
        answer: Answer,
    },
    /// The lease is reported lost.
    LeaseLost,
    /// The next local task takes its turn on the key and finds the entry.
    NextArrived {
        /// Its lease is one the watchdog renews (what waits was taken on such terms).
        watchdog: bool,
        /// It waits its turn, rather than only trying.
        waits: bool,
    },
    /// What waited in the key's turn is dropped with nobody to take it.
    WaiterLeft,
}

/// What a release sent to Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sent {
    /// One hold less, while another guard of the acquisition holds it.
    ReleaseOne,
    /// The last release: every hold of the owner.
    ReleaseLast,
    /// The last release handing the lock over through Redis.
    Handover,
}

/// How Redis answered a release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Answer {
    /// The release script ran and took the holds.
    Released,
    /// The hand-over found no other instance waiting and kept the lock for this client;
    /// `in_time` when the answer came while the lease can still be vouched for.
    Kept {
        /// Whether the renewal Redis made can still be vouched for.
        in_time: bool,
    },
    /// The hand-over passed the lock to another instance and queued this client's next task.
    Passed,
    /// The owner held nothing (its lease ran out, or it was force-unlocked).
    NotOwner,
    /// No answer came: the script may not have run, or ran unseen.
    Unconfirmed,
    /// Redis refused the script with an error: it did not run.
    Refused,
}

/// What to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// Nothing more.
    Nothing,
    /// Take one hold off in Redis.
    ReleaseOne,
    /// Pass the lock to the next local task, with no round trip.
    Carry,
    /// Hand the lock over through Redis: to the first waiting instance, with this client's
    /// next task queued behind it.
    HandOverThroughRedis,
    /// Release every hold of the owner in Redis.
    ReleaseLast,
    /// Redis kept the lock for this client: back to the watchdog, into the key's turn.
    KeepForNextTask,
    /// Put the place Redis queued for this client's next task into the key's turn.
    PassPlace,
    /// The arriving task takes what waits in the turn.
    TakeOver,
    /// What waits is not for the arriving task: leave it in the turn for the next.
    LeaveForNext,
    /// Release in the background what Redis may still hold, retried on fresh connections
    /// while it could keep the lock from others.
    GiveBack(Whose),
    /// Give up the key's turn: this client's other tasks compete for the lock again.
    GiveUpTurn,
}

/// Whose holds a give-back releases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Whose {
    /// The acquisition's own.
    Lock,
    /// The place queued for this client's next task.
    Place,
    /// Both: a hand-over whose answer was lost may have run or not.
    Both,
}

/// What `event` does to an acquisition whose entry is `entry`.
pub(crate) fn decide(entry: Entry, event: Event) -> Step {
    match (entry, event) {
        (Entry::Held(holding), Event::GuardReleased) => release(holding),
        (Entry::Held(_) | Entry::Releasing, Event::Answered { sent, answer }) => {
            answered(sent, answer)
        }
        (Entry::Held(_) | Entry::Releasing, Event::LeaseLost) => Step::GiveUpTurn,
        (Entry::Passing { usable }, Event::NextArrived { watchdog, .. }) => {
            if usable && watchdog {
                Step::TakeOver
            } else {
                Step::GiveBack(Whose::Lock)
            }
        }
        (Entry::Passing { .. }, Event::WaiterLeft) => Step::GiveBack(Whose::Lock),
        (Entry::Queued, Event::NextArrived { waits: false, .. }) => Step::LeaveForNext,
        // Queued on the terms of a watchdog lease, which a fixed lease does not share.
        (Entry::Queued, Event::NextArrived { watchdog, .. }) => {
            if watchdog {
                Step::TakeOver
            } else {
                Step::GiveBack(Whose::Place)
            }
        }
        (Entry::Queued, Event::WaiterLeft) => Step::GiveBack(Whose::Place),
        // A passed lock's lease is checked again by the task that takes it; a queued place
        // belongs to the next task, not to the lost lease.
        (Entry::Passing { .. } | Entry::Queued, Event::LeaseLost) => Step::Nothing,
        // The rest cannot meet: no guard is left once releasing or passed, nothing is
        // answered once passed, and no task arrives while the holder keeps the turn.
        (Entry::Free, _)
        | (Entry::Releasing, Event::GuardReleased)
        | (Entry::Passing { .. } | Entry::Queued, Event::GuardReleased | Event::Answered { .. })
        | (Entry::Held(_) | Entry::Releasing, Event::NextArrived { .. } | Event::WaiterLeft) => {
            Step::Nothing
        }
    }
}

/// A guard of `holding` is released.
fn release(holding: Holding) -> Step {
    if holding.guards > 1 {
        return Step::ReleaseOne;
    }
    if !holding.carriable || holding.reentering {
        return Step::ReleaseLast;
    }
    match holding.next {
        NextLocal::Nobody => Step::ReleaseLast,
        NextLocal::Waits { budget_left: true } => Step::Carry,
        NextLocal::Waits { budget_left: false } => Step::HandOverThroughRedis,
    }
}

/// Redis answered `sent` with `answer`.
fn answered(sent: Sent, answer: Answer) -> Step {
    match (sent, answer) {
        // Another guard still holds the acquisition; its last release takes every hold.
        (Sent::ReleaseOne, _) => Step::Nothing,
        (Sent::ReleaseLast, Answer::Unconfirmed) => Step::GiveBack(Whose::Lock),
        (Sent::Handover, Answer::Unconfirmed) => Step::GiveBack(Whose::Both),
        (Sent::Handover, Answer::Kept { in_time: true }) => Step::KeepForNextTask,
        // Too late to vouch for the lease Redis renewed: back to Redis, the next task asks anew.
        (Sent::Handover, Answer::Kept { in_time: false }) => Step::GiveBack(Whose::Lock),
        (Sent::Handover, Answer::Passed) => Step::PassPlace,
        (_, Answer::Released | Answer::NotOwner | Answer::Refused)
        | (Sent::ReleaseLast, Answer::Kept { .. } | Answer::Passed) => Step::Nothing,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holding(guards: usize, reentering: bool, carriable: bool, next: NextLocal) -> Entry {
        Entry::Held(Holding {
            guards,
            reentering,
            carriable,
            next,
        })
    }

    const WAITS: NextLocal = NextLocal::Waits { budget_left: true };
    const WAITS_SPENT: NextLocal = NextLocal::Waits { budget_left: false };

    #[test]
    fn a_release_before_the_last_takes_one_hold_whatever_waits() {
        for next in [NextLocal::Nobody, WAITS, WAITS_SPENT] {
            for (reentering, carriable) in [(false, false), (false, true), (true, true)] {
                let entry = holding(2, reentering, carriable, next);
                assert_eq!(decide(entry, Event::GuardReleased), Step::ReleaseOne);
            }
        }
    }

    #[test]
    fn the_last_release_carries_hands_over_or_releases() {
        let last = |next| decide(holding(1, false, true, next), Event::GuardReleased);
        assert_eq!(last(WAITS), Step::Carry);
        assert_eq!(last(WAITS_SPENT), Step::HandOverThroughRedis);
        assert_eq!(last(NextLocal::Nobody), Step::ReleaseLast);
    }

    #[test]
    fn a_lock_that_cannot_be_vouched_for_or_is_being_reentered_is_released_not_passed() {
        for next in [WAITS, WAITS_SPENT, NextLocal::Nobody] {
            let lost = holding(1, false, false, next);
            assert_eq!(decide(lost, Event::GuardReleased), Step::ReleaseLast);
            let reentering = holding(1, true, true, next);
            assert_eq!(decide(reentering, Event::GuardReleased), Step::ReleaseLast);
        }
    }

    #[test]
    fn an_unconfirmed_last_release_is_given_back_and_a_partial_one_is_left_to_the_last() {
        let releasing = |sent, answer| {
            let held = decide(
                holding(1, false, true, WAITS),
                Event::Answered { sent, answer },
            );
            assert_eq!(
                held,
                decide(Entry::Releasing, Event::Answered { sent, answer })
            );
            held
        };
        assert_eq!(
            releasing(Sent::ReleaseLast, Answer::Unconfirmed),
            Step::GiveBack(Whose::Lock)
        );
        assert_eq!(
            releasing(Sent::Handover, Answer::Unconfirmed),
            Step::GiveBack(Whose::Both)
        );
        for answer in ALL_ANSWERS {
            assert_eq!(releasing(Sent::ReleaseOne, answer), Step::Nothing);
        }
        for answer in [Answer::Released, Answer::NotOwner, Answer::Refused] {
            assert_eq!(releasing(Sent::ReleaseLast, answer), Step::Nothing);
            assert_eq!(releasing(Sent::Handover, answer), Step::Nothing);
        }
    }

    #[test]
    fn a_hand_over_kept_in_time_goes_to_the_next_task_and_a_late_one_back_to_redis() {
        let handover = |answer| {
            let sent = Sent::Handover;
            decide(Entry::Releasing, Event::Answered { sent, answer })
        };
        assert_eq!(
            handover(Answer::Kept { in_time: true }),
            Step::KeepForNextTask
        );
        assert_eq!(
            handover(Answer::Kept { in_time: false }),
            Step::GiveBack(Whose::Lock)
        );
        assert_eq!(handover(Answer::Passed), Step::PassPlace);
    }

    #[test]
    fn a_lost_lease_gives_up_the_turn_of_a_holder_or_releaser_only() {
        assert_eq!(
            decide(holding(1, false, true, WAITS), Event::LeaseLost),
            Step::GiveUpTurn
        );
        assert_eq!(decide(Entry::Releasing, Event::LeaseLost), Step::GiveUpTurn);
        for waiting in [Entry::Passing { usable: true }, Entry::Queued, Entry::Free] {
            assert_eq!(decide(waiting, Event::LeaseLost), Step::Nothing);
        }
    }

    #[test]
    fn a_passed_lock_goes_only_to_a_watchdog_task_while_usable_and_is_given_back_otherwise() {
        let arrives = |usable, watchdog, waits| {
            decide(
                Entry::Passing { usable },
                Event::NextArrived { watchdog, waits },
            )
        };
        assert_eq!(arrives(true, true, true), Step::TakeOver);
        assert_eq!(arrives(true, true, false), Step::TakeOver);
        assert_eq!(arrives(true, false, true), Step::GiveBack(Whose::Lock));
        assert_eq!(arrives(false, true, true), Step::GiveBack(Whose::Lock));
        assert_eq!(
            decide(Entry::Passing { usable: true }, Event::WaiterLeft),
            Step::GiveBack(Whose::Lock)
        );
    }

    #[test]
    fn a_queued_place_goes_to_a_waiting_watchdog_task_and_is_left_by_one_that_only_tries() {
        let arrives =
            |watchdog, waits| decide(Entry::Queued, Event::NextArrived { watchdog, waits });
        assert_eq!(arrives(true, true), Step::TakeOver);
        assert_eq!(arrives(false, true), Step::GiveBack(Whose::Place));
        assert_eq!(arrives(true, false), Step::LeaveForNext);
        assert_eq!(arrives(false, false), Step::LeaveForNext);
        assert_eq!(
            decide(Entry::Queued, Event::WaiterLeft),
            Step::GiveBack(Whose::Place)
        );
    }

    #[test]
    fn events_that_cannot_meet_an_entry_do_nothing() {
        let answered = Event::Answered {
            sent: Sent::ReleaseLast,
            answer: Answer::Unconfirmed,
        };
        let arrived = Event::NextArrived {
            watchdog: true,
            waits: true,
        };
        for event in [Event::GuardReleased, answered, arrived, Event::WaiterLeft] {
            assert_eq!(decide(Entry::Free, event), Step::Nothing, "{event:?}");
        }
        assert_eq!(
            decide(Entry::Releasing, Event::GuardReleased),
            Step::Nothing
        );
        for entry in [Entry::Passing { usable: true }, Entry::Queued] {
            assert_eq!(decide(entry, Event::GuardReleased), Step::Nothing);
            assert_eq!(decide(entry, answered), Step::Nothing);
        }
        for entry in [holding(1, false, true, WAITS), Entry::Releasing] {
            assert_eq!(decide(entry, arrived), Step::Nothing);
            assert_eq!(decide(entry, Event::WaiterLeft), Step::Nothing);
        }
    }

    const ALL_ANSWERS: [Answer; 7] = [
        Answer::Released,
        Answer::Kept { in_time: true },
        Answer::Kept { in_time: false },
        Answer::Passed,
        Answer::NotOwner,
        Answer::Unconfirmed,
        Answer::Refused,
    ];
}
