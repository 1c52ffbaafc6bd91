//! The HTTP client against a fake server: status mapping, problems, query strings.

mod common;

use std::time::Duration;

use common::{lease, Beat, Fake};
use overseer_agent::client::Error;
use overseer_agent::Client;
use overseer_core::{JobId, Span};
use serde_json::json;

// Proves a submit answers `created` for 202 and not for 200, and sends the bearer token.
#[tokio::test]
async fn submit_tells_created_from_existing() {
    let fake = Fake::start().await;
    let client = Client::new(&fake.base, Some("s3cret".into())).unwrap();
    let body = json!({"idempotency_key": "k1", "steps": [{"name": "a", "agent": "x"}]});
    let (first, created) = client.submit_value(&body).await.unwrap();
    assert!(created);
    assert_eq!(first.idempotency_key.as_deref(), Some("k1"));
    let (_, created) = client.submit_value(&body).await.unwrap();
    assert!(
        !created,
        "the same idempotency key answers 200, not created"
    );
    let auth = fake.with(|i| i.auth.clone());
    assert_eq!(auth, vec![Some("Bearer s3cret".to_string()); 2]);
}

// Proves an error answer becomes Error::Api carrying the server's problem, field included.
#[tokio::test]
async fn problems_are_decoded() {
    let fake = Fake::start().await;
    let err = fake
        .client()
        .submit_value(&json!({"steps": []}))
        .await
        .unwrap_err();
    match &err {
        Error::Api {
            status: 400,
            problem,
        } => {
            assert_eq!(problem.field.as_deref(), Some("steps"));
            assert!(problem.detail.contains("at least one step"));
        }
        other => panic!("expected a 400 problem, got {other:?}"),
    }
    assert!(!err.is_transient());
    // A proxy's HTML error page is still an Api error with a made-up problem.
    match fake.client().agents().await.unwrap_err() {
        Error::Api {
            status: 502,
            problem,
        } => assert!(problem.detail.contains("upstream is down")),
        other => panic!("expected a 502, got {other:?}"),
    }
}

// Proves 409 on complete, fail and heartbeat is Error::LeaseLost, so agents can match it.
#[tokio::test]
async fn lease_conflicts_are_lease_lost() {
    let fake = Fake::start().await;
    let client = fake.client();
    let l = lease("s", 5_000, 5_000);
    fake.push(l.clone());
    let got = client
        .leases(
            "work",
            &overseer_core::wire::LeaseRequest {
                worker: "w".into(),
                max: Some(1),
                wait: Some(Span::from_secs(1)),
            },
        )
        .await
        .unwrap();
    assert_eq!(got.leases, vec![l.clone()]);
    client.complete(l.lease_id, Some(json!(1))).await.unwrap();
    assert!(matches!(
        client.complete(l.lease_id, None).await,
        Err(Error::LeaseLost(_))
    ));
    assert!(matches!(
        client.fail(l.lease_id, "x", true).await,
        Err(Error::LeaseLost(_))
    ));
    fake.set_beat(Beat::Conflict);
    assert!(matches!(
        client.heartbeat(l.lease_id, None).await,
        Err(Error::LeaseLost(_))
    ));
}

// Proves list filters and the wait timeout are sent as the documented query parameters.
#[tokio::test]
async fn queries_are_encoded() {
    let fake = Fake::start().await;
    let client = fake.client();
    let labels = vec!["team:infra".to_string(), "env:prod".to_string()];
    let list = client
        .jobs(Some("running"), &labels, Some(10), Some("abc"))
        .await
        .unwrap();
    assert_eq!(list.next_cursor.as_deref(), Some("c2"));
    client
        .wait(JobId::generate(), Span::from_secs(2))
        .await
        .unwrap();
    let queries = fake.with(|i| i.queries.clone());
    assert_eq!(
        queries,
        vec![
            "state=running&label=team%3Ainfra&label=env%3Aprod&limit=10&cursor=abc",
            "timeout=2s"
        ]
    );
}

// Proves a server that does not answer is a transient transport error, not a hang.
#[tokio::test]
async fn unreachable_server_is_transient() {
    // Bind then drop a listener, so the port is very likely closed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let client = Client::new(&format!("http://127.0.0.1:{port}"), None).unwrap();
    let err = tokio::time::timeout(Duration::from_secs(10), client.job(JobId::generate()))
        .await
        .expect("a refused connection answers quickly")
        .unwrap_err();
    assert!(matches!(err, Error::Transport { .. }), "{err:?}");
    assert!(err.is_transient());
}
