//! `overseer tokens create|list|revoke`: API tokens, through the API (an admin token), or with
//! `--bootstrap` straight into the store, for the first admin token before any exists.
//! Also `overseer webhook-secret`: the webhook key the server generated, for admins.

use std::process::ExitCode;

use anyhow::Context;
use clap::Subcommand;
use overseer_core::Span;
use overseer_server::tokens::{make_token, CreateToken, TokenView};
use serde_json::Value;

use crate::{Output, Remote};

#[derive(Subcommand, Debug)]
pub enum TokensCmd {
    /// Make a token and print its secret, once: the store keeps only its hash.
    Create {
        #[arg(long)]
        name: String,
        /// admin, operate, submit, read or agent; repeat for several.
        #[arg(long = "scope", required = true)]
        scopes: Vec<String>,
        /// With `--scope agent`: an agent name the token may lease for; repeat for several.
        #[arg(long = "agent")]
        agents: Vec<String>,
        /// How long it lives, e.g. `90d`; by default until revoked.
        #[arg(long)]
        expires: Option<Span>,
        /// Write it straight into the store named by `--db` (no server, no token needed): how
        /// the first admin token is made.
        #[arg(long)]
        bootstrap: bool,
        /// The store, with `--bootstrap`.
        #[arg(long, env = "OVERSEER_DB", default_value = "sqlite://overseer.db")]
        db: String,
    },
    /// Every token: names, scopes, dates; never secrets.
    List,
    /// Revoke a token now, on every node.
    Revoke { name: String },
}

pub async fn run(remote: &Remote, command: TokensCmd, output: Output) -> anyhow::Result<ExitCode> {
    let client = crate::client_cmd::connect(remote)?;
    let shown: Value = match command {
        TokensCmd::Create {
            name,
            scopes,
            agents,
            expires,
            bootstrap,
            db,
        } => {
            let req = CreateToken {
                name,
                scopes,
                agents,
                expires,
            };
            match bootstrap {
                true => bootstrap_token(&db, &req).await?,
                false => client.create_token(&serde_json::to_value(&req)?).await?,
            }
        }
        TokensCmd::List => client.tokens().await?,
        TokensCmd::Revoke { name } => client.revoke_token(&name).await?,
    };
    match output {
        Output::Json => outln!("{}", serde_json::to_string_pretty(&shown)?),
        Output::Human => print_human(&shown)?,
    }
    Ok(ExitCode::SUCCESS)
}

fn print_human(shown: &Value) -> anyhow::Result<()> {
    if let Some(secret) = shown["secret"].as_str() {
        outln!("{secret}");
        eprintln!(
            "token `{}` created; this is the only time its secret is shown",
            shown["name"].as_str().unwrap_or_default()
        );
    } else if let Some(tokens) = shown["tokens"].as_array() {
        outln!(
            "{:<24} {:<22} {:<20} {:<26} STATE",
            "NAME",
            "SCOPES",
            "AGENTS",
            "EXPIRES"
        );
        for t in tokens {
            let state = if t["revoked_at"].is_null() {
                "live"
            } else {
                "revoked"
            };
            let join = |v: &Value| {
                let words: Vec<&str> = v
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                    .collect();
                if words.is_empty() {
                    "-".to_string()
                } else {
                    words.join(",")
                }
            };
            outln!(
                "{:<24} {:<22} {:<20} {:<26} {state}",
                t["name"].as_str().unwrap_or_default(),
                join(&t["scopes"]),
                join(&t["agents"]),
                t["expires_at"].as_str().unwrap_or("never"),
            );
        }
    } else {
        outln!(
            "token `{}` revoked",
            shown["name"].as_str().unwrap_or_default()
        );
    }
    Ok(())
}

/// Creates the token in the store directly. A SQLite file must not be in use by a running
/// server (it is locked); a PostgreSQL database may be.
async fn bootstrap_token(db: &str, req: &CreateToken) -> anyhow::Result<Value> {
    let config = overseer_server::Config {
        db: db.to_string(),
        ..overseer_server::Config::default()
    };
    let store = overseer_server::open_store(&config)
        .await
        .with_context(|| format!("cannot open store {db}"))?;
    let now = overseer_server::Clock::now(&overseer_server::SystemClock);
    let (record, secret) = make_token(req, now, rand::random())
        .map_err(|e| anyhow::anyhow!("{}", e.problem().detail))?;
    store.token_create(record.clone()).await?;
    let mut shown = serde_json::to_value(TokenView::from(&record))?;
    shown["secret"] = Value::String(secret);
    Ok(shown)
}

/// `overseer webhook-secret`: the generated webhook key on stdout (nothing else there, so it
/// can be piped into a receiver's configuration); a configured key is never shown.
pub async fn webhook_secret(remote: &Remote, output: Output) -> anyhow::Result<ExitCode> {
    let client = crate::client_cmd::connect(remote)?;
    let shown = client.webhook_secret().await?;
    match (output, shown["secret"].as_str()) {
        (Output::Json, _) => outln!("{}", serde_json::to_string_pretty(&shown)?),
        (Output::Human, Some(secret)) => outln!("{secret}"),
        (Output::Human, None) => eprintln!(
            "the webhook key is configured (webhook_secret / webhook_secrets): the server does \
             not return it"
        ),
    }
    Ok(ExitCode::SUCCESS)
}
