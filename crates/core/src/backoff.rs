//! Retry delays.

use serde::{Deserialize, Serialize};

use crate::time::{Span, SPAN_MAX_MS};

/// Which curve a step's retry delays follow.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Formula {
    /// The step's [`Backoff`]: exponential, capped, jittered down by up to half.
    #[default]
    Exponential,
    /// Faktory's retry delay (`nextRetry` in contribsys/faktory `manager/retry.go`):
    /// `count⁴ + 15 + rand(30) × (count + 1)` seconds, where `count` is the number of failures
    /// before this one (0 on the first). Takes no parameters; the step's `Backoff` is unused.
    Faktory,
}

impl Formula {
    pub fn as_str(self) -> &'static str {
        match self {
            Formula::Exponential => "exponential",
            Formula::Faktory => "faktory",
        }
    }

    pub fn parse(s: &str) -> Option<Formula> {
        match s {
            "exponential" => Some(Formula::Exponential),
            "faktory" => Some(Formula::Faktory),
            _ => None,
        }
    }

    /// The delay before retry number `failures` (1 for the first retry) under this formula, with
    /// `backoff` as the exponential curve's parameters. `jitter` is the caller's number in `[0, 1)`.
    pub fn delay(self, backoff: &Backoff, failures: u32, jitter: f64) -> Span {
        match self {
            Formula::Exponential => backoff.delay(failures, jitter),
            Formula::Faktory => faktory_delay(failures, jitter),
        }
    }
}

/// Faktory's delay before retry number `failures` (1 for the first retry):
/// `count⁴ + 15 + rand(30) × (count + 1)` seconds with `count = failures − 1` (Faktory's
/// `RetryCount` is 0 when a job fails the first time) and `rand(30) = ⌊jitter × 30⌋`, so the
/// first retry waits 15–44 s and the 25th about 3.8 days. Whole seconds, as in Faktory. Capped at
/// the longest span Overseer accepts (about 10 years), which the formula passes from the 135th
/// failure on.
pub fn faktory_delay(failures: u32, jitter: f64) -> Span {
    let count = u64::from(failures.saturating_sub(1));
    // 0 ≤ jitter < 1 gives 0..=29, like Go's `rand.Intn(30)`; NaN clamps to 0.
    let rand30 = ((jitter.clamp(0.0, 1.0) * 30.0) as u64).min(29);
    let secs = count
        .saturating_pow(4)
        .saturating_add(15)
        .saturating_add(rand30.saturating_mul(count + 1));
    Span::from_millis(secs.min(SPAN_MAX_MS / 1000) * 1000)
}

/// Exponential backoff: the n-th retry waits `initial * factor^(n-1)`, capped at `max`,
/// then jittered down by up to half (so retries of many steps spread out instead of herding).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Backoff {
    #[serde(default = "Backoff::default_initial")]
    pub initial: Span,
    #[serde(default = "Backoff::default_factor")]
    #[schema(minimum = 1, maximum = 100)]
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

    // Proves the Faktory formula's exact values: count = failures − 1, rand(30) = ⌊jitter × 30⌋,
    // checked against `count⁴ + 15 + rand(30) × (count + 1)` computed by hand.
    #[test]
    fn faktory_delays_are_exact() {
        let secs = |failures, jitter| faktory_delay(failures, jitter).as_millis() / 1000;
        // (failures, jitter, seconds)
        let cases = [
            (1, 0.0, 15),             // count 0: 0 + 15 + 0
            (1, 0.999_999, 44),       // count 0: 0 + 15 + 29 × 1
            (2, 0.0, 16),             // count 1: 1 + 15 + 0
            (2, 0.5, 46),             // count 1: 1 + 15 + 15 × 2
            (2, 0.999_999, 74),       // count 1: 1 + 15 + 29 × 2
            (3, 0.1, 40),             // count 2: 16 + 15 + 3 × 3
            (6, 0.0, 640),            // count 5: 625 + 15
            (25, 0.0, 331_791),       // count 24: 331,776 + 15
            (25, 0.999_999, 332_516), // count 24: 331,776 + 15 + 29 × 25
        ];
        for (failures, jitter, want) in cases {
            assert_eq!(
                secs(failures, jitter),
                want,
                "failures {failures}, jitter {jitter}"
            );
        }
        // Failure 0 (never asked by the core) reads as the first; out-of-range jitter is clamped.
        assert_eq!(secs(0, 0.0), 15);
        assert_eq!(secs(1, 1.0), 44);
        assert_eq!(secs(1, -3.0), 15);
        assert_eq!(secs(1, f64::NAN), 15);
        // Whole seconds, like Faktory's `time.Duration(secs) * time.Second`.
        assert_eq!(faktory_delay(4, 0.37).as_millis() % 1000, 0);
    }

    // Proves every Faktory delay lies in `[count⁴ + 15, count⁴ + 15 + 29 × (count + 1)]` over a
    // grid of jitters, that the floor grows with the failure count (the ranges overlap, as in
    // Faktory), and that delays stop at the 10-year cap instead of overflowing.
    #[test]
    fn faktory_delays_stay_in_bounds() {
        for failures in 1..=60u32 {
            let count = u64::from(failures - 1);
            let low = count.pow(4) + 15;
            let high = low + 29 * (count + 1);
            for i in 0..1000 {
                let s = faktory_delay(failures, f64::from(i) / 1000.0).as_millis() / 1000;
                assert!(
                    (low..=high).contains(&s),
                    "failures {failures}: {s} not in {low}..={high}"
                );
            }
            assert!(faktory_delay(failures + 1, 0.0) > faktory_delay(failures, 0.0));
        }
        let cap = Span::from_millis(SPAN_MAX_MS);
        assert!(faktory_delay(134, 0.999_999) < cap);
        assert_eq!(faktory_delay(135, 0.0), cap);
        assert_eq!(faktory_delay(u32::MAX, 0.999_999), cap);
    }

    // Proves `Formula` picks the curve: exponential uses the step's `Backoff`, Faktory ignores it;
    // and that the names round-trip through serde and `parse`.
    #[test]
    fn formula_picks_the_curve() {
        let b = Backoff {
            initial: Span::from_millis(100),
            factor: 2.0,
            max: Span::from_millis(1_000),
        };
        assert_eq!(Formula::default(), Formula::Exponential);
        assert_eq!(
            Formula::Exponential.delay(&b, 3, 0.0),
            Span::from_millis(400)
        );
        assert_eq!(Formula::Faktory.delay(&b, 3, 0.0), Span::from_secs(31));
        for f in [Formula::Exponential, Formula::Faktory] {
            assert_eq!(Formula::parse(f.as_str()), Some(f));
            assert_eq!(serde_json::to_value(f).unwrap(), f.as_str());
        }
        assert_eq!(Formula::parse("sidekiq"), None);
    }
}
