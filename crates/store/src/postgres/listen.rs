//! Cross-node wake-ups: `NOTIFY overseer` sent by every committing node, heard by every node.
//!
//! Writers announce what they committed once it is committed, and only then (`announce`). One background task per store holds a
//! dedicated connection that has run `LISTEN overseer` and turns each notification into a
//! [`Signal`] on a broadcast channel. When that connection drops (the server restarted, the
//! network broke) the task reconnects with backoff; notifications sent meanwhile are lost, so
//! after every reconnect it emits `Signal::Due { at: 0 }` and the leader sweeps, which finds by
//! polling whatever the lost notifications were about. The task stops when the store is dropped.
//!
//! A node passes over the notifications it sent itself (see `announce`).
//!
//! Payloads: `ready:<agent>`, `finished:<job id>`, `due:<unix ms>`.

use std::time::Duration;

use futures::StreamExt as _;
use overseer_core::Timestamp;
use tokio::sync::broadcast;
use tokio::task::JoinHandle;
use tokio_postgres::{AsyncMessage, NoTls};

use super::announce::Origin;
use crate::Signal;

/// The channel every node listens on.
pub(super) const CHANNEL: &str = "overseer";

/// The longest a notification payload may be (PostgreSQL refuses 8000 bytes and more).
pub(super) const PAYLOAD_MAX: usize = 7_999;

const BACKOFF_FIRST: Duration = Duration::from_millis(100);
// Short: while disconnected this node hears nothing from the others, so come back quickly.
const BACKOFF_MAX: Duration = Duration::from_secs(1);

/// The listening task; aborted when dropped.
pub(super) struct Listener {
    task: JoinHandle<()>,
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A task aborted when its handle is dropped, so nothing outlives the listener.
struct AbortOnDrop<T>(JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

pub(super) fn spawn(
    config: tokio_postgres::Config,
    tls: super::tls::Tls,
    sender: broadcast::Sender<Signal>,
    own: Origin,
) -> Listener {
    Listener {
        task: tokio::spawn(run(config, tls, sender, own)),
    }
}

async fn run(
    config: tokio_postgres::Config,
    tls: super::tls::Tls,
    sender: broadcast::Sender<Signal>,
    own: Origin,
) {
    let mut backoff = BACKOFF_FIRST;
    // Anything before the first attempt is covered by the node's own start-up sweep; after a
    // failed attempt or a dropped connection, notifications may have been missed.
    let mut first_attempt = true;
    loop {
        let missed = !first_attempt;
        first_attempt = false;
        let session = match &tls {
            super::tls::Tls::Plain => listen(&config, NoTls, &sender, &own, missed).await,
            super::tls::Tls::Rustls(connect) => {
                listen(&config, connect.clone(), &sender, &own, missed).await
            }
        };
        match session {
            Ok(Session::Listened(end)) => {
                backoff = BACKOFF_FIRST;
                tracing::warn!(reason = %end, "the PostgreSQL LISTEN connection ended; reconnecting");
            }
            Ok(Session::NeverListened(e)) | Err(e) => {
                tracing::warn!(error = %e, retry_in_ms = backoff.as_millis() as u64,
                    "cannot LISTEN on PostgreSQL");
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

/// How one connection went.
enum Session {
    /// It listened until it ended, for this reason.
    Listened(String),
    /// It connected but `LISTEN` failed.
    NeverListened(String),
}

async fn listen<T>(
    config: &tokio_postgres::Config,
    tls: T,
    sender: &broadcast::Sender<Signal>,
    own: &Origin,
    missed: bool,
) -> Result<Session, String>
where
    T: tokio_postgres::tls::MakeTlsConnect<tokio_postgres::Socket>,
    T::Stream: Send + 'static,
{
    let (client, mut connection) = config.connect(tls).await.map_err(|e| e.to_string())?;
    let (forward, own) = (sender.clone(), own.clone());
    let driver = AbortOnDrop(tokio::spawn(async move {
        let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(message) = messages.next().await {
            match message {
                // This node's own: acted on already (see `announce`).
                Ok(AsyncMessage::Notification(n)) if own.is_own(n.process_id()) => {}
                Ok(AsyncMessage::Notification(n)) if n.channel() == CHANNEL => {
                    match parse(n.payload()) {
                        // No receiver is fine: nobody is waiting for anything.
                        Some(signal) => drop(forward.send(signal)),
                        None => tracing::debug!(payload = n.payload(), "unknown notification"),
                    }
                }
                Ok(_) => {}
                Err(e) => return e.to_string(),
            }
        }
        "the server closed the connection".to_string()
    }));
    if let Err(e) = client.batch_execute(&format!("LISTEN {CHANNEL}")).await {
        return Ok(Session::NeverListened(e.to_string()));
    }
    if missed {
        // Whatever was notified while we were away is found by a sweep.
        let _ = sender.send(Signal::Due { at: Timestamp(0) });
    }
    let mut driver = driver;
    let end = (&mut driver.0)
        .await
        .unwrap_or_else(|e| format!("the connection task failed: {e}"));
    drop(client);
    Ok(Session::Listened(end))
}

/// The signal a payload stands for.
pub(super) fn parse(payload: &str) -> Option<Signal> {
    let (kind, rest) = payload.split_once(':')?;
    match kind {
        "ready" => Some(Signal::Ready {
            agent: rest.to_string(),
        }),
        "finished" => rest.parse().ok().map(|job| Signal::Finished { job }),
        "due" => rest
            .parse()
            .ok()
            .map(|ms| Signal::Due { at: Timestamp(ms) }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Proves each payload kind decodes to its signal and anything else is ignored.
    #[test]
    fn payloads_parse() {
        assert_eq!(
            parse("ready:billing:eu"),
            Some(Signal::Ready {
                agent: "billing:eu".into()
            })
        );
        let id = overseer_core::JobId(uuid::Uuid::from_u128(5));
        assert_eq!(
            parse(&format!("finished:{id}")),
            Some(Signal::Finished { job: id })
        );
        assert_eq!(parse("due:17"), Some(Signal::Due { at: Timestamp(17) }));
        assert_eq!(parse("due:x"), None);
        assert_eq!(parse("other"), None);
    }
}
