//! The SDK runtime against a fake server: deadlines, heartbeats, cancel, concurrency, shutdown.

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{lease, wait_until, Beat, Call, Fake};
use overseer_agent::{StepContext, StepError, Worker};
use overseer_core::Span;
use serde_json::{json, Value};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const BOUND: Duration = Duration::from_secs(10);

struct Running {
    shutdown: CancellationToken,
    abandon: CancellationToken,
    handle: JoinHandle<()>,
}

fn start(worker: Worker) -> Running {
    let shutdown = CancellationToken::new();
    let abandon = CancellationToken::new();
    let handle = tokio::spawn(worker.run_until_abandon(shutdown.clone(), abandon.clone()));
    Running {
        shutdown,
        abandon,
        handle,
    }
}

impl Running {
    async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(BOUND, self.handle)
            .await
            .expect("the worker stops")
            .unwrap();
    }
}

/// Flags what became of a handler: it finished on its own, or it was dropped before that.
#[derive(Clone, Default)]
struct Fate {
    started: Arc<AtomicBool>,
    finished: Arc<AtomicBool>,
    dropped: Arc<AtomicBool>,
}

struct DropFlag(Arc<AtomicBool>, Arc<AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        if !self.1.load(Ordering::SeqCst) {
            self.0.store(true, Ordering::SeqCst);
        }
    }
}

impl Fate {
    /// A handler that sleeps `nap` and then answers `{"ok": true}`, recording its fate.
    fn sleeper(
        &self,
        nap: Duration,
    ) -> impl Fn(StepContext) -> futures::future::BoxFuture<'static, Result<Value, StepError>>
           + Send
           + Sync
           + 'static {
        let fate = self.clone();
        move |_ctx: StepContext| {
            let fate = fate.clone();
            Box::pin(async move {
                fate.started.store(true, Ordering::SeqCst);
                let _flag = DropFlag(fate.dropped.clone(), fate.finished.clone());
                tokio::time::sleep(nap).await;
                fate.finished.store(true, Ordering::SeqCst);
                Ok(json!({"ok": true}))
            })
        }
    }

    fn dropped(&self) -> bool {
        self.dropped.load(Ordering::SeqCst)
    }
}

fn builder(fake: &Fake) -> overseer_agent::worker::Builder {
    Worker::builder(fake.client())
        .worker_id("test-worker")
        .wait(Span::from_secs(2))
}

// Proves that when the lease cannot be renewed (server unavailable) the handler is dropped at
// the local deadline and neither complete nor fail is ever sent, even after the handler would
// have finished.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_reports_after_the_deadline() {
    let fake = Fake::start().await;
    fake.set_beat(Beat::Unavailable);
    fake.push(lease("slow", 400, 3_000));
    let fate = Fate::default();
    let began = Instant::now();
    let running = start(
        builder(&fake)
            .handler("work", fate.sleeper(Duration::from_secs(3)))
            .build()
            .unwrap(),
    );
    assert!(
        wait_until(BOUND, || fate.dropped()).await,
        "the handler is dropped at the deadline"
    );
    assert!(!fate.finished.load(Ordering::SeqCst));
    // Wait past the moment the handler would have finished and reported.
    let settle = began + Duration::from_millis(3_500);
    tokio::time::sleep_until(settle).await;
    assert!(
        fake.reports().is_empty(),
        "reported after the deadline: {:?}",
        fake.reports()
    );
    running.stop().await;
    assert!(fake.reports().is_empty());
}

// Proves heartbeats go out about every third of the step's timeout (not faster, not much
// slower), carry the handler's progress once (the next heartbeat only), and the result is
// completed once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_every_third_of_the_timeout() {
    let fake = Arc::new(Fake::start().await);
    let l = lease("beating", 900, 900);
    let id = l.lease_id;
    fake.push(l);
    let started_at: Arc<std::sync::Mutex<Option<Instant>>> = Arc::default();
    let handler = {
        let (fake, started_at) = (fake.clone(), started_at.clone());
        move |ctx: StepContext| {
            let (fake, started_at) = (fake.clone(), started_at.clone());
            async move {
                *started_at.lock().unwrap() = Some(Instant::now());
                ctx.set_progress(json!({"pct": 50}));
                let beaten = wait_until(BOUND, || fake.heartbeats(id).len() >= 4).await;
                Ok(json!({"beats_seen": beaten}))
            }
        }
    };
    let running = start(builder(&fake).handler("work", handler).build().unwrap());
    assert!(wait_until(BOUND, || fake.reports().len() == 1).await);
    running.stop().await;

    let beats = fake.heartbeats(id);
    let start = started_at.lock().unwrap().expect("the handler ran");
    let mut last = start;
    for at in &beats[..4] {
        let gap = at.duration_since(last);
        assert!(
            gap >= Duration::from_millis(250),
            "heartbeat too soon: {gap:?} ({beats:?})"
        );
        assert!(
            gap <= Duration::from_secs(3),
            "heartbeat far too late: {gap:?}"
        );
        last = *at;
    }
    let progress: Vec<Value> = fake
        .calls()
        .into_iter()
        .filter_map(|c| match c {
            Call::Heartbeat { progress, .. } => progress,
            _ => None,
        })
        .collect();
    assert_eq!(
        progress,
        [json!({"pct": 50})],
        "progress goes with one heartbeat"
    );
    match &fake.reports()[..] {
        [Call::Complete { result, .. }] => assert_eq!(result, &Some(json!({"beats_seen": true}))),
        other => panic!("expected one complete, got {other:?}"),
    }
}

