//! The SQLite schema as an ordered list of migrations.
//!
//! `PRAGMA user_version` records how many migrations a file has seen; opening a file applies the
//! rest in one transaction.
//!
//! The migrations are numbered files in `crates/store/migrations/sqlite/`; the schema they leave
//! a new file with is `crates/store/schema/sqlite.sql`, checked against a migrated file by a
//! test. Never edit a migration that has shipped: append a new file.

/// Migration `i` takes a file from version `i` to version `i + 1`.
pub(super) const MIGRATIONS: &[&str] = &[
    include_str!("../../migrations/sqlite/0001_initial.sql"),
    include_str!("../../migrations/sqlite/0002_compensation.sql"),
    include_str!("../../migrations/sqlite/0003_claim_rank_keys_limits_leader_schedules.sql"),
    include_str!("../../migrations/sqlite/0004_backoff_formula.sql"),
    include_str!("../../migrations/sqlite/0005_tokens.sql"),
    include_str!("../../migrations/sqlite/0006_index_names.sql"),
    include_str!("../../migrations/sqlite/0007_settings.sql"),
    include_str!("../../migrations/sqlite/0008_http_targets.sql"),
    include_str!("../../migrations/sqlite/0009_console.sql"),
    include_str!("../../migrations/sqlite/0010_retention.sql"),
    include_str!("../../migrations/sqlite/0011_submitted_by.sql"),
    include_str!("../../migrations/sqlite/0012_deadlines.sql"),
    include_str!("../../migrations/sqlite/0013_job_rounds.sql"),
    include_str!("../../migrations/sqlite/0014_rerun_progress.sql"),
    include_str!("../../migrations/sqlite/0015_unfinished_without_in_lists.sql"),
    include_str!("../../migrations/sqlite/0016_history_and_leases_without_rowid.sql"),
    include_str!("../../migrations/sqlite/0017_retired_leases.sql"),
    include_str!("../../migrations/sqlite/0018_fewer_job_indexes.sql"),
    include_str!("../../migrations/sqlite/0019_no_foreign_keys.sql"),
    include_str!("../../migrations/sqlite/0020_claim_due_deferred_only.sql"),
    include_str!("../../migrations/sqlite/0021_history_rows_per_write.sql"),
    include_str!("../../migrations/sqlite/0022_one_lease_index.sql"),
    include_str!("../../migrations/sqlite/0023_admission_in_job_row.sql"),
    include_str!("../../migrations/sqlite/0024_ending_in_job_row.sql"),
    include_str!("../../migrations/sqlite/0025_lease_entry_in_step_row.sql"),
];
