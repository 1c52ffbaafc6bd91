//! The record of a run: the last entries in a bounded ring buffer, for the report of a failure,
//! and a running hash of every entry, to prove that a seed replays the same run.

use std::collections::hash_map::DefaultHasher;
use std::collections::VecDeque;
use std::hash::Hasher;

/// Entries kept for the report of a failure.
pub const TRACE_KEEP: usize = 300;
/// Characters kept of one entry (answers can be long).
const ENTRY_CHARS: usize = 400;

#[derive(Debug)]
pub struct Trace {
    entries: VecDeque<String>,
    /// Entries recorded since the start, kept or not.
    count: u64,
    hash: DefaultHasher,
}

impl Default for Trace {
    fn default() -> Self {
        Trace {
            entries: VecDeque::with_capacity(TRACE_KEEP),
            count: 0,
            hash: DefaultHasher::new(),
        }
    }
}

impl Trace {
    /// Records one entry; `at_ms` is the simulated clock relative to the start of the run.
    pub fn push(&mut self, at_ms: i64, entry: String) {
        self.hash.write(entry.as_bytes());
        self.hash.write_i64(at_ms);
        self.count += 1;
        let mut line = format!(
            "#{:<5} t={:>9.3}s {entry}",
            self.count,
            at_ms as f64 / 1000.0
        );
        if line.len() > ENTRY_CHARS {
            let mut cut = ENTRY_CHARS;
            while !line.is_char_boundary(cut) {
                cut -= 1;
            }
            line.truncate(cut);
            line.push('…');
        }
        if self.entries.len() == TRACE_KEEP {
            self.entries.pop_front();
        }
        self.entries.push_back(line);
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    /// A digest of every entry recorded so far: equal for two runs that did the same things
    /// and got the same answers at the same simulated times.
    pub fn fingerprint(&self) -> u64 {
        self.hash.clone().finish()
    }

    /// The kept entries, oldest first, one per line.
    pub fn render(&self) -> String {
        let mut out = String::new();
        if self.count > self.entries.len() as u64 {
            out.push_str(&format!(
                "… {} earlier entries not kept …\n",
                self.count - self.entries.len() as u64
            ));
        }
        for e in &self.entries {
            out.push_str(e);
            out.push('\n');
        }
        out
    }
}
