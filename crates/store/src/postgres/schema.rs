//! The PostgreSQL schema as an ordered list of migrations.
//!
//! `schema_migrations` records each version applied. Opening a store applies the missing ones in
//! one transaction that first takes a transaction-scoped advisory lock ([`MIGRATION_LOCK`]), so
//! nodes starting together migrate one after the other and the later ones find nothing to do.
//! The migrations are numbered files in `crates/store/migrations/postgres/`; the schema they leave
//! a new store with is `crates/store/schema/postgres.sql`, checked against a migrated store by a
//! test. Never edit a migration that has shipped: append a new file.
//!
//! The tables mirror the SQLite backend's, with PostgreSQL types: ids are `uuid`, instants are
//! `bigint` milliseconds (always passed in by the caller, never SQL's `now()`), JSON documents are
//! `text` holding exactly what serde_json wrote (`jsonb` would refuse `\u0000` and renumber
//! floats), and counters the core keeps as `u32` are `bigint` so every value fits.

/// The key of the advisory lock migrations hold (an arbitrary constant: "overseer" in ASCII).
pub(super) const MIGRATION_LOCK: i64 = 0x6f76_6572_7365_6572;

/// Migration `i` takes a database from version `i` to version `i + 1`.
pub(super) const MIGRATIONS: &[&str] = &[
    include_str!("../../migrations/postgres/0001_initial.sql"),
    include_str!("../../migrations/postgres/0002_backoff_formula.sql"),
    include_str!("../../migrations/postgres/0003_tokens.sql"),
    include_str!("../../migrations/postgres/0004_no_foreign_keys.sql"),
    include_str!("../../migrations/postgres/0005_index_names.sql"),
    include_str!("../../migrations/postgres/0006_settings.sql"),
    include_str!("../../migrations/postgres/0007_http_targets.sql"),
    include_str!("../../migrations/postgres/0008_console.sql"),
    include_str!("../../migrations/postgres/0009_retention.sql"),
    include_str!("../../migrations/postgres/0010_submitted_by.sql"),
    include_str!("../../migrations/postgres/0011_deadlines.sql"),
    include_str!("../../migrations/postgres/0012_job_rounds.sql"),
    include_str!("../../migrations/postgres/0013_rerun_progress.sql"),
    include_str!("../../migrations/postgres/0014_fewer_job_index_entries.sql"),
    include_str!("../../migrations/postgres/0015_retired_leases.sql"),
    include_str!("../../migrations/postgres/0016_fewer_job_indexes.sql"),
    include_str!("../../migrations/postgres/0017_claim_due_deferred_only.sql"),
    include_str!("../../migrations/postgres/0018_history_rows_per_write.sql"),
    include_str!("../../migrations/postgres/0019_unlogged_lease_entries.sql"),
    include_str!("../../migrations/postgres/0020_one_lease_index.sql"),
    include_str!("../../migrations/postgres/0021_unlogged_admission.sql"),
];

/// Created before anything else, outside the numbered migrations.
pub(super) const BOOKKEEPING: &str = r#"
CREATE TABLE IF NOT EXISTS schema_migrations (
    version    integer PRIMARY KEY,
    applied_at bigint NOT NULL
);
"#;
