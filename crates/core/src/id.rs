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

/// The id of one lease, that is of one attempt of one step: the millisecond it was made, then 74
/// random bits, so it cannot be guessed (an agent's token may report on any lease it knows the id
/// of) and yet sorts by time.
///
/// The time prefix is for the stores: a lease row is keyed by this id, and with wholly random ids
/// every claim and every removal wrote a different page of that index (a 4 KB page of log per
/// lease; the `steady` benchmark in BENCHMARKS.md). Time-ordered ids keep the new leases on the
/// index's last pages and the old ones, removed together, on its first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct LeaseId(pub Uuid);

impl LeaseId {
    /// A new id. Reads the clock and randomness: call it at the edge, not in the core.
    pub fn generate() -> Self {
        // Without a context (no counter), every bit after the time prefix is random.
        LeaseId(Uuid::new_v7(uuid::Timestamp::now(uuid::NoContext)))
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

#[cfg(test)]
mod lease_id_tests {
    use super::*;

    // Proves lease ids sort by the millisecond they were made and still carry their random
    // bits: ids made in different milliseconds are in order, and ids made together share no
    // more than their time prefix (74 random bits each).
    #[test]
    fn lease_ids_sort_by_time_and_stay_unguessable() {
        let first = LeaseId::generate();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let later: Vec<LeaseId> = (0..64).map(|_| LeaseId::generate()).collect();
        assert!(
            later.iter().all(|id| *id > first),
            "a later id sorts after an earlier one"
        );
        assert!(later.iter().all(|id| id.0.get_version_num() == 7));
        let tail = |id: &LeaseId| u128::from_be_bytes(id.0.into_bytes()) & ((1u128 << 80) - 1);
        let mut tails: Vec<u128> = later.iter().map(tail).collect();
        tails.sort_unstable();
        tails.dedup();
        assert_eq!(
            tails.len(),
            later.len(),
            "each id has random bits of its own"
        );
        // Not a counter: two ids made one after the other differ in many random bits.
        let spread: u32 = later
            .windows(2)
            .map(|w| (tail(&w[0]) ^ tail(&w[1])).count_ones())
            .sum();
        assert!(
            spread > 63 * 20,
            "consecutive ids differ in {spread} bits over 63 pairs"
        );
    }
}
