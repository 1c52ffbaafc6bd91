//! `INFO`: the server's state in Faktory's shape: queues and their sizes, counters, uptime.

use serde_json::{json, Map, Value};

use super::Connection;
use crate::resp::Reply;

impl Connection {
    pub(super) async fn info(&self) -> Reply {
        let app = self.fk.app();
        let now = app.now();
        // A queue's size is what a worker could fetch from it now, as in Faktory: jobs waiting
        // for a retry or their `at` are in the retries and scheduled sets instead.
        let ready = match app.store().agents_ready_now(now).await {
            Ok(c) => c,
            Err(e) => return Reply::err(e),
        };
        let mut queues: Map<String, Value> = self
            .fk
            .queues_known()
            .into_iter()
            .map(|q| (q, json!(0)))
            .collect();
        for r in &ready {
            queues.insert(r.agent.clone(), json!(r.ready));
        }
        let total: u64 = ready.iter().map(|r| r.ready).sum();
        let st = self.fk.stats();
        let day_secs = now.as_millis().div_euclid(1000).rem_euclid(86_400);
        let utc = format!(
            "{:02}:{:02}:{:02} UTC",
            day_secs / 3600,
            day_secs / 60 % 60,
            day_secs % 60
        );
        Reply::json(&json!({
            "now": now.to_rfc3339(),
            "server_utc_time": utc,
            "faktory": {
                "total_failures": st.failures,
                "total_processed": st.processed,
                "total_enqueued": total,
                "total_queues": queues.len(),
                "queues": queues,
                "tasks": {
                    "Workers": { "size": st.workers },
                    "Leases": { "size": st.leases },
                    "Reaper": { "reaped_workers": st.reaped_workers, "released_leases": st.released_leases },
                },
            },
            "server": {
                "description": "Overseer (Faktory work protocol)",
                "faktory_version": crate::FAKTORY_VERSION,
                "uptime": st.uptime_secs,
                "connections": st.connections,
                "command_count": st.commands,
                "used_memory_mb": used_memory_mb(),
            },
        }))
    }
}

/// Resident memory of this process in MiB (Linux), else 0.
fn used_memory_mb() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4096 / (1024 * 1024))
}
