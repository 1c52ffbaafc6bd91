//! The crash test's journal: what the step scripts really did, and the checks run over it.
//!
//! Every step script appends `start JOB STEP ATTEMPT NS PID` when it begins and `end JOB STEP
//! ATTEMPT NS PID` when its work is done (NS: `date +%s%N`, the wall clock in nanoseconds; PID:
//! the command agent that ran it). Each line is one short `O_APPEND` write, so lines from
//! concurrent scripts never interleave. An *execution* is one `start` line and, if the script
//! got that far, its `end` line.
//!
//! Everything here is pure (no processes, no HTTP), so the checks themselves are unit-tested at
//! the bottom of this file: each one is shown to fail on a journal that breaks its rule.

use std::collections::{BTreeMap, HashMap};

pub type StepKey = (String, String);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mark {
    Start,
    End,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Line {
    pub mark: Mark,
    pub job: String,
    pub step: String,
    pub attempt: u32,
    pub at_ns: i64,
    pub agent_pid: u32,
}

/// Parses the journal; answers the lines and any that do not parse.
pub fn parse(text: &str) -> (Vec<Line>, Vec<String>) {
    let mut lines = Vec::new();
    let mut malformed = Vec::new();
    for raw in text.lines().filter(|l| !l.trim().is_empty()) {
        match parse_line(raw) {
            Some(line) => lines.push(line),
            None => malformed.push(raw.to_string()),
        }
    }
    (lines, malformed)
}

fn parse_line(raw: &str) -> Option<Line> {
    let f: Vec<&str> = raw.split_whitespace().collect();
    if f.len() != 6 {
        return None;
    }
    let mark = match f[0] {
        "start" => Mark::Start,
        "end" => Mark::End,
        _ => return None,
    };
    Some(Line {
        mark,
        job: f[1].to_string(),
        step: f[2].to_string(),
        attempt: f[3].parse().ok()?,
        at_ns: f[4].parse().ok()?,
        agent_pid: f[5].parse().ok()?,
    })
}

/// One run of a step script.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Execution {
    pub attempt: u32,
    pub agent_pid: u32,
    pub start_ns: i64,
    /// `None`: the script was stopped before it wrote its `end` line.
    pub end_ns: Option<i64>,
}

/// What is known, besides the journal, about when executions without an `end` line stopped.
#[derive(Default)]
pub struct Bounds {
    /// Every SIGKILL of a command agent's machine (the agent and all its commands): agent pid
    /// and the instant (ns) after which none of its commands could write anything.
    pub kills: Vec<(u32, i64)>,
    /// `step_lease_expired` events: (job, step, attempt) → the event's instant (ns; the server
    /// records whole milliseconds, no earlier than the lease's `lease_expires_at`).
    pub expiries: HashMap<(String, String, u32), i64>,
}

impl Bounds {
    /// The latest instant an execution with no `end` line can have been running, or `None` if
    /// nothing bounds it (then it counts as running forever).
    ///
    /// Such an execution was stopped in one of two ways, and each gives a bound:
    /// - its agent's machine was SIGKILLed by the test after the execution started: it ended
    ///   no later than that kill (the first kill of that agent pid after the start, so a
    ///   recycled pid cannot lend an earlier kill);
    /// - the command agent killed it at the lease's local deadline, which the agent keeps
    ///   strictly before the server's `lease_expires_at`; the server then records
    ///   `step_lease_expired` for that attempt at or after `lease_expires_at`. So the event's
    ///   instant bounds the execution, and it is exactly the instant from which the server may
    ///   lease the step again: any later attempt that starts before it ran concurrently.
    ///
    /// Both bounds are upper bounds only if the system behaves; taking the smaller one keeps
    /// the check as strict as possible.
    pub fn end_bound(&self, job: &str, step: &str, e: &Execution) -> Option<i64> {
        let killed = self
            .kills
            .iter()
            .filter(|(pid, at)| *pid == e.agent_pid && *at >= e.start_ns)
            .map(|(_, at)| *at)
            .min();
        let expired = self
            .expiries
            .get(&(job.to_string(), step.to_string(), e.attempt))
            .copied();
        match (killed, expired) {
            (Some(k), Some(x)) => Some(k.min(x)),
            (k, x) => k.or(x),
        }
    }
}

/// The journal grouped into executions per (job, step), each group ordered by start.
pub struct Journal {
    pub steps: BTreeMap<StepKey, Vec<Execution>>,
}