// Proves a 409 on a heartbeat drops the handler and nothing is reported afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeat_conflict_stops_the_handler() {
    let fake = Fake::start().await;
    fake.set_beat(Beat::Conflict);
    fake.push(lease("lost", 900, 900));
    let fate = Fate::default();
    let running = start(
        builder(&fake)
            .handler("work", fate.sleeper(Duration::from_secs(30)))
            .build()
            .unwrap(),
    );
    assert!(
        wait_until(BOUND, || fate.dropped()).await,
        "the handler is dropped on 409"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(fake.reports().is_empty(), "{:?}", fake.reports());
    running.stop().await;
    assert!(fake.reports().is_empty());
}

// Proves `cancel: true` on a heartbeat drops a handler that ignores it and reports a fatal
// (non-retryable) fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_drops_the_handler_and_fails_fatally() {
    let fake = Fake::start().await;
    fake.set_beat(Beat::Cancel);
    fake.push(lease("doomed", 600, 600));
    let fate = Fate::default();
    let running = start(
        builder(&fake)
            .handler("work", fate.sleeper(Duration::from_secs(30)))
            .build()
            .unwrap(),
    );
    assert!(wait_until(BOUND, || !fake.reports().is_empty()).await);
    assert!(fate.dropped());
    match &fake.reports()[..] {
        [Call::Fail {
            error, retryable, ..
        }] => {
            assert_eq!(error, "cancelled");
            assert!(!retryable);
        }
        other => panic!("expected one fail, got {other:?}"),
    }
    running.stop().await;
}

// Proves a handler watching `cancelled()` may wind down within the cancel grace, and its
// error is still reported as a fatal "cancelled" fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_grace_lets_the_handler_wind_down() {
    let fake = Fake::start().await;
    fake.set_beat(Beat::Cancel);
    fake.push(lease("polite", 600, 600));
    let handler = |ctx: StepContext| async move {
        ctx.cancelled().await;
        Err(StepError::retryable("rolled back"))
    };
    let worker = builder(&fake)
        .handler("work", handler)
        .cancel_grace(Duration::from_secs(5))
        .build()
        .unwrap();
    let running = start(worker);
    assert!(wait_until(BOUND, || !fake.reports().is_empty()).await);
    match &fake.reports()[..] {
        [Call::Fail {
            error, retryable, ..
        }] => {
            assert_eq!(error, "cancelled: rolled back");
            assert!(!retryable);
        }
        other => panic!("expected one fail, got {other:?}"),
    }
    running.stop().await;
}

// Proves a lease request never asks for more leases than there are free slots: at every
// request the server sees, unreported leases plus `max` stay within the concurrency (running)
// and `REPORTS_PER_SLOT` per slot (reports waiting), and no more than `concurrency` handlers
// ever run at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_limit_is_respected() {
    let fake = Fake::start().await;
    for i in 0..7 {
        fake.push(lease(&format!("s{i}"), 5_000, 5_000));
    }
    let now_running = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let handler = {
        let (now_running, most) = (now_running.clone(), most.clone());
        move |_ctx: StepContext| {
            let (now_running, most) = (now_running.clone(), most.clone());
            async move {
                let n = now_running.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(n, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(150)).await;
                now_running.fetch_sub(1, Ordering::SeqCst);
                Ok(Value::Null)
            }
        }
    };
    let running = start(
        builder(&fake)
            .handler("work", handler)
            .concurrency(2)
            .build()
            .unwrap(),
    );
    assert!(
        wait_until(BOUND, || fake.reports().len() == 7).await,
        "all seven complete"
    );
    running.stop().await;
    assert!(
        most.load(Ordering::SeqCst) <= 2,
        "ran {} at once",
        most.load(Ordering::SeqCst)
    );
    let requests: Vec<(usize, usize)> = fake
        .calls()
        .into_iter()
        .filter_map(|c| match c {
            Call::Leases {
                max, outstanding, ..
            } => Some((max, outstanding)),
            _ => None,
        })
        .collect();
    assert_eq!(requests[0], (2, 0), "the first request asks for every slot");
    // Unreported leases are the running ones (at most two) and the reports not yet answered
    // (at most `REPORTS_PER_SLOT` per slot; a slot is free once its handler returns, see the
    // test below).
    let unreported_max = 2 * (1 + overseer_agent::worker::REPORTS_PER_SLOT);
    for (max, outstanding) in &requests {
        assert!(
            max + outstanding <= unreported_max,
            "asked for {max} with {outstanding} unreported: {requests:?}"
        );
    }
    assert!(fake
        .reports()
        .iter()
        .all(|c| matches!(c, Call::Complete { .. })));
}

