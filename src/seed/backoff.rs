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
    /// key -> (consecutive failures, not before).
    entries: HashMap<String, (u32, Instant)>,
}

impl Backoff {
    /// True when `key` may be tried now.
    pub fn due(&self, key: &str) -> bool {
        self.entries
            .get(key)
            .is_none_or(|(_, at)| *at <= Instant::now())
    }

    /// Records a failure; returns the delay before the next try.
    pub fn failed(&mut self, key: &str) -> Duration {
        let entry = self
            .entries
            .entry(key.to_string())
            .or_insert((0, Instant::now()));
        entry.0 = entry.0.saturating_add(1);
        let wait = delay(entry.0);
        entry.1 = Instant::now() + wait;
        wait
    }

    pub fn succeeded(&mut self, key: &str) {
        self.entries.remove(key);
    }

    /// Time until the earliest waiting key is due.
    pub fn next_due(&self) -> Option<Duration> {
        let now = Instant::now();
        self.entries
            .values()
            .map(|(_, at)| at.saturating_duration_since(now))
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
}
