//! Bounded fuzzing of what the server parses from untrusted input: job specs, durations, times
//! and cron patterns. Each property feeds generated input and asks only that parsing never
//! panics and that what it accepts behaves (a duration prints back to itself, a cron pattern's
//! next time is later than the time asked about). Case counts keep the run to seconds in CI;
//! `PROPTEST_CASES=100000 cargo test -p overseer-core --test fuzz` digs deeper.

use overseer_core::schedule::CronSchedule;
use overseer_core::spec::{decode, decode_bytes, JobSpec, Limits};
use overseer_core::{Span, Timestamp};
use proptest::prelude::*;
use serde_json::{json, Value};

/// Arbitrary JSON, biased toward the shapes a job spec has.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>().prop_map(|f| json!(f)),
        "[a-z0-9 _:./*-]{0,12}".prop_map(Value::String),
        prop_oneof![
            Just("30s"),
            Just("0ms"),
            Just("1h"),
            Just("-1s"),
            Just("1e9d")
        ]
        .prop_map(|s| json!(s)),
    ];
    leaf.prop_recursive(4, 64, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(
                prop_oneof![
                    Just("steps".to_string()),
                    Just("name".to_string()),
                    Just("agent".to_string()),
                    Just("depends_on".to_string()),
                    Just("timeout".to_string()),
                    Just("backoff".to_string()),
                    Just("run_at".to_string()),
                    Just("labels".to_string()),
                    Just("compensate".to_string()),
                    "[a-z_]{1,8}",
                ],
                inner,
                0..6,
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2_000, ..ProptestConfig::default() })]

    // Proves a spec of any shape is decoded and validated without a panic, and every refusal
    // says something.
    #[test]
    fn any_json_spec_is_judged_without_panic(value in json_value()) {
        if let Ok(spec) = decode::<JobSpec>(value) {
            if let Err(e) = spec.validate(&Limits::default()) {
                prop_assert!(!e.to_string().is_empty());
            }
        }
    }

    // Proves arbitrary bytes as a request body never panic the decoder.
    #[test]
    fn any_bytes_as_a_body_are_judged_without_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        let _ = decode_bytes::<JobSpec>(&bytes);
    }

    // Proves a duration either fails to parse or prints back to the same length of time.
    #[test]
    fn durations_parse_or_refuse(s in "[0-9]{0,12}(\\.[0-9]{0,4})?(ms|s|m|h|d|x|)([0-9]{0,3}(ms|s|m))?") {
        if let Ok(span) = s.parse::<Span>() {
            let again: Span = span.to_string().parse().expect("a printed duration parses");
            prop_assert_eq!(again, span);
        }
    }

    // Proves RFC 3339 parsing never panics on near-miss input.
    #[test]
    fn times_parse_or_refuse(s in "[0-9]{1,5}-[0-9]{1,2}-[0-9]{1,2}T[0-9]{1,2}:[0-9]{1,2}:[0-9]{1,2}(\\.[0-9]{1,9})?(Z|[+-][0-9]{2}:[0-9]{2})?") {
        let _ = Timestamp::parse_rfc3339(&s);
    }

    // Proves cron patterns of any field mix either are refused or give a next time later than
    // the time asked about, in any of a few time zones.
    #[test]
    fn cron_patterns_parse_or_refuse(
        fields in prop::collection::vec("(\\*|[0-9]{1,2}|[0-9]{1,2}-[0-9]{1,2}|\\*/[0-9]{1,2}|[0-9],[0-9]{1,2}|MON|JAN|L|\\?)", 4..8),
        zone in prop_oneof![Just("UTC"), Just("Europe/Berlin"), Just("America/New_York"), Just("Mars/Base")],
        at in 0i64..4_102_444_800_000,
    ) {
        if let Ok(schedule) = CronSchedule::parse(&fields.join(" "), zone) {
            let after = Timestamp::from_millis(at);
            if let Some(next) = schedule.next_after(after) {
                prop_assert!(next > after, "{} after {}", next, after);
            }
        }
    }
}
