//! End-to-end tests: a real node (SQLite store, HTTP API, supervisor) with the Faktory listener
//! on another ephemeral port, driven by the published `faktory` client crate (and, where exact
//! timing or raw bytes matter, by a few raw protocol lines).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use faktory::{Client, Job, JobId, Worker, WorkerId};
use overseer_core::backoff::Backoff;
use overseer_core::{Span, Timestamp};
use overseer_faktory::{Faktory, WorkerState};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

struct Node {
    http: String,
    faktory: String,
    fk: Faktory,
    shutdown: CancellationToken,
    served: Option<tokio::task::JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl Node {
    async fn start(settings: overseer_faktory::Config) -> Node {
        let dir = tempfile::tempdir().unwrap();
        let config = overseer_server::Config {
            db: format!("sqlite://{}", dir.path().join("t.db").display()),
            sweep_interval: Span::from_millis(100),
            ..overseer_server::Config::default()
        };
        let store = overseer_server::open_store(&config).await.unwrap();
        let http = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let fl = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (http_addr, fk_addr) = (http.local_addr().unwrap(), fl.local_addr().unwrap());
        let shutdown = CancellationToken::new();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let token = shutdown.clone();
        let served = tokio::spawn(async move {
            overseer_server::serve_with(store, &config, http, token, move |app| {
                let fk = Faktory::new(app, settings);
                let _ = tx.send(fk.clone());
                fk.start(fl)
            })
            .await
            .unwrap();
        });
        Node {
            http: format!("http://{http_addr}"),
            faktory: format!("tcp://{fk_addr}"),
            fk: rx.await.unwrap(),
            shutdown,
            served: Some(served),
            _dir: dir,
        }
    }

    async fn client(&self) -> Client {
        Client::connect_to(&self.faktory).await.unwrap()
    }

    async fn job_by_jid(&self, jid: &str) -> Value {
        let url = format!("{}/v1/jobs?label=faktory_jid:{jid}", self.http);
        let body: Value = reqwest::get(url).await.unwrap().json().await.unwrap();
        body["jobs"][0].clone()
    }

    async fn stop(mut self) {
        self.shutdown.cancel();
        if let Some(s) = self.served.take() {
            s.await.unwrap();
        }
    }
}

/// Fast settings for tests: short reservations allowed, quick retries.
fn fast() -> overseer_faktory::Config {
    overseer_faktory::Config {
        reserve_min: Span::from_secs(1),
        backoff: Some(Backoff {
            initial: Span::from_millis(50),
            factor: 1.0,
            max: Span::from_millis(50),
        }),
        sweep_interval: Duration::from_millis(100),
        ..overseer_faktory::Config::default()
    }
}

/// `fast()` but with retries 10 minutes away, so a failed job stays in the retry set.
fn slow_retries() -> overseer_faktory::Config {
    overseer_faktory::Config {
        backoff: Some(Backoff {
            initial: Span::from_secs(600),
            factor: 1.0,
            max: Span::from_secs(600),
        }),
        ..fast()
    }
}

/// Polls `check` until it holds or `within` passes (a condition wait, not a fixed sleep).
async fn wait_for<F, Fut>(within: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if check().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

/// A bare protocol connection, for checks the client crate cannot express.
struct Raw {
    r: BufReader<tokio::net::tcp::OwnedReadHalf>,
    w: tokio::net::tcp::OwnedWriteHalf,
}

#[derive(Debug, PartialEq)]
enum Answer {
    Simple(String),
    Error(String),
    Bulk(Option<String>),
}

impl Raw {
    async fn connect(url: &str, wid: Option<&str>) -> Raw {
        let addr = url.trim_start_matches("tcp://");
        let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (r, w) = stream.into_split();
        let mut raw = Raw {
            r: BufReader::new(r),
            w,
        };
        let hi = raw.read().await;
        assert_eq!(hi, Answer::Simple(r#"HI {"v":2}"#.into()));
        let hello = match wid {
            Some(wid) => json!({"wid": wid, "hostname": "test", "pid": 1, "v": 2}),
            None => json!({"v": 2}),
        };
        assert_eq!(
            raw.cmd(&format!("HELLO {hello}")).await,
            Answer::Simple("OK".into())
        );
        raw
    }

    async fn cmd(&mut self, line: &str) -> Answer {
        self.w
            .write_all(format!("{line}\r\n").as_bytes())
            .await
            .unwrap();
        self.read().await
    }

    async fn read(&mut self) -> Answer {
        let mut line = String::new();
        self.r.read_line(&mut line).await.unwrap();
        let line = line.trim_end_matches("\r\n").to_string();
        match line.split_at(1) {
            ("+", rest) => Answer::Simple(rest.into()),
            ("-", rest) => Answer::Error(rest.into()),
            ("$", "-1") => Answer::Bulk(None),
            ("$", n) => {
                let mut buf = vec![0; n.parse::<usize>().unwrap() + 2];
                self.r.read_exact(&mut buf).await.unwrap();
                buf.truncate(buf.len() - 2);
                Answer::Bulk(Some(String::from_utf8(buf).unwrap()))
            }
            other => panic!("unexpected answer {other:?}"),
        }
    }
}

fn bulk_json(a: Answer) -> Value {
    match a {
        Answer::Bulk(Some(s)) => serde_json::from_str(&s).unwrap(),
        other => panic!("expected a JSON bulk answer, got {other:?}"),
    }
}

// Proves a pushed job reaches a worker with custom and unknown fields intact, ACK finishes the
// Overseer job, and INFO parses in the client crate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn push_fetch_ack_round_trip() {
    let node = Node::start(fast()).await;
    let mut client = node.client().await;
    let job = Job::builder("resize")
        .args(vec![json!("photo.png"), json!(640)])
        .queue("images")
        .add_to_custom_data("trace", json!({"id": "t-1", "tags": ["a", "b"], "n": 1.5}))
        .build();
    let jid = job.id().to_string();
    client.enqueue(job).await.unwrap();
    let info = client.current_info().await.unwrap();
    assert_eq!(info.data.queues.get("images"), Some(&1));

    let seen: Arc<Mutex<Option<Job>>> = Arc::default();
    let keep = seen.clone();
    let mut worker = Worker::builder::<std::io::Error>()
        .register_fn("resize", move |job: Job| {
            let keep = keep.clone();
            async move {
                *keep.lock().unwrap() = Some(job);
                Ok(())
            }
        })
        .connect_to(&node.faktory)
        .await
        .unwrap();
    assert!(worker.run_one(0, &["images"]).await.unwrap());
    let got = seen.lock().unwrap().take().unwrap();
    assert_eq!(got.id().to_string(), jid);
    assert_eq!(got.args(), &[json!("photo.png"), json!(640)]);
    assert_eq!(
        got.custom["trace"],
        json!({"id": "t-1", "tags": ["a", "b"], "n": 1.5})
    );
    let overseer_job = node.job_by_jid(&jid).await;
    assert_eq!(overseer_job["state"], "succeeded");
    assert_eq!(overseer_job["steps"][0]["agent"], "images");
    assert_eq!(overseer_job["steps"][0]["name"], "resize");

    // Unknown top-level fields round-trip too (the client crate would drop them: use raw lines).
    let mut raw = Raw::connect(&node.faktory, Some("raw-worker-1")).await;
    let pushed = json!({"jid": "raw-jid-0001", "jobtype": "x", "args": [{"deep": [1, null]}],
        "queue": "rawq", "custom": {"k": "v"}, "x_unknown": {"a": [true, "s"]}});
    assert_eq!(
        raw.cmd(&format!("PUSH {pushed}")).await,
        Answer::Simple("OK".into())
    );
    // The same jid again with the same body is accepted once.
    assert_eq!(
        raw.cmd(&format!("PUSH {pushed}")).await,
        Answer::Simple("OK".into())
    );
    let fetched = bulk_json(raw.cmd("FETCH rawq").await);
    for key in ["jid", "jobtype", "args", "queue", "custom", "x_unknown"] {
        assert_eq!(fetched[key], pushed[key], "{key}");
    }
    assert!(fetched["enqueued_at"].is_string());
    assert_eq!(
        raw.cmd(r#"ACK {"jid":"raw-jid-0001"}"#).await,
        Answer::Simple("OK".into())
    );
    assert_eq!(
        raw.cmd("FETCH rawq").await,
        Answer::Bulk(None),
        "pushed twice, stored once"
    );
    drop(raw);
    drop(worker);
    drop(client);
    node.stop().await;
}

// Proves PUSHB stores the valid jobs and answers Faktory's error for the invalid one, by jid;
// and that validation, enterprise-only and unknown commands answer Faktory's exact messages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_push_reports_invalid_jobs() {
    let node = Node::start(fast()).await;
    let mut client = node.client().await;
    let good = Job::builder("ok").args(vec![1]).queue("bulk").build();
    let bad = Job::builder("ok")
        .jid(JobId::new("short"))
        .args(vec![2])
        .queue("bulk")
        .build();
    let (count, errors) = client.enqueue_many(vec![good.clone(), bad]).await.unwrap();
    assert_eq!(count, 1);
    let errors = errors.unwrap();
    assert_eq!(
        errors.get("short").map(String::as_str),
        Some("jobs must have a reasonable jid parameter")
    );
    assert_eq!(node.job_by_jid(good.id()).await["state"], "running");

    let mut raw = Raw::connect(&node.faktory, None).await;
    let cases = [
        (r#"PUSH {"jid":"0123456789","args":[]}"#, "ERR jobs must have a jobtype parameter"),
        (r#"PUSH {"jid":"0123456789","jobtype":"t"}"#, "ERR jobs must have an args parameter"),
        (
            r#"PUSH {"jid":"0123456789","jobtype":"t","args":[],"reserve_for":90000}"#,
            "ERR jobs cannot be reserved for more than one day",
        ),
        ("BATCH NEW {}", "ERR batch subsystem is only available in Faktory Enterprise"),
        ("TRACK GET x", "ERR tracking subsystem is only available in Faktory Enterprise"),
        ("BOGUS", "ERR unknown command BOGUS"),
        ("ACK nope", "ERR invalid ACK nope"),
        ("FLUSH", "ERR FLUSH is disabled on this server (start it with --faktory-allow-flush, for development only)"),
    ];
    for (line, answer) in cases {
        assert_eq!(raw.cmd(line).await, Answer::Error(answer.into()), "{line}");
    }
    drop(raw);
    drop(client);
    node.stop().await;
}

// Proves jobs of one queue are fetched in the order they were pushed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifo_within_a_queue() {
    let node = Node::start(fast()).await;
    let mut client = node.client().await;
    for i in 0..6 {
        client
            .enqueue(Job::builder("n").args(vec![i]).queue("fifo").build())
            .await
            .unwrap();
    }
    let order: Arc<Mutex<Vec<i64>>> = Arc::default();
    let keep = order.clone();
    let mut worker = Worker::builder::<std::io::Error>()
        .register_fn("n", move |job: Job| {
            let keep = keep.clone();
            async move {
                keep.lock().unwrap().push(job.args()[0].as_i64().unwrap());
                Ok(())
            }
        })
        .connect_to(&node.faktory)
        .await
        .unwrap();
    for _ in 0..6 {
        assert!(worker.run_one(0, &["fifo"]).await.unwrap());
    }
    assert_eq!(*order.lock().unwrap(), vec![0, 1, 2, 3, 4, 5]);
    drop(worker);
    drop(client);
    node.stop().await;
}

// Proves QUEUE PAUSE stops FETCH from handing out a queue's jobs and QUEUE RESUME lets it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_pause_and_resume() {
    let node = Node::start(fast()).await;
    let mut client = node.client().await;
    client.queue_pause(&["pq"]).await.unwrap();
    client
        .enqueue(Job::builder("p").args(vec![1]).queue("pq").build())
        .await
        .unwrap();
    let mut worker = Worker::builder::<std::io::Error>()
        .register_fn("p", |_job: Job| async { Ok(()) })
        .connect_to(&node.faktory)
        .await
        .unwrap();
    assert!(
        !worker.run_one(0, &["pq"]).await.unwrap(),
        "paused: nothing fetched"
    );
    client.queue_resume(&["pq"]).await.unwrap();
    assert!(
        worker.run_one(0, &["pq"]).await.unwrap(),
        "resumed: fetched"
    );
    drop(worker);
    drop(client);
    node.stop().await;
}

// Proves a FAILed job is retried with Faktory's failure block (message, errtype, counts), and
// that retry 0 means one attempt, after which the Overseer job is failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_job_is_retried_with_failure_info() {
    let node = Node::start(fast()).await;
    let mut client = node.client().await;
    let flaky = Job::builder("flaky")
        .args(vec!["x"])
        .queue("retry")
        .retry(2)
        .build();
    let once = Job::builder("once")
        .args(vec!["y"])
        .queue("retry")
        .retry(0)
        .build();
    let (flaky_jid, once_jid) = (flaky.id().to_string(), once.id().to_string());
    client.enqueue(flaky).await.unwrap();
    client.enqueue(once).await.unwrap();

    let seen: Arc<Mutex<Vec<Job>>> = Arc::default();
    let keep = seen.clone();
    let mut worker = Worker::builder::<std::io::Error>()
        .register_fn("flaky", move |job: Job| {
            let keep = keep.clone();
            async move {
                let first = job.failure().is_none();
                keep.lock().unwrap().push(job);
                if first {
                    Err(std::io::Error::other("disk on fire"))
                } else {
                    Ok(())
                }
            }
        })
        .register_fn("once", |_job: Job| async {
            Err(std::io::Error::other("nope"))
        })
        .connect_to(&node.faktory)
        .await
        .unwrap();
    // flaky fails, once fails (for good), then flaky's retry comes back after its backoff.
    let mut runs = 0;
    while seen.lock().unwrap().len() < 2 && runs < 20 {
        worker.run_one(0, &["retry"]).await.unwrap();
        runs += 1;
    }
    let jobs = seen.lock().unwrap().clone();
    assert_eq!(jobs.len(), 2, "flaky ran twice");
    let failure = jobs[1].failure().expect("the retry carries its failure");
    assert_eq!(failure.message.as_deref(), Some("disk on fire"));
    assert_eq!(failure.retry_count, 0);
    assert_eq!(failure.retry_remaining, 2);
    assert_eq!(node.job_by_jid(&flaky_jid).await["state"], "succeeded");
    let once_job = node.job_by_jid(&once_jid).await;
    assert_eq!(once_job["state"], "failed");
    assert_eq!(once_job["steps"][0]["attempt"], 1);
    assert_eq!(once_job["steps"][0]["last_error"], "unknown: nope");
    drop(worker);
    drop(client);
    node.stop().await;
}

// Proves a FAILed job pushed over Faktory waits Faktory's own retry delay, with the server's
// default settings: its first failure (count 0) schedules the next attempt `0⁴ + 15 + rand(30) ×
// 1` whole seconds after the FAIL, as the job's `next_attempt_at` and its `step_retry_scheduled`
// event (read over HTTP) both say, and the retry is not handed out meanwhile. Later counts are
// timed exactly by the core's and the store conformance tests (16 s and more is too long here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_job_waits_faktory_retry_delay() {
    let node = Node::start(overseer_faktory::Config {
        reserve_min: Span::from_secs(1),
        sweep_interval: Duration::from_millis(100),
        ..overseer_faktory::Config::default()
    })
    .await;
    assert_eq!(
        node.fk.config().backoff,
        None,
        "Faktory's formula is the default"
    );
    let mut raw = Raw::connect(&node.faktory, Some("formula-worker-000000000000000001")).await;
    let job =
        json!({"jid": "formula-jid-01", "jobtype": "f", "args": [], "queue": "fq", "retry": 3});
    push_raw(&mut raw, job).await;
    bulk_json(raw.cmd("FETCH fq").await);
    let wall = || {
        let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
        Timestamp::from_millis(since.unwrap().as_millis() as i64)
    };
    let before = wall();
    let fail = r#"FAIL {"jid":"formula-jid-01","errtype":"E","message":"m"}"#;
    assert_eq!(raw.cmd(fail).await, Answer::Simple("OK".into()));
    let after = wall();

    let view = node.job_by_jid("formula-jid-01").await;
    let step = &view["steps"][0];
    assert_eq!(
        (&view["state"], &step["state"], &step["failures"]),
        (&json!("running"), &json!("ready"), &json!(1))
    );
    let next: Timestamp = serde_json::from_value(step["next_attempt_at"].clone()).unwrap();
    let url = format!(
        "{}/v1/jobs/{}/events",
        node.http,
        view["id"].as_str().unwrap()
    );
    let events: Value = reqwest::get(url).await.unwrap().json().await.unwrap();
    let retry = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["kind"] == "step_retry_scheduled")
        .expect("a retry was scheduled");
    let failed_at: Timestamp = serde_json::from_value(retry["at"].clone()).unwrap();
    let delay: Span = serde_json::from_value(retry["detail"]["delay"].clone()).unwrap();
    assert!(
        before <= failed_at && failed_at <= after,
        "{failed_at:?} not in {before:?}..={after:?}"
    );
    assert_eq!(retry["detail"]["next_attempt_at"], step["next_attempt_at"]);
    assert_eq!(next, failed_at.plus(delay));
    // count 0: 15 + rand(30) × 1 s, whole seconds.
    let secs = delay.as_millis() / 1000;
    assert_eq!(delay.as_millis() % 1000, 0, "{delay}");
    assert!((15..=44).contains(&secs), "{delay} is not 15–44 s");