impl Journal {
    /// Pairs `start` and `end` lines by (job, step, attempt). A second `start` of one attempt
    /// (the server handed out one fencing token twice), an `end` without a `start`, or an `end`
    /// before its `start` are problems, reported rather than paired.
    pub fn build(lines: &[Line]) -> (Journal, Vec<String>) {
        let mut problems = Vec::new();
        let mut by_attempt: BTreeMap<(String, String, u32), Execution> = BTreeMap::new();
        for l in lines.iter().filter(|l| l.mark == Mark::Start) {
            let key = (l.job.clone(), l.step.clone(), l.attempt);
            if by_attempt.contains_key(&key) {
                problems.push(format!(
                    "attempt {} of {}/{} started twice (the second at {} by agent {})",
                    l.attempt, l.job, l.step, l.at_ns, l.agent_pid
                ));
                continue;
            }
            by_attempt.insert(
                key,
                Execution {
                    attempt: l.attempt,
                    agent_pid: l.agent_pid,
                    start_ns: l.at_ns,
                    end_ns: None,
                },
            );
        }
        for l in lines.iter().filter(|l| l.mark == Mark::End) {
            let key = (l.job.clone(), l.step.clone(), l.attempt);
            match by_attempt.get_mut(&key) {
                None => problems.push(format!(
                    "attempt {} of {}/{} ended without a start",
                    l.attempt, l.job, l.step
                )),
                Some(e) if e.end_ns.is_some() => problems.push(format!(
                    "attempt {} of {}/{} ended twice",
                    l.attempt, l.job, l.step
                )),
                Some(e) if l.at_ns < e.start_ns => problems.push(format!(
                    "attempt {} of {}/{} ended before it started",
                    l.attempt, l.job, l.step
                )),
                Some(e) => e.end_ns = Some(l.at_ns),
            }
        }
        let mut steps: BTreeMap<StepKey, Vec<Execution>> = BTreeMap::new();
        for ((job, step, _), e) in by_attempt {
            steps.entry((job, step)).or_default().push(e);
        }
        for execs in steps.values_mut() {
            execs.sort_by_key(|e| (e.start_ns, e.attempt));
        }
        (Journal { steps }, problems)
    }

    pub fn executions(&self) -> usize {
        self.steps.values().map(Vec::len).sum()
    }

    pub fn unfinished(&self) -> usize {
        self.steps
            .values()
            .flatten()
            .filter(|e| e.end_ns.is_none())
            .count()
    }

    pub fn execution(&self, job: &str, step: &str, attempt: u32) -> Option<&Execution> {
        self.steps
            .get(&(job.to_string(), step.to_string()))?
            .iter()
            .find(|e| e.attempt == attempt)
    }

    /// Every pair of executions of one step that ran at the same time. Executions are taken in
    /// order of start; each must start strictly after every earlier one ended (its `end` line,
    /// or [`Bounds::end_bound`] without one; unbounded means it never ended). Comparing every
    /// pair, not only neighbours, catches a long execution overlapping several later ones. A
    /// later start with a lower attempt number is reported too: attempts are fencing tokens
    /// and only ever increase.
    pub fn overlaps(&self, bounds: &Bounds) -> Vec<String> {
        let mut found = Vec::new();
        for ((job, step), execs) in &self.steps {
            for (i, earlier) in execs.iter().enumerate() {
                let ended = earlier
                    .end_ns
                    .or_else(|| bounds.end_bound(job, step, earlier));
                for later in &execs[i + 1..] {
                    if later.attempt <= earlier.attempt {
                        found.push(format!(
                            "{job}/{step}: attempt {} started at {} after attempt {} (started at {})",
                            later.attempt, later.start_ns, earlier.attempt, earlier.start_ns
                        ));
                    }
                    let clash = match ended {
                        Some(end) => later.start_ns <= end,
                        None => true,
                    };
                    if clash {
                        let how = match (earlier.end_ns, ended) {
                            (Some(_), _) => "ended".to_string(),
                            (None, Some(_)) => "was killed by".to_string(),
                            (None, None) => "never ended (no end line, agent not killed, \
                                             no lease expiry)"
                                .to_string(),
                        };
                        found.push(format!(
                            "{job}/{step}: attempt {} started at {} while attempt {} (agent {}, \
                             started at {}) was still running: it {how} {}",
                            later.attempt,
                            later.start_ns,
                            earlier.attempt,
                            earlier.agent_pid,
                            earlier.start_ns,
                            ended.map_or("-".to_string(), |e| e.to_string()),
                        ));
                    }
                }
            }
        }
        found
    }

