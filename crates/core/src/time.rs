//! Instants and lengths of time as the API writes them.
//!
//! Instants are whole milliseconds since the Unix epoch (UTC) and are written as RFC 3339.
//! Lengths of time are written as strings such as `"250ms"`, `"30s"`, `"5m"`, `"1h30m"`.

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, SecondsFormat, TimeZone, Utc};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// An instant: milliseconds since the Unix epoch, UTC.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Timestamp(pub i64);

impl Timestamp {
    pub fn from_millis(ms: i64) -> Self {
        Timestamp(ms)
    }

    pub fn as_millis(self) -> i64 {
        self.0
    }

    pub fn plus(self, span: Span) -> Self {
        Timestamp(self.0.saturating_add(span.as_millis_i64()))
    }

    /// Milliseconds from `self` until `later`, zero if `later` is not later.
    pub fn until(self, later: Timestamp) -> Span {
        Span::from_millis(later.0.saturating_sub(self.0).max(0) as u64)
    }

    pub fn to_rfc3339(self) -> String {
        match Utc.timestamp_millis_opt(self.0) {
            chrono::LocalResult::Single(t) => t.to_rfc3339_opts(SecondsFormat::Millis, true),
            _ => format!("@{}ms", self.0),
        }
    }

    pub fn parse_rfc3339(s: &str) -> Result<Self, String> {
        let t = DateTime::parse_from_rfc3339(s)
            .map_err(|e| format!("`{s}` is not an RFC 3339 time ({e})"))?;
        Ok(Timestamp(t.with_timezone(&Utc).timestamp_millis()))
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_rfc3339())
    }
}

impl Serialize for Timestamp {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_rfc3339())
    }
}

impl<'de> Deserialize<'de> for Timestamp {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Timestamp::parse_rfc3339(&s).map_err(serde::de::Error::custom)
    }
}

/// A length of time with millisecond resolution, written like `"30s"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Span(u64);

/// The longest span we accept anywhere (about 10 years): keeps arithmetic far from overflow.
pub const SPAN_MAX_MS: u64 = 10 * 366 * 24 * 3600 * 1000;

impl Span {
    pub const ZERO: Span = Span(0);

    pub const fn from_millis(ms: u64) -> Self {
        Span(ms)
    }

    pub const fn from_secs(s: u64) -> Self {
        Span(s * 1000)
    }

    pub fn as_millis(self) -> u64 {
        self.0
    }

    pub fn as_millis_i64(self) -> i64 {
        self.0.min(i64::MAX as u64) as i64
    }

    pub fn plus_span(self, other: Span) -> Span {
        Span(self.0.saturating_add(other.0))
    }

    pub fn as_std(self) -> std::time::Duration {
        std::time::Duration::from_millis(self.0)
    }
}

impl From<std::time::Duration> for Span {
    fn from(d: std::time::Duration) -> Self {
        Span(d.as_millis().min(u64::MAX as u128) as u64)
    }
}

impl FromStr for Span {
    type Err = String;

    /// Accepts one or more `<number><unit>` parts, units `ms`, `s`, `m`, `h`, `d`
    /// (e.g. `"1h30m"`, `"1.5s"`). A bare `"0"` is zero.
    fn from_str(s: &str) -> Result<Self, String> {
        let bad =
            || format!("`{s}` is not a duration (use e.g. \"250ms\", \"30s\", \"5m\", \"1h\")");
        let text = s.trim();
        if text == "0" {
            return Ok(Span(0));
        }
        if text.is_empty() {
            return Err(bad());
        }
        let mut total: f64 = 0.0;
        let mut rest = text;
        while !rest.is_empty() {
            let num_len = rest
                .find(|c: char| !(c.is_ascii_digit() || c == '.'))
                .ok_or_else(bad)?;
            if num_len == 0 {
                return Err(bad());
            }
            let value: f64 = rest[..num_len].parse().map_err(|_| bad())?;
            rest = &rest[num_len..];
            let unit_len = rest
                .find(|c: char| c.is_ascii_digit() || c == '.')
                .unwrap_or(rest.len());
            let factor = match &rest[..unit_len] {
                "ms" => 1.0,
                "s" => 1_000.0,
                "m" => 60_000.0,
                "h" => 3_600_000.0,
                "d" => 86_400_000.0,
                _ => return Err(bad()),
            };
            rest = &rest[unit_len..];
            total += value * factor;
        }
        if !total.is_finite() || total > SPAN_MAX_MS as f64 {
            return Err(format!(
                "`{s}` is longer than the longest duration allowed (10 years)"
            ));
        }
        Ok(Span(total.round() as u64))
    }
}