    // Waiting out the delay: a FETCH (2 s wait) hands nothing out.
    assert_eq!(raw.cmd("FETCH fq").await, Answer::Bulk(None));
    drop(raw);
    node.stop().await;
}

// Proves BEAT answers quiet (the worker stops fetching) and then terminate (the worker stops).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beat_quiet_then_terminate() {
    let node = Node::start(fast()).await;
    let wid = "beat-worker-000000000000000000001";
    let mut worker = Worker::builder::<std::io::Error>()
        .wid(WorkerId::new(wid))
        .register_fn("b", |_job: Job| async { Ok(()) })
        .connect_to(&node.faktory)
        .await
        .unwrap();
    let running = tokio::spawn(async move { worker.run(&["bq"]).await });
    let fk = node.fk.clone();
    assert!(
        wait_for(Duration::from_secs(5), || async {
            fk.signal(wid, WorkerState::Quiet)
        })
        .await
    );
    // The worker hears "quiet" on its next BEAT (every 5 s in this client).
    let beats = |n: u64| {
        let fk = node.fk.clone();
        move || {
            let fk = fk.clone();
            async move { fk.workers().iter().any(|w| w.wid == wid && w.beats >= n) }
        }
    };
    assert!(wait_for(Duration::from_secs(12), beats(1)).await);
    // Any FETCH started before "quiet" has ended by now; new work must stay put.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let mut client = node.client().await;
    let job = Job::builder("b").args(vec![1]).queue("bq").build();
    let jid = job.id().to_string();
    client.enqueue(job).await.unwrap();
    assert!(node.fk.signal(wid, WorkerState::Terminate));
    let stopped = tokio::time::timeout(Duration::from_secs(15), running)
        .await
        .expect("terminate stops the worker")
        .unwrap()
        .unwrap();
    assert_eq!(stopped.reason, faktory::StopReason::ServerInstruction);
    let job = node.job_by_jid(&jid).await;
    assert_eq!(
        job["steps"][0]["attempt"], 0,
        "a quiet worker fetched nothing"
    );
    drop(client);
    node.stop().await;
}

