//! TLS to PostgreSQL, asked for in the URL the way libpq users already write it:
//! - `sslmode=require`: encrypted, the server's certificate not checked (libpq's meaning);
//! - `sslmode=verify-ca` / `verify-full`: encrypted and checked, against the CA certificate(s)
//!   in `sslrootcert=PATH`, or the public web roots without it; the host name is always checked
//!   (so `verify-ca` is as strict as `verify-full` here);
//! - no `sslmode`, or `disable`/`allow`/`prefer`: plain TCP, as before.
//!
//! Either way the connection is made with rustls (the `ring` provider); no OpenSSL.

use std::sync::Arc;

use tokio_postgres_rustls::MakeRustlsConnect;
use tokio_rustls::rustls::client::danger::{
    HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier,
};
use tokio_rustls::rustls::crypto::{self, CryptoProvider};
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use tokio_rustls::rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};

use crate::{Error, Result};

/// How connections to the database are made.
#[derive(Clone)]
pub(super) enum Tls {
    Plain,
    Rustls(MakeRustlsConnect),
}

/// What the URL asks for: the URL to hand to the driver (with `sslmode` as it understands it
/// and `sslrootcert` taken out) and the connector.
pub(super) fn from_url(url: &str) -> Result<(String, Tls)> {
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    let mut kept = Vec::new();
    let (mut mode, mut root) = (None, None);
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("sslmode", v)) => mode = Some(v.to_string()),
            Some(("sslrootcert", v)) => root = Some(v.to_string()),
            _ => kept.push(pair.to_string()),
        }
    }
    let tls = match mode.as_deref() {
        None | Some("disable" | "allow" | "prefer") => Tls::Plain,
        Some("require") => Tls::Rustls(MakeRustlsConnect::new(unverified()?)),
        Some("verify-ca" | "verify-full") => Tls::Rustls(MakeRustlsConnect::new(verified(root)?)),
        Some(other) => {
            return Err(Error::Unavailable(format!(
                "sslmode `{other}` is not one of disable, prefer, require, verify-ca, verify-full"
            )))
        }
    };
    if matches!(tls, Tls::Rustls(_)) {
        kept.push("sslmode=require".into());
    }
    let url = match kept.is_empty() {
        true => base.to_string(),
        false => format!("{base}?{}", kept.join("&")),
    };
    Ok((url, tls))
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(crypto::ring::default_provider())
}

/// Checks the server against `root` (a PEM file) or the public web roots.
fn verified(root: Option<String>) -> Result<ClientConfig> {
    let mut roots = RootCertStore::empty();
    match root {
        Some(path) => {
            use tokio_rustls::rustls::pki_types::pem::PemObject;
            let certs = CertificateDer::pem_file_iter(&path)
                .map_err(|e| Error::Unavailable(format!("cannot read sslrootcert {path}: {e}")))?;
            for cert in certs {
                let cert =
                    cert.map_err(|e| Error::Unavailable(format!("sslrootcert {path}: {e}")))?;
                roots
                    .add(cert)
                    .map_err(|e| Error::Unavailable(format!("sslrootcert {path}: {e}")))?;
            }
        }
        None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
    }
    Ok(ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Unavailable(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

/// Encrypts without checking who answers: `sslmode=require` as libpq means it.
fn unverified() -> Result<ClientConfig> {
    let provider = provider();
    Ok(ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Unavailable(e.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
        .with_no_client_auth())
}

/// Accepts any certificate, but still checks the handshake's signatures with it.
#[derive(Debug)]
struct AnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, tokio_rustls::rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, tokio_rustls::rustls::Error> {
        crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, tokio_rustls::rustls::Error> {
        crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Proves the URL is read as libpq users write it: TLS modes become the driver's `require`
    // with our connector, other modes stay plain, `sslrootcert` is taken out, others kept.
    #[test]
    fn urls_choose_the_connection() {
        let (url, tls) = from_url("postgres://u@h/db?sslmode=require&application_name=x").unwrap();
        assert!(matches!(tls, Tls::Rustls(_)));
        assert_eq!(url, "postgres://u@h/db?application_name=x&sslmode=require");
        let (url, tls) = from_url("postgres://u@h/db").unwrap();
        assert!(matches!(tls, Tls::Plain));
        assert_eq!(url, "postgres://u@h/db");
        let (url, tls) = from_url("postgres://u@h/db?sslmode=prefer").unwrap();
        assert!(matches!(tls, Tls::Plain) && url == "postgres://u@h/db");
        let (_, tls) = from_url("postgres://u@h/db?sslmode=verify-full").unwrap();
        assert!(matches!(tls, Tls::Rustls(_)));
        assert!(from_url("postgres://u@h/db?sslmode=verify-full&sslrootcert=/nope.pem").is_err());
        assert!(from_url("postgres://u@h/db?sslmode=sometimes").is_err());
    }
}