    /// Every start of a step that came before one of its dependencies was done: each
    /// dependency must have an `end` line from the attempt whose result the server recorded
    /// (`recorded`: (job, step) → that attempt), earlier than the start.
    pub fn dependency_violations(
        &self,
        depends_on: &HashMap<StepKey, Vec<String>>,
        recorded: &HashMap<StepKey, u32>,
    ) -> Vec<String> {
        let mut found = Vec::new();
        for ((job, step), execs) in &self.steps {
            let deps = depends_on
                .get(&(job.clone(), step.clone()))
                .map(Vec::as_slice)
                .unwrap_or_default();
            for e in execs {
                for dep in deps {
                    let Some(&attempt) = recorded.get(&(job.clone(), dep.clone())) else {
                        found.push(format!(
                            "{job}/{step} attempt {} ran but the server recorded no successful \
                             attempt of its dependency {dep}",
                            e.attempt
                        ));
                        continue;
                    };
                    match self.execution(job, dep, attempt).and_then(|d| d.end_ns) {
                        Some(done) if done < e.start_ns => {}
                        Some(done) => found.push(format!(
                            "{job}/{step} attempt {} started at {} before its dependency {dep} \
                             (attempt {attempt}) ended at {done}",
                            e.attempt, e.start_ns
                        )),
                        None => found.push(format!(
                            "{job}/{step} attempt {} started at {} but its dependency {dep} has \
                             no end line for the recorded attempt {attempt}",
                            e.attempt, e.start_ns
                        )),
                    }
                }
            }
        }
        found
    }

    /// Checks one succeeded step against the server's record: its `attempt` is at least the
    /// number of attempts the journal saw, and no journal attempt is newer than it (else the
    /// server forgot a lease it handed out); its result names that same attempt, and that
    /// attempt wrote its `end` line.
    pub fn record_violations(
        &self,
        job: &str,
        step: &str,
        server_attempt: u32,
        result_attempt: Option<u32>,
    ) -> Vec<String> {
        let mut found = Vec::new();
        let execs = self
            .steps
            .get(&(job.to_string(), step.to_string()))
            .map(Vec::as_slice)
            .unwrap_or_default();
        if (execs.len() as u64) > u64::from(server_attempt) {
            found.push(format!(
                "{job}/{step}: the server counts {server_attempt} attempts, the journal saw {}",
                execs.len()
            ));
        }
        if let Some(newest) = execs.iter().map(|e| e.attempt).max() {
            if newest > server_attempt {
                found.push(format!(
                    "{job}/{step}: attempt {newest} ran but the server's attempt is {server_attempt}"
                ));
            }
        }
        match result_attempt {
            None => found.push(format!(
                "{job}/{step}: the recorded result does not name an attempt"
            )),
            Some(r) if r != server_attempt => found.push(format!(
                "{job}/{step}: the result came from attempt {r}, the step's attempt is {server_attempt}"
            )),
            Some(r) => {
                if self.execution(job, step, r).and_then(|e| e.end_ns).is_none() {
                    found.push(format!(
                        "{job}/{step}: the result came from attempt {r}, which has no end line"
                    ));
                }
            }
        }
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(mark: Mark, job: &str, step: &str, attempt: u32, at_ns: i64, pid: u32) -> Line {
        Line {
            mark,
            job: job.into(),
            step: step.into(),
            attempt,
            at_ns,
            agent_pid: pid,
        }
    }

    fn journal(lines: &[Line]) -> Journal {
        let (j, problems) = Journal::build(lines);
        assert!(problems.is_empty(), "{problems:?}");
        j
    }

    // Proves the journal parser reads the scripts' lines and sets aside anything torn.
    #[test]
    fn parses_lines_and_flags_torn_ones() {
        let (lines, bad) = parse("start j1 a 1 100 42\nend j1 a 1 200 42\nstart j1 b\n\nend x\n");
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[1], line(Mark::End, "j1", "a", 1, 200, 42));
        assert_eq!(bad, vec!["start j1 b".to_string(), "end x".to_string()]);
    }

