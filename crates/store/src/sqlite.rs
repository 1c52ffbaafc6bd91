//! SQLite backend (placeholder module body; being written).