// Proves a late ACK, from a worker whose reservation expired and was re-leased to another
// worker, changes nothing: the second worker's result stands. Also that a producer connection
// cannot ACK or FAIL a job a worker holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_ack_after_reservation_expired_is_ignored() {
    let node = Node::start(fast()).await;
    let mut client = node.client().await;
    let job = Job::builder("slow")
        .args(vec![1])
        .queue("late")
        .reserve_for(Duration::from_secs(1))
        .build();
    let jid = job.id().to_string();
    client.enqueue(job).await.unwrap();

    // Worker A takes the job and sits on it past its reservation.
    let (a_started, a_started_rx) = tokio::sync::oneshot::channel::<()>();
    let a_started = Arc::new(Mutex::new(Some(a_started)));
    let (a_go, a_go_rx) = tokio::sync::oneshot::channel::<()>();
    let a_go_rx = Arc::new(tokio::sync::Mutex::new(Some(a_go_rx)));
    let mut a = Worker::builder::<std::io::Error>()
        .wid(WorkerId::new("worker-a-00000000000000000000000"))
        .register_fn("slow", move |_job: Job| {
            let started = a_started.clone();
            let go = a_go_rx.clone();
            async move {
                if let Some(s) = started.lock().unwrap().take() {
                    let _ = s.send(());
                }
                if let Some(go) = go.lock().await.take() {
                    let _ = go.await;
                }
                Ok(())
            }
        })
        .connect_to(&node.faktory)
        .await
        .unwrap();
    let a_run = tokio::spawn(async move {
        let r = a.run_one(0, &["late"]).await;
        (a, r)
    });
    a_started_rx.await.unwrap();

    // The reservation expires; the supervisor puts the job back; worker B takes it.
    let (b_started, b_started_rx) = tokio::sync::oneshot::channel::<()>();
    let b_started = Arc::new(Mutex::new(Some(b_started)));
    let (b_go, b_go_rx) = tokio::sync::oneshot::channel::<()>();
    let b_go_rx = Arc::new(tokio::sync::Mutex::new(Some(b_go_rx)));
    let mut b = Worker::builder::<std::io::Error>()
        .wid(WorkerId::new("worker-b-00000000000000000000000"))
        .register_fn("slow", move |_job: Job| {
            let started = b_started.clone();
            let go = b_go_rx.clone();
            async move {
                if let Some(s) = started.lock().unwrap().take() {
                    let _ = s.send(());
                }
                if let Some(go) = go.lock().await.take() {
                    let _ = go.await;
                }
                Ok(())
            }
        })
        .connect_to(&node.faktory)
        .await
        .unwrap();
    let b_run = tokio::spawn(async move {
        loop {
            match b.run_one(0, &["late"]).await {
                Ok(false) => continue,
                r => return (b, r),
            }
        }
    });
    tokio::time::timeout(Duration::from_secs(10), b_started_rx)
        .await
        .expect("the expired job is handed to worker B")
        .unwrap();

    // A finishes late: its ACK is answered OK but changes nothing.
    a_go.send(()).unwrap();
    let (a, a_result) = a_run.await.unwrap();
    a_result.expect("a late ACK is answered +OK, as Faktory does");
    let job = node.job_by_jid(&jid).await;
    assert_eq!(job["state"], "running");
    assert_eq!(job["steps"][0]["state"], "running");
    assert_eq!(job["steps"][0]["attempt"], 2);

    // A producer connection holds nothing: its ACK changes nothing, its FAIL finds no job.
    let mut raw = Raw::connect(&node.faktory, None).await;
    let ack = format!(r#"ACK {{"jid":"{jid}"}}"#);
    assert_eq!(raw.cmd(&ack).await, Answer::Simple("OK".into()));
    let fail = format!(r#"FAIL {{"jid":"{jid}","errtype":"E","message":"m"}}"#);
    assert_eq!(
        raw.cmd(&fail).await,
        Answer::Error(format!("ERR Job not found {jid}"))
    );
    assert_eq!(node.job_by_jid(&jid).await["steps"][0]["state"], "running");

    // B's result stands.
    b_go.send(()).unwrap();
    let (b, b_result) = b_run.await.unwrap();
    b_result.unwrap();
    let job = node.job_by_jid(&jid).await;
    assert_eq!(job["state"], "succeeded");
    assert_eq!(job["steps"][0]["attempt"], 2);
    assert_eq!(
        job["steps"][0]["failures"], 1,
        "only the expiry counted as a failure"
    );
    drop((a, b, raw, client));
    node.stop().await;
}

// Proves a worker that dies mid-job (connection dropped, no more BEATs) has its job handed to
// another worker within the grace period plus one sweep, long before the reservation ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_worker_job_is_fetched_again_after_grace() {
    let grace = Duration::from_secs(1);
    let node = Node::start(overseer_faktory::Config {
        beat_grace: grace,
        ..fast()
    })
    .await;
    let mut client = node.client().await;
    let job = Job::builder("k")
        .args(vec![1])
        .queue("kq")
        .reserve_for(Duration::from_secs(600))
        .build();
    let jid = job.id().to_string();
    client.enqueue(job).await.unwrap();
    let mut doomed = Raw::connect(&node.faktory, Some("doomed-worker-0000000000000000001")).await;
    assert_eq!(
        doomed
            .cmd(r#"BEAT {"wid":"doomed-worker-0000000000000000001"}"#)
            .await,
        Answer::Simple("OK".into())
    );
    let fetched = bulk_json(doomed.cmd("FETCH kq").await);
    assert_eq!(fetched["jid"], jid.as_str());
    let killed_at = Instant::now();
    drop(doomed);

    let mut other = Worker::builder::<std::io::Error>()
        .register_fn("k", |_job: Job| async { Ok(()) })
        .connect_to(&node.faktory)
        .await
        .unwrap();
    while !other.run_one(0, &["kq"]).await.unwrap() {
        assert!(
            killed_at.elapsed() < Duration::from_secs(15),
            "never handed out again"
        );
    }
    let took = killed_at.elapsed();
    // grace + one sweep (100 ms) + backoff (50 ms) + at most one FETCH wait (2 s) of slack.
    assert!(took < grace + Duration::from_millis(2500), "took {took:?}");
    let job = node.job_by_jid(&jid).await;
    assert_eq!(job["state"], "succeeded");
    assert_eq!(
        job["steps"][0]["failures"], 1,
        "released once, as a failed attempt"
    );
    drop(other);
    drop(client);
    node.stop().await;
}

// Proves a Faktory worker can run one step of a 3-step Overseer DAG submitted over HTTP: it gets
// the step's payload as args[0] and its inputs under custom.overseer, and the job completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faktory_worker_runs_one_step_of_an_http_dag() {
    let node = Node::start(fast()).await;
    let http = reqwest::Client::new();
    let spec = json!({"steps": [
        {"name": "fetch", "agent": "http-agent", "payload": {"url": "x"}},
        {"name": "transform", "agent": "fk-queue", "payload": {"mode": "upper"}, "depends_on": ["fetch"]},
        {"name": "store", "agent": "http-agent", "depends_on": ["transform"]},
    ]});
    let job: Value = http
        .post(format!("{}/v1/jobs", node.http))
        .json(&spec)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let job_id = job["id"].as_str().unwrap().to_string();
    let run_http_step = |result: Value| {
        let http = http.clone();
        let base = node.http.clone();
        async move {
            let leases: Value = http
                .post(format!("{base}/v1/agents/http-agent/leases"))
                .json(&json!({"worker": "h", "wait": "5s"}))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            let lease = leases["leases"][0]["lease_id"]
                .as_str()
                .unwrap()
                .to_string();
            let r = http
                .post(format!("{base}/v1/leases/{lease}/complete"))
                .json(&json!({ "result": result }))
                .send()
                .await
                .unwrap();
            assert!(r.status().is_success());
        }
    };
    run_http_step(json!({"body": "hello"})).await;

    let seen: Arc<Mutex<HashMap<String, Value>>> = Arc::default();
    let keep = seen.clone();
    let mut worker = Worker::builder::<std::io::Error>()
        .register_fn("transform", move |job: Job| {
            let keep = keep.clone();
            async move {
                let mut m = keep.lock().unwrap();
                m.insert("jid".into(), json!(job.id().to_string()));
                m.insert("args".into(), json!(job.args()));
                m.insert("overseer".into(), job.custom["overseer"].clone());
                Ok(())
            }
        })
        .connect_to(&node.faktory)
        .await
        .unwrap();
    assert!(worker.run_one(0, &["fk-queue"]).await.unwrap());
    {
        let m = seen.lock().unwrap();
        assert_eq!(m["jid"], format!("{job_id}/transform"));
        assert_eq!(m["args"], json!([{"mode": "upper"}]));
        assert_eq!(m["overseer"]["inputs"], json!({"fetch": {"body": "hello"}}));
        assert_eq!(
            m["overseer"]["idempotency_key"],
            format!("{job_id}/transform")
        );
    }
    run_http_step(json!("stored")).await;
    let job: Value = reqwest::get(format!("{}/v1/jobs/{job_id}", node.http))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(job["state"], "succeeded");
    drop(worker);
    node.stop().await;
}