impl fmt::Display for Span {
    /// Writes the shortest exact form: `"250ms"`, `"30s"`, `"5m"`, `"2h"`, else milliseconds.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.0;
        if ms == 0 {
            f.write_str("0s")
        } else if ms.is_multiple_of(3_600_000) {
            write!(f, "{}h", ms / 3_600_000)
        } else if ms.is_multiple_of(60_000) {
            write!(f, "{}m", ms / 60_000)
        } else if ms.is_multiple_of(1_000) {
            write!(f, "{}s", ms / 1_000)
        } else {
            write!(f, "{ms}ms")
        }
    }
}

impl Serialize for Span {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Span {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// In the API a time is an RFC 3339 string in UTC.
impl utoipa::PartialSchema for Timestamp {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{KnownFormat, ObjectBuilder, SchemaFormat, Type};
        ObjectBuilder::new()
            .schema_type(Type::String)
            .format(Some(SchemaFormat::KnownFormat(KnownFormat::DateTime)))
            .examples([serde_json::json!("2026-12-01T09:00:00Z")])
            .into()
    }
}

impl utoipa::ToSchema for Timestamp {}

/// In the API a duration is a string of numbers with units: `250ms`, `30s`, `5m`, `1h`, `7d`.
impl utoipa::PartialSchema for Span {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{ObjectBuilder, Type};
        ObjectBuilder::new()
            .schema_type(Type::String)
            // Exactly what `Span::from_str` takes (a bare `0`, surrounding white space).
            .pattern(Some(
                r"^\s*(0|(([0-9]+\.?[0-9]*|\.[0-9]+)(ms|s|m|h|d))+)\s*$",
            ))
            .examples([serde_json::json!("30s")])
            .into()
    }
}

impl utoipa::ToSchema for Span {}

#[cfg(test)]
mod tests {
    use super::*;

    // Proves the duration grammar accepts the documented forms and rejects the rest.
    #[test]
    fn spans_parse_and_print() {
        let cases = [
            ("250ms", 250),
            ("30s", 30_000),
            ("5m", 300_000),
            ("1h30m", 5_400_000),
            ("1.5s", 1_500),
            ("0", 0),
            ("2d", 172_800_000),
        ];
        for (text, ms) in cases {
            assert_eq!(text.parse::<Span>().unwrap().as_millis(), ms, "{text}");
        }
        for bad in ["", "s", "10", "10x", "-5s", "1.2.3s", "ms10", "99999999d"] {
            assert!(bad.parse::<Span>().is_err(), "{bad:?} should be rejected");
        }
        assert_eq!(Span::from_millis(1500).to_string(), "1500ms");
        assert_eq!(Span::from_secs(90).to_string(), "90s");
        assert_eq!(Span::from_secs(300).to_string(), "5m");
    }

    // Proves timestamps round-trip through RFC 3339 and reject other text.
    #[test]
    fn timestamps_round_trip() {
        let t = Timestamp::parse_rfc3339("2026-11-22T10:00:00.250Z").unwrap();
        assert_eq!(t.to_rfc3339(), "2026-11-22T10:00:00.250Z");
        let offset = Timestamp::parse_rfc3339("2026-11-22T11:00:00.250+01:00").unwrap();
        assert_eq!(offset, t);
        assert!(Timestamp::parse_rfc3339("tomorrow").is_err());
    }
}
