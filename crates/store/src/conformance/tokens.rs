//! API tokens and the cluster-wide settings kept beside them.

use super::*;

// Proves the token records: a token is found by its secret's hash with its whole grant, a
// second token of the same name is refused, the list holds them all, and a revoke stamps the
// record once (a second revoke finds nothing to do) while the record stays findable.
pub async fn tokens_are_created_found_listed_and_revoked(f: &Fixture) {
    use overseer_core::auth::{hash_secret, Grant, Scope, TokenRecord};
    let store = &*f.store;
    let token = |name: &str, secret: &str, scopes: Vec<Scope>, agents: &[&str]| TokenRecord {
        name: name.into(),
        hash: hash_secret(secret),
        grant: Grant {
            scopes,
            agents: agents.iter().map(|a| a.to_string()).collect(),
        },
        created_at: at(0),
        expires_at: Some(at(90_000)),
        revoked_at: None,
    };
    let dns = token("dns-worker", "s1", vec![Scope::Agent], &["dns", "dns-eu"]);
    let ci = token("ci", "s2", vec![Scope::Submit, Scope::Read], &[]);
    store.token_create(dns.clone()).await.expect("create");
    store.token_create(ci.clone()).await.expect("create");
    match store
        .token_create(token("ci", "s3", vec![Scope::Admin], &[]))
        .await
    {
        Err(Error::TokenExists(name)) => assert_eq!(name, "ci"),
        other => panic!("expected TokenExists, got {other:?}"),
    }
    assert_eq!(
        store.token_by_hash(&hash_secret("s1")).await.expect("find"),
        Some(dns.clone())
    );
    assert_eq!(
        store.token_by_hash(&hash_secret("s3")).await.expect("find"),
        None
    );
    let listed = store.tokens_list().await.expect("list");
    assert_eq!(listed.len(), 2);
    assert!(listed.contains(&dns) && listed.contains(&ci));
    assert!(store.token_revoke("ci", at(5_000)).await.expect("revoke"));
    assert!(!store.token_revoke("ci", at(6_000)).await.expect("revoke"));
    assert!(!store
        .token_revoke("nobody", at(6_000))
        .await
        .expect("revoke"));
    let revoked = store
        .token_by_hash(&hash_secret("s2"))
        .await
        .expect("find")
        .expect("kept");
    assert_eq!(revoked.revoked_at, Some(at(5_000)));
    assert!(!revoked.is_live(at(5_001)));
}

// Proves a setting is made once: the first value stored is answered to every later caller
// (whatever value it offers), also when many callers race through separate calls, and keys are
// independent.
pub async fn a_setting_is_stored_once_and_shared(f: &Fixture) {
    let store = &*f.store;
    let first = store
        .setting_get_or_insert("webhook_secret", "whsec_first", at(0))
        .await
        .expect("insert");
    assert_eq!(first, "whsec_first");
    let again = store
        .setting_get_or_insert("webhook_secret", "whsec_second", at(1))
        .await
        .expect("get");
    assert_eq!(again, "whsec_first");
    let racers = (0..8).map(|i| {
        let store = f.store.clone();
        async move {
            store
                .setting_get_or_insert("raced", &format!("value-{i}"), at(2))
                .await
                .expect("race")
        }
    });
    let answers = futures::future::join_all(racers).await;
    assert!(answers.iter().all(|a| a == &answers[0]), "{answers:?}");
    assert!(answers[0].starts_with("value-"));
}
