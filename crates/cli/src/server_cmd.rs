//! `overseer server`: settings from flags, `OVERSEER_*` variables and a TOML file (in that order
//! of precedence), validated before anything starts.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use overseer_core::Span;
use overseer_server::Config;
use tokio_util::sync::CancellationToken;

#[derive(Args, Debug)]
pub struct ServerArgs {
    /// Store URL: `sqlite://PATH` (default `sqlite://overseer.db`, one server per file) or
    /// `postgres://USER@HOST:PORT/DATABASE` (any number of nodes on one database).
    #[arg(long, env = "OVERSEER_DB")]
    db: Option<String>,
    /// Address to listen on for HTTP.
    #[arg(long, env = "OVERSEER_LISTEN")]
    listen: Option<SocketAddr>,
    /// A TOML file with settings: every flag below by its name with `_` for `-` (e.g.
    /// `sweep_interval = "500ms"`, `faktory_listen = "127.0.0.1:7419"`), plus the settings with
    /// no flag and a `[limits]` table. Flags and environment variables win over it.
    #[arg(long, env = "OVERSEER_CONFIG")]
    config: Option<PathBuf>,
    /// How often the supervisor sweeps, e.g. `1s`.
    #[arg(long, env = "OVERSEER_SWEEP_INTERVAL")]
    sweep_interval: Option<Span>,
    /// Log format: human or json.
    #[arg(long, env = "OVERSEER_LOG_FORMAT")]
    log_format: Option<String>,
    /// Once listening, write the bound address to this file (useful with `--listen 127.0.0.1:0`).
    #[arg(long, env = "OVERSEER_READY_FILE")]
    ready_file: Option<PathBuf>,
    /// Also speak the Faktory work protocol on this address (Faktory's port is 7419); off
    /// unless given.
    #[arg(long, env = "OVERSEER_FAKTORY_LISTEN")]
    faktory_listen: Option<SocketAddr>,
    /// Password Faktory clients must prove they know (`tcp://:PASSWORD@host:port`).
    #[arg(long, env = "OVERSEER_FAKTORY_PASSWORD", hide_env_values = true)]
    faktory_password: Option<String>,
    /// Allow the Faktory `FLUSH` command (cancels every Faktory job): development and tests only.
    #[arg(long, env = "OVERSEER_FAKTORY_ALLOW_FLUSH")]
    faktory_allow_flush: bool,
    /// Whether API calls need a token: `auto` (required off loopback, off on loopback),
    /// `required`, or `off` (refused off loopback).
    #[arg(long, env = "OVERSEER_AUTH", value_parser = parse_auth)]
    auth: Option<overseer_server::auth::Mode>,
    /// An admin secret of your own (32+ characters) accepted as a token but never stored; prefer
    /// the environment variable to the flag, which other users can see in `ps`.
    #[arg(long, env = "OVERSEER_ADMIN_TOKEN", hide_env_values = true)]
    admin_token: Option<String>,
    /// A PEM certificate chain: with `--tls-key`, serve HTTPS.
    #[arg(long, env = "OVERSEER_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The PEM private key of `--tls-cert`.
    #[arg(long, env = "OVERSEER_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Internal networks or host names callbacks and alert webhooks may reach (everything
    /// internal is refused otherwise), e.g. `10.0.0.0/8,hooks.internal`; repeat or comma-separate.
    #[arg(long, env = "OVERSEER_OUTBOUND_ALLOW", value_delimiter = ',')]
    outbound_allow: Vec<String>,
    /// The key deliveries are signed with (`whsec_` + base64); prefer the environment variable.
    #[arg(long, env = "OVERSEER_WEBHOOK_SECRET", hide_env_values = true)]
    webhook_secret: Option<String>,
    /// More keys that sign every delivery too (rotation: the new key here and the old one, or
    /// the other way round); comma-separated.
    #[arg(
        long,
        env = "OVERSEER_WEBHOOK_SECRETS",
        hide_env_values = true,
        value_delimiter = ','
    )]
    webhook_secrets: Vec<String>,
    /// HTTP connections open at once at most (default 10000).
    #[arg(long, env = "OVERSEER_MAX_CONNECTIONS")]
    max_connections: Option<usize>,
    /// How long a client may take to send its request headers (default 10s).
    #[arg(long, env = "OVERSEER_HEADER_READ_TIMEOUT")]
    header_read_timeout: Option<Span>,
}

fn parse_auth(s: &str) -> Result<overseer_server::auth::Mode, String> {
    use overseer_server::auth::Mode;
    match s {
        "auto" => Ok(Mode::Auto),
        "required" => Ok(Mode::Required),
        "off" => Ok(Mode::Off),
        _ => Err(format!("`{s}` is not auto, required or off")),
    }
}