    // Proves the overlap check fails on two attempts running at once, and on an attempt that
    // starts while an earlier one without an end line was neither killed nor expired.
    #[test]
    fn overlap_check_catches_concurrent_attempts() {
        use Mark::*;
        let ok = journal(&[
            line(Start, "j", "s", 1, 100, 7),
            line(End, "j", "s", 1, 200, 7),
            line(Start, "j", "s", 2, 201, 8),
            line(End, "j", "s", 2, 300, 8),
        ]);
        assert!(ok.overlaps(&Bounds::default()).is_empty());

        let both = journal(&[
            line(Start, "j", "s", 1, 100, 7),
            line(Start, "j", "s", 2, 150, 8),
            line(End, "j", "s", 1, 200, 7),
            line(End, "j", "s", 2, 300, 8),
        ]);
        assert_eq!(both.overlaps(&Bounds::default()).len(), 1);

        // Attempt 1 has no end line: unbounded, so attempt 2 overlaps it...
        let cut = journal(&[
            line(Start, "j", "s", 1, 100, 7),
            line(Start, "j", "s", 2, 500, 8),
            line(End, "j", "s", 2, 600, 8),
        ]);
        assert_eq!(cut.overlaps(&Bounds::default()).len(), 1);
        // ...unless its agent was killed before attempt 2 started (a kill before attempt 1
        // started, of a recycled pid, does not count)...
        let killed = Bounds {
            kills: vec![(7, 50), (7, 400)],
            ..Bounds::default()
        };
        assert!(cut.overlaps(&killed).is_empty());
        let too_late = Bounds {
            kills: vec![(7, 50), (7, 550)],
            ..Bounds::default()
        };
        assert_eq!(cut.overlaps(&too_late).len(), 1);
        // ...or its lease expired on the server before attempt 2 started.
        let mut expired = Bounds::default();
        expired.expiries.insert(("j".into(), "s".into(), 1), 450);
        assert!(cut.overlaps(&expired).is_empty());
        expired.expiries.insert(("j".into(), "s".into(), 1), 500);
        assert_eq!(cut.overlaps(&expired).len(), 1);

        // A long attempt overlapping not its neighbour but a later one is caught.
        let long = journal(&[
            line(Start, "j", "s", 1, 100, 7),
            line(Start, "j", "s", 2, 150, 8),
            line(Start, "j", "s", 3, 900, 8),
            line(End, "j", "s", 1, 1000, 7),
        ]);
        let mut b = Bounds::default();
        b.expiries.insert(("j".into(), "s".into(), 2), 160);
        assert_eq!(long.overlaps(&b).len(), 2);
    }

    // Proves one attempt number run twice is reported when the journal is built.
    #[test]
    fn reused_attempt_is_a_problem() {
        use Mark::*;
        let (_, problems) = Journal::build(&[
            line(Start, "j", "s", 1, 100, 7),
            line(Start, "j", "s", 1, 150, 8),
        ]);
        assert_eq!(problems.len(), 1, "{problems:?}");
    }

    // Proves the dependency check fails when a step starts before the recorded attempt of a
    // dependency ended, or when that attempt never ended.
    #[test]
    fn dependency_check_catches_early_starts() {
        use Mark::*;
        let deps: HashMap<StepKey, Vec<String>> =
            [(("j".to_string(), "d".to_string()), vec!["a".to_string()])].into();
        let recorded: HashMap<StepKey, u32> = [(("j".to_string(), "a".to_string()), 2)].into();
        let j = journal(&[
            line(Start, "j", "a", 1, 100, 7),
            line(End, "j", "a", 1, 200, 7),
            line(Start, "j", "a", 2, 300, 7),
            line(End, "j", "a", 2, 400, 7),
            line(Start, "j", "d", 1, 401, 7),
        ]);
        assert!(j.dependency_violations(&deps, &recorded).is_empty());
        // Started after attempt 1 ended, but attempt 2 is the one recorded.
        let early = journal(&[
            line(Start, "j", "a", 1, 100, 7),
            line(End, "j", "a", 1, 200, 7),
            line(Start, "j", "d", 1, 250, 7),
            line(Start, "j", "a", 2, 300, 7),
            line(End, "j", "a", 2, 400, 7),
        ]);
        assert_eq!(early.dependency_violations(&deps, &recorded).len(), 1);
        let never = journal(&[
            line(Start, "j", "a", 2, 300, 7),
            line(Start, "j", "d", 1, 401, 7),
        ]);
        assert_eq!(never.dependency_violations(&deps, &recorded).len(), 1);
    }

    // Proves the record check fails when the result names another attempt than the step's,
    // an attempt without an end line, or when the journal saw more attempts than the server.
    #[test]
    fn record_check_catches_wrong_results() {
        use Mark::*;
        let j = journal(&[
            line(Start, "j", "s", 1, 100, 7),
            line(Start, "j", "s", 2, 300, 7),
            line(End, "j", "s", 2, 400, 7),
        ]);
        assert!(j.record_violations("j", "s", 2, Some(2)).is_empty());
        assert!(j.record_violations("j", "s", 3, Some(3)).len() == 1); // 3 never ended
        assert_eq!(j.record_violations("j", "s", 2, Some(1)).len(), 1);
        assert_eq!(j.record_violations("j", "s", 2, None).len(), 1);
        assert_eq!(j.record_violations("j", "s", 1, Some(1)).len(), 3);
    }
}
