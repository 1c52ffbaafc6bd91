//! Fault injection for the crash test: a seeded RNG and "this agent's machine lost power".

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::common::{signal, signal_group, Agent};

/// SplitMix64: tiny, seedable, good enough to pick job shapes and kill instants. (The
/// workspace's `rand` is not a dependency of this crate, and reproducibility from a printed
/// `u64` is all we need.)
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo + 1)
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    pub fn chance(&mut self, percent: u64) -> bool {
        self.range(1, 100) <= percent
    }

    pub fn millis(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(self.range(lo, hi))
    }

    /// An independent stream, for a task that must not disturb this one's sequence.
    pub fn fork(&mut self) -> Rng {
        Rng(self.next_u64())
    }
}

/// The wall clock in nanoseconds, the same clock the scripts read with `date +%s%N`.
pub fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("the clock is after 1970")
        .as_nanos() as i64
}

/// SIGKILLs a command agent and every command it is running, as if its machine died, and
/// answers an instant (ns, as [`now_ns`]) after which none of them can write anything.
///
/// The command agent starts each command in a process group of its own (so that it can stop a
/// whole tree at a deadline), so killing the agent's group alone would leave its commands
/// running as orphans. So: freeze the agent with SIGSTOP (it can no longer start commands),
/// wait until every thread of it is stopped, SIGKILL each child and the child's group, then
/// SIGKILL the agent's group and reap it. Only the step script itself (`sh`, a direct child)
/// writes journal lines, and each line's timestamp is read before the write, so every line
/// any of them wrote carries an earlier timestamp than the instant answered here.
pub fn kill_machine(agent: &mut Agent) -> i64 {
    let pid = agent.pid();
    signal(pid, "STOP");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !all_threads_stopped(pid) {
        if Instant::now() > deadline {
            eprintln!("agent {pid} did not stop within 10s of SIGSTOP; killing it anyway");
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    for child in children(pid) {
        signal(child, "KILL");
        signal_group(child, "KILL");
    }
    agent.kill();
    now_ns()
}

/// The fields of a `/proc/.../stat` file after the parenthesised command name (which may
/// itself hold spaces and parentheses): state, parent pid, process group, …
fn stat_fields(stat: &str) -> Vec<&str> {
    stat.rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default()
}

fn all_threads_stopped(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return true; // gone already
    };
    tasks.flatten().all(|t| {
        std::fs::read_to_string(t.path().join("stat"))
            .map(|s| matches!(stat_fields(&s).first(), Some(&("T" | "t" | "Z" | "X"))))
            .unwrap_or(true)
    })
}

/// The processes whose parent is `pid`.
fn children(pid: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&p| {
            std::fs::read_to_string(format!("/proc/{p}/stat"))
                .ok()
                .and_then(|s| stat_fields(&s).get(1)?.parse::<u32>().ok())
                == Some(pid)
        })
        .collect()
}