// Proves an attempt's slot is free again once its handler returns, not once its report is
// answered, and that reports waiting for answers are bounded: with one slot and reports that
// take 800 ms to answer, the next leases start without waiting for the first report until
// `REPORTS_PER_SLOT` reports wait; the lease after them waits for the first answer (the report
// after the bound waits for a reporting permit, holding the only slot).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_is_free_while_its_report_waits_and_waiting_reports_are_bounded() {
    const DELAY: Duration = Duration::from_millis(800);
    let bound = overseer_agent::worker::REPORTS_PER_SLOT;
    let leases = bound + 2;
    let fake = Fake::start().await;
    fake.with(|inner| inner.report_delay = DELAY);
    for i in 0..leases {
        fake.push(lease(&format!("s{i}"), 10_000, 10_000));
    }
    let starts = Arc::new(std::sync::Mutex::new(Vec::new()));
    let handler = {
        let starts = starts.clone();
        move |_ctx: StepContext| {
            starts.lock().unwrap().push(Instant::now());
            async move { Ok(Value::Null) }
        }
    };
    let running = start(
        builder(&fake)
            .handler("work", handler)
            .concurrency(1)
            .build()
            .unwrap(),
    );
    assert!(
        wait_until(BOUND, || fake.reports().len() == leases).await,
        "every lease completes"
    );
    running.stop().await;
    let starts = starts.lock().unwrap().clone();
    assert_eq!(starts.len(), leases);
    assert!(
        starts[bound] - starts[0] < DELAY / 2,
        "lease {bound} waited for the first report: {:?}",
        starts[bound] - starts[0]
    );
    assert!(
        starts[bound + 1] - starts[0] >= DELAY,
        "lease {} started with {} reports unanswered: {:?}",
        bound + 1,
        bound + 1,
        starts[bound + 1] - starts[0]
    );
}

// Proves graceful shutdown stops taking leases at once but lets the running handler finish
// and report before `run` returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_lets_running_work_finish() {
    let fake = Fake::start().await;
    fake.push(lease("draining", 5_000, 5_000));
    let gate = Arc::new(tokio::sync::Notify::new());
    let entered = Arc::new(AtomicBool::new(false));
    let handler = {
        let (gate, entered) = (gate.clone(), entered.clone());
        move |_ctx: StepContext| {
            let (gate, entered) = (gate.clone(), entered.clone());
            async move {
                let opened = gate.notified();
                entered.store(true, Ordering::SeqCst);
                opened.await;
                Ok(json!("done"))
            }
        }
    };
    let running = start(
        builder(&fake)
            .handler("work", handler)
            .concurrency(2)
            .build()
            .unwrap(),
    );
    assert!(wait_until(BOUND, || entered.load(Ordering::SeqCst)).await);
    running.shutdown.cancel();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let polls = |fake: &Fake| {
        fake.calls()
            .iter()
            .filter(|c| matches!(c, Call::Leases { .. }))
            .count()
    };
    let polls_at_shutdown = polls(&fake);
    assert!(
        !running.handle.is_finished(),
        "run waits for the running handler"
    );
    assert!(fake.reports().is_empty());
    gate.notify_one();
    tokio::time::timeout(BOUND, running.handle)
        .await
        .expect("run returns")
        .unwrap();
    match &fake.reports()[..] {
        [Call::Complete { result, .. }] => assert_eq!(result, &Some(json!("done"))),
        other => panic!("expected one complete, got {other:?}"),
    }
    assert_eq!(
        polls(&fake),
        polls_at_shutdown,
        "no lease request after shutdown"
    );
}

