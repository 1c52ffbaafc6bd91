//! Pure checks of the multi-node test (no processes, no HTTP), unit-tested at the bottom: each
//! is shown to fail on the input that breaks its rule.

use std::collections::BTreeSet;
use std::time::Duration;

/// What a schedule firing every second left behind, from its first firing to its last.
#[derive(Debug, PartialEq, Eq)]
pub struct CronFires {
    /// Distinct due times fired.
    pub fires: usize,
    /// Due times fired more than once (extra jobs).
    pub duplicates: usize,
    /// Due seconds between the first and the last firing that never fired.
    pub gaps: Vec<i64>,
}

/// What is wrong with the history `events` (as `GET /v1/jobs/{id}/events` lists it, never
/// trimmed here) of a job whose steps the server counts `attempts` of (name → attempt): its
/// entries must be numbered 1, 2, 3, … with no gap, and each step must have one lease entry
/// (`step_leased` or `compensation_leased`) for each of its attempts, 1 to its count, in order.
/// (On PostgreSQL a first lease's entry waits in its step row until the job's next write: a
/// node killed, or PostgreSQL restarted, in between must lose or double none of them.)
pub fn history_violations(
    job: &str,
    events: &[serde_json::Value],
    attempts: &[(String, u64)],
) -> Vec<String> {
    let mut found = Vec::new();
    let seqs: Vec<i64> = events.iter().filter_map(|e| e["seq"].as_i64()).collect();
    if seqs.len() != events.len() || seqs.iter().zip(1..).any(|(&s, n)| s != n) {
        found.push(format!("{job}: history numbered {seqs:?}"));
    }
    for (step, count) in attempts {
        let leased: Vec<u64> = events
            .iter()
            .filter(|e| e["step"] == step.as_str())
            .filter(|e| e["kind"] == "step_leased" || e["kind"] == "compensation_leased")
            .filter_map(|e| e["attempt"].as_u64())
            .collect();
        if leased != (1..=*count).collect::<Vec<u64>>() {
            found.push(format!(
                "{job}/{step}: {count} attempts, lease entries for {leased:?}"
            ));
        }
    }
    found
}

/// Reads the due times (ms) out of the jobs' idempotency keys (`schedule/{name}/{due_ms}`) of a
/// schedule firing once per second, and counts duplicates and missing seconds.
pub fn cron_fires(dues_ms: &[i64], period_ms: i64) -> CronFires {
    let unique: BTreeSet<i64> = dues_ms.iter().copied().collect();
    let mut gaps = Vec::new();
    if let (Some(&first), Some(&last)) = (unique.first(), unique.last()) {
        let mut due = first;
        while due <= last {
            if !unique.contains(&due) {
                gaps.push(due);
            }
            due += period_ms;
        }
    }
    // A due time off the period's grid is as wrong as a missing one.
    let first = unique.first().copied().unwrap_or(0);
    gaps.extend(
        unique
            .iter()
            .filter(|d| (**d - first) % period_ms != 0)
            .copied(),
    );
    CronFires {
        fires: unique.len(),
        duplicates: dues_ms.len() - unique.len(),
        gaps,
    }
}

/// The due time (ms) in a schedule job's idempotency key `schedule/{name}/{due_ms}`.
pub fn due_of(key: &str, schedule: &str) -> Option<i64> {
    key.strip_prefix("schedule/")?
        .strip_prefix(schedule)?
        .strip_prefix('/')?
        .parse()
        .ok()
}

/// The nearest-rank percentile `p` (0–100) of `sorted` (ascending, not empty).
pub fn percentile(sorted: &[Duration], p: usize) -> Duration {
    let rank = (sorted.len() * p).div_ceil(100).max(1);
    sorted[rank.min(sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    // Proves the cron check counts a repeated due time as a duplicate and a missing or
    // off-grid second as a gap, and passes a clean run.
    #[test]
    fn cron_check_catches_duplicates_and_gaps() {
        let clean = cron_fires(&[3000, 1000, 2000, 4000], 1000);
        assert_eq!(
            clean,
            CronFires {
                fires: 4,
                duplicates: 0,
                gaps: vec![]
            }
        );
        let doubled = cron_fires(&[1000, 2000, 2000, 3000], 1000);
        assert_eq!((doubled.fires, doubled.duplicates), (3, 1));
        assert_eq!(
            cron_fires(&[1000, 2000, 4000, 6000], 1000).gaps,
            [3000, 5000]
        );
        assert_eq!(cron_fires(&[1000, 2500, 3000], 1000).gaps, [2000, 2500]);
        assert_eq!(cron_fires(&[], 1000).fires, 0);
    }

    // Proves due times are read from schedule keys only, and only for the named schedule.
    #[test]
    fn history_check_catches_gaps_and_lost_or_doubled_leases() {
        use serde_json::json;
        let entry = |seq: i64, kind: &str, step: &str, attempt: u64| json!({"seq": seq, "kind": kind, "step": step, "attempt": attempt});
        let good = vec![
            json!({"seq": 1, "kind": "job_submitted"}),
            entry(2, "step_leased", "a", 1),
            entry(3, "step_lease_expired", "a", 1),
            entry(4, "step_leased", "a", 2),
            entry(5, "step_leased", "b", 1),
        ];
        let attempts = [("a".to_string(), 2), ("b".to_string(), 1)];
        assert!(history_violations("j", &good, &attempts).is_empty());
        let mut gap = good.clone();
        gap.remove(2);
        assert_eq!(history_violations("j", &gap, &attempts).len(), 1);
        let lost = &good[..4];
        assert_eq!(history_violations("j", lost, &attempts).len(), 1);
        let mut doubled = good.clone();
        doubled.push(entry(6, "step_leased", "b", 1));
        assert_eq!(history_violations("j", &doubled, &attempts).len(), 1);
    }

    #[test]
    fn due_times_come_from_schedule_keys() {
        assert_eq!(
            due_of("schedule/ticker/1700000000000", "ticker"),
            Some(1_700_000_000_000)
        );
        assert_eq!(due_of("schedule/tickers/1", "ticker"), None);
        assert_eq!(due_of("mn-1-0", "ticker"), None);
    }

    // Proves the nearest-rank percentile on small and even-sized samples.
    #[test]
    fn percentiles_are_nearest_rank() {
        let ms = |v: &[u64]| {
            v.iter()
                .map(|m| Duration::from_millis(*m))
                .collect::<Vec<_>>()
        };
        let s = ms(&(1..=200).collect::<Vec<_>>());
        assert_eq!(percentile(&s, 50), Duration::from_millis(100));
        assert_eq!(percentile(&s, 99), Duration::from_millis(198));
        assert_eq!(percentile(&s, 100), Duration::from_millis(200));
        assert_eq!(percentile(&ms(&[7]), 99), Duration::from_millis(7));
    }
}
