//! Per-object retry delays: a write that failed is retried after 200 ms, then twice as long
//! each time, at most 30 s — never in a hot loop, and one object's trouble never slows others.

use std::collections::HashMap;
use std::time::{Duration, Instant};

const FIRST: Duration = Duration::from_millis(200);
const CAP: Duration = Duration::from_secs(30);

/// The delay after `failures` consecutive failures.
pub fn delay(failures: u32) -> Duration {
    FIRST
        .checked_mul(1u32 << failures.saturating_sub(1).min(16))
        .unwrap_or(CAP)
        .min(CAP)
}

#[derive(Debug, Default)]
pub struct Backoff {
    entries: HashMap<String, Entry>,
}

#[derive(Debug)]
struct Entry {
    /// Consecutive failures.
    failures: u32,
    /// Not before.
    at: Instant,
    /// A round started after `at`: the key was up for a retry then, so it no longer asks for
    /// a wake-up of its own.
    offered: bool,
}

impl Backoff {
    /// True when `key` may be tried now.
    pub fn due(&self, key: &str) -> bool {
        self.entries.get(key).is_none_or(|e| e.at <= Instant::now())
    }

    /// Records a failure; returns the delay before the next try.
    pub fn failed(&mut self, key: &str) -> Duration {
        let now = Instant::now();
        let entry = self.entries.entry(key.to_string()).or_insert(Entry {
            failures: 0,
            at: now,
            offered: false,
        });
        entry.failures = entry.failures.saturating_add(1);
        let wait = delay(entry.failures);
        entry.at = now + wait;
        entry.offered = false;
        wait
    }

    pub fn succeeded(&mut self, key: &str) {
        self.entries.remove(key);
    }

    /// A round of work starts (a planning pass, an applier round): every key already due is
    /// tried in it if it is still wanted, and its failure or success is recorded then. A key
    /// the round leaves alone is no longer wanted (its object or its cluster is gone), so it
    /// stops asking for a wake-up: left due, it would make every round ask for the next one at
    /// once, a loop spinning for good. Its failure count is kept for a while, so the same key
    /// failing again soon waits longer; after the longest delay it is forgotten.
    pub fn start_round(&mut self) {
        let now = Instant::now();
        self.entries
            .retain(|_, e| !(e.offered && now.saturating_duration_since(e.at) > CAP));
        for e in self.entries.values_mut() {
            if e.at <= now {
                e.offered = true;
            }
        }
    }

    /// Time until the earliest waiting key is due (keys already offered to a round excluded).
    pub fn next_due(&self) -> Option<Duration> {
        let now = Instant::now();
        self.entries
            .values()
            .filter(|e| !e.offered)
            .map(|e| e.at.saturating_duration_since(now))
            .min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_and_caps() {
        assert_eq!(delay(1), Duration::from_millis(200));
        assert_eq!(delay(2), Duration::from_millis(400));
        assert_eq!(delay(5), Duration::from_millis(3200));
        assert_eq!(delay(9), CAP);
        assert_eq!(delay(u32::MAX), CAP);
        let mut b = Backoff::default();
        assert!(b.due("x"));
        b.failed("x");
        assert!(!b.due("x"));
        assert!(b.due("y"));
        assert!(b.next_due().is_some_and(|d| d <= FIRST));
        b.succeeded("x");
        assert!(b.due("x"));
    }

    #[test]
    fn a_key_no_round_retries_stops_asking_for_a_wake_up() {
        let mut b = Backoff::default();
        b.failed("gone");
        std::thread::sleep(FIRST + Duration::from_millis(20));
        // Due: the loop is woken for it.
        assert_eq!(b.next_due(), Some(Duration::ZERO));
        // A round starts and does not retry it (its object is gone): no more wake-ups.
        b.start_round();
        assert_eq!(b.next_due(), None);
        assert!(b.due("gone"));
        // Tried again and failed: it waits longer than the first time, and asks again.
        assert_eq!(b.failed("gone"), 2 * FIRST);
        assert!(b.next_due().is_some_and(|d| d > FIRST));
        // A key that becomes due during a round is offered to the next one.
        b.failed("late");
        b.start_round();
        assert!(b.next_due().is_some_and(|d| d <= FIRST));
    }
}
