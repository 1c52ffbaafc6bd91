//! Typed identifiers.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// A job's id: a UUIDv7, so ids sort by creation time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct JobId(pub Uuid);

impl JobId {
    /// The ids that start with `prefix` (hex digits, dashes where the canonical form has them;
    /// at least 4 digits), as the smallest and largest such id, so a store can find them with a
    /// range on its primary key. `None` when `prefix` cannot begin an id.
    pub fn prefix_range(prefix: &str) -> Option<(JobId, JobId)> {
        let prefix = prefix.to_ascii_lowercase();
        let canonical = "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx";
        if prefix.len() > canonical.len() {
            return None;
        }
        let fits = prefix
            .chars()
            .zip(canonical.chars())
            .all(|(c, slot)| match slot {
                '-' => c == '-',
                _ => c.is_ascii_hexdigit(),
            });
        let digits: String = prefix.chars().filter(|c| *c != '-').collect();
        if !fits || digits.len() < 4 {
            return None;
        }
        let pad = |fill: char| {
            let mut hex = digits.clone();
            while hex.len() < 32 {
                hex.push(fill);
            }
            Uuid::parse_str(&hex).ok().map(JobId)
        };
        Some((pad('0')?, pad('f')?))
    }

    /// A new time-ordered id. Reads the clock and randomness: call it at the edge, not in the core.
    pub fn generate() -> Self {
        JobId(Uuid::now_v7())
    }
}

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl FromStr for JobId {
    type Err = uuid::Error;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Uuid::parse_str(s).map(JobId)
    }
}

/// The id of one lease, that is of one attempt of one step. Random, so it cannot be guessed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct LeaseId(pub Uuid);

impl LeaseId {
    pub fn generate() -> Self {
        LeaseId(Uuid::new_v4())
    }
}

impl fmt::Display for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl FromStr for LeaseId {
    type Err = uuid::Error;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Uuid::parse_str(s).map(LeaseId)
    }
}

/// Ids travel as UUID strings.
fn uuid_schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
    use utoipa::openapi::schema::{KnownFormat, ObjectBuilder, SchemaFormat, Type};
    ObjectBuilder::new()
        .schema_type(Type::String)
        .format(Some(SchemaFormat::KnownFormat(KnownFormat::Uuid)))
        .into()
}

impl utoipa::PartialSchema for JobId {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        uuid_schema()
    }
}

impl utoipa::ToSchema for JobId {}

impl utoipa::PartialSchema for LeaseId {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        uuid_schema()
    }
}

impl utoipa::ToSchema for LeaseId {}

#[cfg(test)]
mod prefix_tests {
    use super::*;

    // Proves a prefix maps to the range of ids that start with it, with or without dashes,
    // and that what cannot begin an id (too short, not hex, a dash out of place) maps to none.
    #[test]
    fn prefixes_map_to_id_ranges() {
        let (lo, hi) = JobId::prefix_range("01A3185C-77").unwrap();
        assert_eq!(lo.to_string(), "01a3185c-7700-0000-0000-000000000000");
        assert_eq!(hi.to_string(), "01a3185c-77ff-ffff-ffff-ffffffffffff");
        let full = "01a3185c-774f-7d9a-a6ce-af10a0119486";
        assert_eq!(
            JobId::prefix_range(full),
            Some((full.parse().unwrap(), full.parse().unwrap()))
        );
        for bad in ["01a", "01a3185c77", "zz12345", "01a3-185c", ""] {
            assert_eq!(JobId::prefix_range(bad), None, "{bad}");
        }
    }
}
