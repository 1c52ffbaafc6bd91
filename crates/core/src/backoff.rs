//! Retry delays.

use serde::{Deserialize, Serialize};

use crate::time::Span;

/// Exponential backoff: the n-th retry waits `initial * factor^(n-1)`, capped at `max`,
/// then jittered down by up to half (so retries of many steps spread out instead of herding).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Backoff {
    #[serde(default = "Backoff::default_initial")]
    pub initial: Span,
    #[serde(default = "Backoff::default_factor")]
    pub factor: f64,
    #[serde(default = "Backoff::default_max")]
    pub max: Span,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            initial: Self::default_initial(),
            factor: Self::default_factor(),
            max: Self::default_max(),
        }
    }
}

impl Backoff {
    fn default_initial() -> Span {
        Span::from_secs(1)
    }
    fn default_factor() -> f64 {
        2.0
    }
    fn default_max() -> Span {
        Span::from_secs(300)
    }

    /// The delay before retry number `failures` (1 for the first retry). `jitter` is a number in
    /// `[0, 1)` chosen by the caller; 0 gives the full delay, values near 1 about half of it.
    pub fn delay(&self, failures: u32, jitter: f64) -> Span {
        let exp = failures.saturating_sub(1).min(64) as i32;
        let raw = self.initial.as_millis() as f64 * self.factor.powi(exp);
        let capped = raw.min(self.max.as_millis() as f64).max(0.0);
        let jitter = jitter.clamp(0.0, 1.0);
        Span::from_millis((capped * (1.0 - 0.5 * jitter)).round() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Proves delays grow by the factor, stop at the cap, and jitter only shortens them by half.
    #[test]
    fn delays_grow_and_cap() {
        let b = Backoff {
            initial: Span::from_millis(100),
            factor: 2.0,
            max: Span::from_millis(1_000),
        };
        let delays: Vec<u64> = (1..=6).map(|n| b.delay(n, 0.0).as_millis()).collect();
        assert_eq!(delays, vec![100, 200, 400, 800, 1000, 1000]);
        assert_eq!(b.delay(2, 0.999_999).as_millis(), 100);
        assert_eq!(b.delay(1000, 0.0).as_millis(), 1_000);
    }
}