// Proves `abandon` drops running handlers at once and reports nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandon_drops_work_without_reporting() {
    let fake = Fake::start().await;
    fake.push(lease("abandoned", 5_000, 5_000));
    let fate = Fate::default();
    let running = start(
        builder(&fake)
            .handler("work", fate.sleeper(Duration::from_secs(30)))
            .build()
            .unwrap(),
    );
    assert!(wait_until(BOUND, || fate.started.load(Ordering::SeqCst)).await);
    running.shutdown.cancel();
    running.abandon.cancel();
    tokio::time::timeout(BOUND, running.handle)
        .await
        .expect("run returns")
        .unwrap();
    assert!(fate.dropped());
    assert!(fake.reports().is_empty(), "{:?}", fake.reports());
}

// Proves a lease that arrives late in a long-poll (its lease_ms mostly spent, counted from the
// send) is confirmed by a heartbeat before the handler starts, then runs normally.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_lease_is_confirmed_first() {
    let fake = Arc::new(Fake::start().await);
    let l = lease("late", 400, 3_000);
    let id = l.lease_id;
    let beats_before_start = Arc::new(AtomicUsize::new(usize::MAX));
    let handler = {
        let (fake, seen) = (fake.clone(), beats_before_start.clone());
        move |_ctx: StepContext| {
            let (fake, seen) = (fake.clone(), seen.clone());
            async move {
                seen.store(fake.heartbeats(id).len(), Ordering::SeqCst);
                Ok(json!(1))
            }
        }
    };
    let running = start(builder(&fake).handler("work", handler).build().unwrap());
    // Let the poll be waiting well past the lease's 400ms before the lease shows up.
    assert!(wait_until(BOUND, || !fake.calls().is_empty()).await);
    tokio::time::sleep(Duration::from_millis(700)).await;
    fake.push(l);
    assert!(wait_until(BOUND, || !fake.reports().is_empty()).await);
    running.stop().await;
    assert_eq!(
        beats_before_start.load(Ordering::SeqCst),
        1,
        "one confirming heartbeat first"
    );
    assert!(matches!(&fake.reports()[..], [Call::Complete { .. }]));
}

// Proves a panicking handler is reported as a retryable failure instead of being lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn panics_become_retryable_failures() {
    let fake = Fake::start().await;
    fake.push(lease("boom", 5_000, 5_000));
    let handler = |ctx: StepContext| async move {
        if ctx.attempt() > 0 {
            panic!("kaboom");
        }
        Ok(Value::Null)
    };
    let running = start(builder(&fake).handler("work", handler).build().unwrap());
    assert!(wait_until(BOUND, || !fake.reports().is_empty()).await);
    running.stop().await;
    match &fake.reports()[..] {
        [Call::Fail {
            error, retryable, ..
        }] => {
            assert!(error.contains("kaboom"), "{error}");
            assert!(retryable);
        }
        other => panic!("expected one fail, got {other:?}"),
    }
}

// Proves a 409 answer to a report is accepted as final: the report is not sent again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn report_conflict_is_not_retried() {
    let fake = Fake::start().await;
    fake.with(|i| i.reports_conflict = true);
    fake.push(lease("raced", 5_000, 5_000));
    let running = start(
        builder(&fake)
            .handler("work", |_ctx: StepContext| async { Ok(json!(7)) })
            .build()
            .unwrap(),
    );
    assert!(wait_until(BOUND, || !fake.reports().is_empty()).await);
    tokio::time::sleep(Duration::from_millis(500)).await;
    running.stop().await;
    assert_eq!(fake.reports().len(), 1, "{:?}", fake.reports());
}

// Proves the builder refuses what cannot run.
#[tokio::test]
async fn builder_validates() {
    let fake = Fake::start().await;
    let ok = |_ctx: StepContext| async { Ok(Value::Null) };
    assert!(matches!(
        builder(&fake).build(),
        Err(overseer_agent::worker::Error::NoHandlers)
    ));
    assert!(builder(&fake)
        .handler("a", ok)
        .concurrency(0)
        .build()
        .is_err());
    assert!(builder(&fake)
        .handler("a", ok)
        .handler("a", ok)
        .build()
        .is_err());
    assert!(builder(&fake).handler("", ok).build().is_err());
    assert!(builder(&fake)
        .handler("a", ok)
        .worker_id("")
        .build()
        .is_err());
    let w = Worker::builder(fake.client())
        .handler("a", ok)
        .build()
        .unwrap();
    assert!(!w.worker_id().is_empty());
}