pub fn build_config(args: &ServerArgs) -> anyhow::Result<Config> {
    let mut config = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read config file {}", path.display()))?;
            toml::from_str::<Config>(&text)
                .with_context(|| format!("invalid config file {}", path.display()))?
        }
        None => Config::default(),
    };
    if let Some(db) = &args.db {
        config.db = db.clone();
    }
    if let Some(listen) = args.listen {
        config.listen = listen;
    }
    if let Some(interval) = args.sweep_interval {
        config.sweep_interval = interval;
    }
    if let Some(format) = &args.log_format {
        config.log_format = format.clone();
    }
    if let Some(path) = &args.ready_file {
        config.ready_file = Some(path.clone());
    }
    if let Some(addr) = args.faktory_listen {
        config.faktory_listen = Some(addr);
    }
    if let Some(password) = &args.faktory_password {
        config.faktory_password = Some(password.clone());
    }
    if args.faktory_allow_flush {
        config.faktory_allow_flush = true;
    }
    if let Some(mode) = args.auth {
        config.auth = mode;
    }
    if let Some(token) = &args.admin_token {
        config.admin_token = Some(token.clone());
    }
    if let (Some(cert), Some(key)) = (&args.tls_cert, &args.tls_key) {
        config.tls_cert = Some(cert.clone());
        config.tls_key = Some(key.clone());
    }
    if !args.outbound_allow.is_empty() {
        config.outbound_allow = args.outbound_allow.clone();
    }
    if let Some(secret) = &args.webhook_secret {
        config.webhook_secret = Some(secret.clone());
    }
    if !args.webhook_secrets.is_empty() {
        config.webhook_secrets = args.webhook_secrets.clone();
    }
    if let Some(n) = args.max_connections {
        config.max_connections = n;
    }
    if let Some(t) = args.header_read_timeout {
        config.header_read_timeout = t;
    }
    config.validate()?;
    Ok(config)
}

pub async fn run(args: ServerArgs) -> anyhow::Result<ExitCode> {
    let config = build_config(&args)?;
    crate::init_logging(&config.log_format);
    // Ports first: a node that cannot listen must not create or lock a store on its way out.
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen on {}", config.listen))?;
    let faktory = bind_faktory(&config).await?;
    let store = overseer_server::open_store(&config)
        .await
        .with_context(|| format!("cannot open store {}", config.db))?;
    let addr = listener.local_addr()?;
    let scheme = if config.tls_cert.is_some() {
        "https"
    } else {
        "http"
    };
    tracing::info!(%addr, %scheme, auth = config.auth_required(), db = %config.db, "overseer listening");
    if let Some(path) = &config.ready_file {
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, addr.to_string()).context("cannot write ready file")?;
        std::fs::rename(&tmp, path).context("cannot write ready file")?;
    }
    let shutdown = CancellationToken::new();
    let on_signal = shutdown.clone();
    tokio::spawn(async move {
        crate::shutdown_signal().await;
        tracing::info!("shutting down: finishing in-flight requests");
        on_signal.cancel();
    });
    overseer_server::serve_with(
        store,
        &config,
        listener,
        shutdown,
        move |app| match faktory {
            Some((listener, settings)) => {
                overseer_faktory::Faktory::new(app, settings).start(listener)
            }
            None => Vec::new(),
        },
    )
    .await?;
    tracing::info!("stopped");
    Ok(ExitCode::SUCCESS)
}

/// The Faktory listener and its settings, when `faktory_listen` asks for one.
async fn bind_faktory(
    config: &Config,
) -> anyhow::Result<Option<(tokio::net::TcpListener, overseer_faktory::Config)>> {
    let Some(addr) = config.faktory_listen else {
        return Ok(None);
    };
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr} for Faktory clients"))?;
    tracing::info!(addr = %listener.local_addr()?, "speaking the Faktory work protocol");
    // The HTTP listener's certificate serves Faktory clients too (`tcp+tls://`).
    let tls = match (&config.tls_cert, &config.tls_key) {
        (Some(cert), Some(key)) => Some(overseer_faktory::Tls(
            overseer_server::listen::tls_acceptor(cert, key)?,
        )),
        _ => None,
    };
    let settings = overseer_faktory::Config {
        password: config.faktory_password.clone().filter(|p| !p.is_empty()),
        allow_flush: config.faktory_allow_flush,
        tls,
        ..overseer_faktory::Config::default()
    };
    Ok(Some((listener, settings)))
}

#[cfg(test)]
mod tests {
    use clap::{Args, Command, FromArgMatches};

    use super::*;

    // Proves every flag of `overseer server` can also be set in the TOML file: each flag's name
    // (with `_` for `-`) is a field of `Config`, except `--config` itself.
    #[test]
    fn every_flag_is_a_setting_of_the_file() {
        let fields = serde_json::to_value(Config::default()).expect("config as JSON");
        let fields = fields.as_object().expect("an object");
        let command = ServerArgs::augment_args(Command::new("server"));
        for arg in command.get_arguments() {
            let Some(long) = arg.get_long() else { continue };
            if long == "config" || long == "help" {
                continue;
            }
            let key = long.replace('-', "_");
            assert!(
                fields.contains_key(&key),
                "`--{long}` has no `{key}` setting"
            );
        }
    }

    // Proves the file's Faktory settings reach the config, and a flag still wins over the file.
    #[test]
    fn faktory_settings_come_from_the_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("overseer.toml");
        std::fs::write(
            &file,
            "faktory_listen = \"127.0.0.1:7419\"\nfaktory_allow_flush = true\n",
        )
        .expect("write");
        let args = ServerArgs::from_arg_matches(
            &ServerArgs::augment_args(Command::new("server")).get_matches_from([
                "server",
                "--config",
                file.to_str().expect("utf-8"),
                "--faktory-listen",
                "127.0.0.1:7420",
            ]),
        )
        .expect("parse");
        let config = build_config(&args).expect("valid");
        assert_eq!(
            config.faktory_listen,
            Some("127.0.0.1:7420".parse().unwrap())
        );
        assert!(config.faktory_allow_flush);
    }
}
