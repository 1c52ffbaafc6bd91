-- A claim that only leases work (its one entry is `step_leased`, no job field changes) writes
-- no history row: its entry is kept in the step row it writes anyway, `lease_entry` (a JSON
-- array of that one entry, as `more` keeps entries) numbered `lease_entry_seq`. It stays there
-- until the step is leased again, when it is moved to a history row of its own first. Readers
-- merge it in by number; trimming cuts it like any other entry.
ALTER TABLE steps ADD COLUMN lease_entry_seq INTEGER;
ALTER TABLE steps ADD COLUMN lease_entry TEXT;