// Proves a password-protected listener accepts clients that prove the password (the client
// crate's iterated-SHA-256 answer to the salted greeting) and refuses the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn password_is_checked() {
    let node = Node::start(overseer_faktory::Config {
        password: Some("s3cret".into()),
        ..fast()
    })
    .await;
    let addr = node.faktory.trim_start_matches("tcp://").to_string();
    let mut ok = Client::connect_to(&format!("tcp://:s3cret@{addr}"))
        .await
        .unwrap();
    ok.enqueue(Job::builder("p").args(vec![1]).build())
        .await
        .unwrap();
    let wrong = Client::connect_to(&format!("tcp://:nope@{addr}")).await;
    assert!(wrong.is_err(), "a wrong password is refused");
    drop(ok);
    node.stop().await;
}

// Proves MUTATE kill takes a job out of the retry set (cancelled), and that bad operations and
// targets answer Faktory's errors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutate_kill_on_retries() {
    let node = Node::start(slow_retries()).await;
    let mut raw = Raw::connect(&node.faktory, Some("mutator-00000000000000000000001")).await;
    let job = json!({"jid": "mutate-jid-01", "jobtype": "m", "args": [], "queue": "mq"});
    assert_eq!(
        raw.cmd(&format!("PUSH {job}")).await,
        Answer::Simple("OK".into())
    );
    bulk_json(raw.cmd("FETCH mq").await);
    let fail = r#"FAIL {"jid":"mutate-jid-01","errtype":"E","message":"m"}"#;
    assert_eq!(raw.cmd(fail).await, Answer::Simple("OK".into()));
    let bad_cmd = r#"MUTATE {"cmd":"explode","target":"retries"}"#;
    assert_eq!(
        raw.cmd(bad_cmd).await,
        Answer::Error("ERR unknown mutate operation".into())
    );
    let bad = r#"MUTATE {"cmd":"kill","target":"nowhere"}"#;
    assert_eq!(
        raw.cmd(bad).await,
        Answer::Error("ERR invalid target for mutation command".into())
    );
    let kill = r#"MUTATE {"cmd":"kill","target":"retries","filter":{"jids":["mutate-jid-01"]}}"#;
    assert_eq!(raw.cmd(kill).await, Answer::Simple("OK".into()));
    assert_eq!(node.job_by_jid("mutate-jid-01").await["state"], "cancelled");
    drop(raw);
    node.stop().await;
}

