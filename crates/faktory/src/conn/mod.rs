//! One client connection: the handshake, then one command at a time.
//!
//! This module holds the connection itself: its lifecycle (handshake, the command loop, what
//! closing releases), the dispatch of each command to its handler, and the store scans the
//! handlers share. The handlers live in a module per concern:
//! - `handshake`: the `HI` greeting, `HELLO` and the password proof;
//! - `produce`: `PUSH` and `PUSHB`;
//! - `fetch`: `FETCH`;
//! - `report`: `ACK`, `FAIL` and `BEAT`;
//! - `info`: `INFO`;
//! - `queue`: `QUEUE PAUSE | RESUME | REMOVE | LATENCY`;
//! - `mutate`: `MUTATE` and `FLUSH`.

use overseer_core::{Command, Job, JobId, JobState};
use overseer_store::{Apply, JobQuery};
use tokio::io::{BufReader, BufWriter};

use crate::job;
use crate::resp::{self, Line, Reply};
use crate::{Faktory, Held};

mod fetch;
mod handshake;
mod info;
mod mutate;
mod produce;
mod queue;
mod report;

pub use handshake::{password_hash, Hello};

/// Jobs `MUTATE` and `FLUSH` look at, at most, per command.
const SCAN_MAX: usize = 10_000;
const SCAN_PAGE: usize = 500;

pub struct Connection {
    fk: Faktory,
    /// Who holds the leases this connection takes: its wid, or an identity of its own.
    holder: String,
    wid: Option<String>,
}

impl Connection {
    /// Serves one client connection, plain TCP or TLS, until it closes.
    pub async fn run<S>(fk: Faktory, stream: S) -> std::io::Result<()>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let (rd, wr) = tokio::io::split(stream);
        let mut reader = BufReader::new(rd);
        let mut writer = BufWriter::new(wr);
        let max = fk.app().limits().body_bytes + 1024;
        let Some(hello) = handshake::handshake(&fk, &mut reader, &mut writer, max).await? else {
            return Ok(());
        };
        let conn = Connection::open(fk, hello);
        let result = conn.serve(&mut reader, &mut writer, max).await;
        conn.closed().await;
        result
    }

    /// The connection after a good `HELLO`: its lease holder chosen, its worker (if any) known.
    fn open(fk: Faktory, hello: Hello) -> Connection {
        let wid = hello.wid.clone().filter(|w| !w.is_empty());
        let holder = wid.clone().unwrap_or_else(|| {
            use rand::Rng;
            format!("faktory-conn-{:016x}", rand::thread_rng().gen::<u64>())
        });
        fk.worker_hello(&Hello {
            wid: wid.clone(),
            ..hello
        });
        Connection { fk, holder, wid }
    }

    async fn serve<R, W>(
        &self,
        reader: &mut BufReader<R>,
        writer: &mut BufWriter<W>,
        max: usize,
    ) -> std::io::Result<()>
    where
        R: tokio::io::AsyncRead + Unpin,
        W: tokio::io::AsyncWrite + Unpin,
    {
        resp::write(writer, &Reply::Ok).await?;
        let shutdown = self.fk.app().shutdown().clone();
        loop {
            let line = tokio::select! {
                _ = shutdown.cancelled() => {
                    let _ = resp::write(writer, &Reply::err("shutdown in progress")).await;
                    return Ok(());
                }
                line = resp::read_line(reader, max) => line?,
            };
            let line = match line {
                Line::Command(l) => l,
                Line::Closed => return Ok(()),
                Line::TooLong => {
                    resp::write(
                        writer,
                        &Reply::err(format!("command longer than {max} bytes")),
                    )
                    .await?;
                    return Ok(());
                }
                Line::Invalid => {
                    resp::write(writer, &Reply::err("commands must be UTF-8")).await?;
                    continue;
                }
            };
            self.fk.count_command();
            if let Some(wid) = &self.wid {
                self.fk.worker_seen(wid);
            }
            let (verb, args) = line.split_once(' ').unwrap_or((line.as_str(), ""));
            if verb == "END" {
                return Ok(());
            }
            let (reply, leased) = self.dispatch(verb, args).await;
            if let Err(e) = resp::write(writer, &reply).await {
                // The job never reached the worker: give it back now rather than at expiry.
                if let Some((jid, held)) = leased {
                    self.fk
                        .release(
                            &jid,
                            &held,
                            "ConnectionLost: the worker left before receiving the job",
                        )
                        .await;
                }
                return Err(e);
            }
        }
    }

    /// The connection is gone: a worker's leases wait for its BEATs to stop (it may reconnect);
    /// leases of a connection without a wid can never be reported, so they are released now.
    async fn closed(&self) {
        match &self.wid {
            Some(wid) => self.fk.worker_closed(wid),
            None => {
                self.fk
                    .release_holder(
                        &self.holder,
                        "ConnectionLost: the connection that fetched the job closed",
                    )
                    .await
            }
        }
    }

    async fn dispatch(&self, verb: &str, args: &str) -> (Reply, Option<(String, Held)>) {
        let reply = match verb {
            "PUSH" => self.push(args).await,
            "PUSHB" => self.push_bulk(args).await,
            "FETCH" => return self.fetch(args).await,
            "ACK" => self.ack(args).await,
            "FAIL" => self.fail(args).await,
            "BEAT" => self.beat(args),
            "INFO" => self.info().await,
            "QUEUE" => self.queue(args).await,
            "MUTATE" => self.mutate(args).await,
            "FLUSH" => self.flush().await,
            "BATCH" => Reply::err("batch subsystem is only available in Faktory Enterprise"),
            "TRACK" => Reply::err("tracking subsystem is only available in Faktory Enterprise"),
            other => Reply::err(format!("unknown command {other}")),
        };
        (reply, None)
    }

    /// How pushed jobs are shaped into Overseer jobs on this server.
    fn shape(&self) -> job::Shape {
        job::Shape {
            reserve_min: self.fk.config().reserve_min,
            backoff: self.fk.config().backoff,
        }
    }

    /// Faktory jobs in `state` with the given labels too, newest first, at most [`SCAN_MAX`].
    async fn scan(
        &self,
        state: Option<JobState>,
        mut labels: Vec<(String, String)>,
    ) -> overseer_store::Result<Vec<Job>> {
        let store = self.fk.app().store();
        labels.push((job::LABEL_VIA.to_string(), job::VIA.to_string()));
        let mut out = Vec::new();
        let mut before = None;
        while out.len() < SCAN_MAX {
            let page = store
                .jobs_list(JobQuery {
                    state,
                    labels: labels.clone(),
                    limit: SCAN_PAGE,
                    before,
                    ..JobQuery::default()
                })
                .await?;
            let full = page.len() == SCAN_PAGE;
            before = page.last().map(|j| j.id);
            out.extend(page.into_iter().filter(job::is_faktory));
            if !full {
                break;
            }
        }
        Ok(out)
    }

    async fn cancel(&self, id: JobId) -> overseer_store::Result<()> {
        let app = self.fk.app();
        match app
            .store()
            .job_apply(Apply::new(id, Command::Cancel, app.now()))
            .await
        {
            Ok(t) => {
                app.committed(&t);
                Ok(())
            }
            Err(overseer_store::Error::Rejected(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }
}