/// Pushes a job over a raw connection and expects `+OK`.
async fn push_raw(raw: &mut Raw, job: Value) {
    assert_eq!(
        raw.cmd(&format!("PUSH {job}")).await,
        Answer::Simple("OK".into())
    );
}

/// The size INFO gives a queue (None when INFO does not list it).
async fn queue_size(raw: &mut Raw, queue: &str) -> Option<u64> {
    let info = bulk_json(raw.cmd("INFO").await);
    info["faktory"]["queues"]
        .get(queue)
        .map(|v| v.as_u64().unwrap())
}

/// Fetches from `queue` and FAILs what came with a message and a backtrace; returns the job.
async fn fetch_and_fail(raw: &mut Raw, queue: &str, message: &str) -> Value {
    let job = bulk_json(raw.cmd(&format!("FETCH {queue}")).await);
    let fail = json!({"jid": job["jid"], "errtype": "Boom", "message": message,
        "backtrace": ["at a.rs:1", "at b.rs:2"]});
    assert_eq!(
        raw.cmd(&format!("FAIL {fail}")).await,
        Answer::Simple("OK".into())
    );
    job
}

// Proves the MUTATE sets move jobs as Faktory's do: kill moves scheduled jobs to the dead set,
// requeue brings dead and retrying jobs back to their queue at once (keeping the failure block,
// backtrace included, and the retry count), discard deletes, and filters follow Faktory's
// precedence (pattern with jobtype, else jobtype, else jids).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutate_moves_jobs_between_sets() {
    let node = Node::start(slow_retries()).await;
    let mut raw = Raw::connect(&node.faktory, Some("mutator-00000000000000000000002")).await;
    let soon = "2999-01-01T00:00:00Z";
    for (jid, arg) in [("mset-jid-fizz", "fizz"), ("mset-jid-buzz", "buzz")] {
        let job = json!({"jid": jid, "jobtype": "mset", "args": [arg], "queue": "mq2",
            "at": soon, "retry": 3});
        push_raw(&mut raw, job).await;
    }
    let other = json!({"jid": "mset-jid-other", "jobtype": "other", "args": ["fizz"],
        "queue": "mq2", "at": soon});
    push_raw(&mut raw, other).await;
    assert_eq!(
        queue_size(&mut raw, "mq2").await,
        Some(0),
        "scheduled, not enqueued"
    );

    // kill by jobtype: both mset jobs go to the dead set (cancelled), `other` stays scheduled.
    let kill = r#"MUTATE {"cmd":"kill","target":"scheduled","filter":{"jobtype":"mset"}}"#;
    assert_eq!(raw.cmd(kill).await, Answer::Simple("OK".into()));
    assert_eq!(node.job_by_jid("mset-jid-fizz").await["state"], "cancelled");
    assert_eq!(node.job_by_jid("mset-jid-other").await["state"], "pending");

    // requeue the dead set: both run now.
    let requeue_dead = r#"MUTATE {"cmd":"requeue","target":"dead","filter":{"jobtype":"mset"}}"#;
    assert_eq!(raw.cmd(requeue_dead).await, Answer::Simple("OK".into()));
    assert_eq!(queue_size(&mut raw, "mq2").await, Some(2));
    let fizz = node.job_by_jid("mset-jid-fizz").await;
    assert_eq!(fizz["state"], "running");
    assert_eq!(
        fizz["steps"][0]["max_attempts"], 4,
        "retry 3 → 4 attempts left"
    );

    // Fail both: they wait in the retries set (600 s backoff), not in the queue.
    fetch_and_fail(&mut raw, "mq2", "first").await;
    fetch_and_fail(&mut raw, "mq2", "first").await;
    assert_eq!(queue_size(&mut raw, "mq2").await, Some(0));
    assert_eq!(raw.cmd("FETCH mq2").await, Answer::Bulk(None));

    // A pattern with a jobtype: only the fizz job of type mset (not `other`, not buzz).
    // `[[]` is a class holding `[`, `\]` an escaped `]`: Redis glob syntax.
    let by_pattern = json!({"cmd": "requeue", "target": "retries",
        "filter": {"jobtype": "mset", "regexp": r#"*"args":[[]"fizz"\]*"#}});
    assert_eq!(
        raw.cmd(&format!("MUTATE {by_pattern}")).await,
        Answer::Simple("OK".into())
    );
    assert_eq!(queue_size(&mut raw, "mq2").await, Some(1));
    let again = bulk_json(raw.cmd("FETCH mq2").await);
    assert_eq!(again["jid"], "mset-jid-fizz");
    let failure = &again["failure"];
    assert_eq!(failure["message"], "first");
    assert_eq!(failure["errtype"], "Boom");
    assert_eq!(failure["retry_count"], 0);
    assert_eq!(failure["remaining"], 3);
    assert_eq!(failure["backtrace"], json!(["at a.rs:1", "at b.rs:2"]));
    // It fails again: the retry count carries on from the requeued failure.
    let fail = json!({"jid": "mset-jid-fizz", "errtype": "Boom", "message": "second"});
    assert_eq!(
        raw.cmd(&format!("FAIL {fail}")).await,
        Answer::Simple("OK".into())
    );
    let by_jid =
        r#"MUTATE {"cmd":"requeue","target":"retries","filter":{"jids":["mset-jid-fizz"]}}"#;
    assert_eq!(raw.cmd(by_jid).await, Answer::Simple("OK".into()));
    let third = bulk_json(raw.cmd("FETCH mq2").await);
    assert_eq!(third["failure"]["retry_count"], 1);
    assert_eq!(third["failure"]["message"], "second");
    assert_eq!(third["failure"]["remaining"], 2);
    let ack = json!({"jid": "mset-jid-fizz"});
    assert_eq!(
        raw.cmd(&format!("ACK {ack}")).await,
        Answer::Simple("OK".into())
    );

    // discard the retries set by jid: buzz is deleted for good, whatever else it matches.
    let discard =
        r#"MUTATE {"cmd":"discard","target":"retries","filter":{"jids":["mset-jid-buzz"]}}"#;
    assert_eq!(raw.cmd(discard).await, Answer::Simple("OK".into()));
    assert!(node.job_by_jid("mset-jid-buzz").await.is_null());
    for target in ["retries", "scheduled", "dead"] {
        let all = format!(
            r#"MUTATE {{"cmd":"requeue","target":"{target}","filter":{{"jobtype":"mset"}}}}"#
        );
        assert_eq!(raw.cmd(&all).await, Answer::Simple("OK".into()));
    }
    assert_eq!(raw.cmd("FETCH mq2").await, Answer::Bulk(None));

    // clear empties a whole set, filter or not.
    let clear = r#"MUTATE {"cmd":"clear","target":"scheduled","filter":{"jobtype":"nothing"}}"#;
    assert_eq!(raw.cmd(clear).await, Answer::Simple("OK".into()));
    assert!(node.job_by_jid("mset-jid-other").await.is_null());
    assert_eq!(node.job_by_jid("mset-jid-fizz").await["state"], "succeeded");
    drop(raw);
    node.stop().await;
}

// Proves QUEUE REMOVE deletes a queue's waiting jobs (not its retries or HTTP jobs) and INFO then
// forgets it; `*` takes every queue; QUEUE LATENCY reports the oldest waiting job's age.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_remove_and_latency() {
    let node = Node::start(slow_retries()).await;
    let mut raw = Raw::connect(&node.faktory, Some("remover-000000000000000000000001")).await;
    for n in 0..3 {
        let job = json!({"jid": format!("remove-jid-{n:02}"), "jobtype": "r", "args": [n],
            "queue": "rq"});
        push_raw(&mut raw, job).await;
    }
    push_raw(
        &mut raw,
        json!({"jid": "remove-jid-other", "jobtype": "r", "args": [], "queue": "rq-other"}),
    )
    .await;
    let failed = fetch_and_fail(&mut raw, "rq", "retry me").await;
    assert_eq!(queue_size(&mut raw, "rq").await, Some(2));
    // An HTTP job whose step runs on the same agent name.
    let http_job = json!({"steps": [{"name": "s", "agent": "rq"}]});
    let res = reqwest::Client::new()
        .post(format!("{}/v1/jobs", node.http))
        .json(&http_job)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 202);
    let http_id = res.json::<Value>().await.unwrap()["id"].clone();

    tokio::time::sleep(Duration::from_millis(20)).await;
    let latency = bulk_json(raw.cmd("QUEUE LATENCY rq nothing-here").await);
    assert!(latency["rq"].as_f64().unwrap() > 0.0, "{latency}");
    assert_eq!(latency["nothing-here"].as_f64(), Some(0.0));
    assert_eq!(
        raw.cmd("QUEUE LATENCY").await,
        Answer::Error("ERR invalid format".into())
    );

    assert_eq!(
        raw.cmd("QUEUE REMOVE rq").await,
        Answer::Simple("OK".into())
    );
    assert_eq!(
        queue_size(&mut raw, "rq").await,
        Some(1),
        "the HTTP step remains"
    );
    for n in [1, 2] {
        assert!(node
            .job_by_jid(&format!("remove-jid-{n:02}"))
            .await
            .is_null());
    }
    let retrying = node.job_by_jid(failed["jid"].as_str().unwrap()).await;
    assert_eq!(retrying["state"], "running", "the retries set is untouched");
    let url = format!("{}/v1/jobs/{}", node.http, http_id.as_str().unwrap());
    let http_state = reqwest::get(url)
        .await
        .unwrap()
        .json::<Value>()
        .await
        .unwrap();
    assert_eq!(http_state["state"], "running");

    assert_eq!(queue_size(&mut raw, "rq-other").await, Some(1));
    assert_eq!(raw.cmd("QUEUE REMOVE *").await, Answer::Simple("OK".into()));
    assert_eq!(queue_size(&mut raw, "rq-other").await, None);
    assert!(node.job_by_jid("remove-jid-other").await.is_null());
    drop(raw);
    node.stop().await;
}
