//! The start of a connection: the `HI` greeting, the client's `HELLO`, and Faktory's password
//! proof when the server has a password.

use std::time::Duration;

use serde::Deserialize;
use serde_json::json;
use sha2::{Digest, Sha256};
use tokio::io::{BufReader, BufWriter};

use crate::resp::{self, Line, Reply};
use crate::Faktory;

/// How long a client has to send `HELLO` after the greeting (Faktory: 2 s).
const HELLO_WITHIN: Duration = Duration::from_secs(2);

/// The client's `HELLO`.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct Hello {
    #[serde(default)]
    pub wid: Option<String>,
    #[serde(default)]
    pub hostname: Option<String>,
    #[serde(default)]
    pub pid: Option<i64>,
    #[serde(default)]
    pub labels: Vec<String>,
    #[serde(default)]
    pub v: Option<u32>,
    #[serde(default)]
    pub pwdhash: Option<String>,
}

/// Faktory's password proof: hex(sha256 applied `iterations` times to password + salt).
pub fn password_hash(password: &str, salt: &str, iterations: u32) -> String {
    let mut hash = Sha256::digest(format!("{password}{salt}").as_bytes());
    for _ in 1..iterations.max(1) {
        hash = Sha256::digest(hash);
    }
    hex::encode(hash)
}

fn same_secret(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

/// Greets the client and reads its `HELLO`, checking the password proof when the server has a
/// password. `None` when the client sent no `HELLO` in time, an invalid one, or a wrong proof
/// (the last two are answered with an error first); the connection then ends.
pub(super) async fn handshake<R, W>(
    fk: &Faktory,
    reader: &mut BufReader<R>,
    writer: &mut BufWriter<W>,
    max: usize,
) -> std::io::Result<Option<Hello>>
where
    R: tokio::io::AsyncRead + Unpin,
    W: tokio::io::AsyncWrite + Unpin,
{
    let (iterations, salt) = {
        use rand::Rng;
        let mut rng = rand::thread_rng();
        (
            rng.gen_range(4000..8096u32),
            format!("{:x}", rng.gen::<u64>() >> 1),
        )
    };
    let hi = match &fk.config().password {
        Some(_) => json!({"v": 2, "i": iterations, "s": salt}),
        None => json!({"v": 2}),
    };
    resp::write(writer, &Reply::Simple(format!("HI {hi}"))).await?;
    let line = match tokio::time::timeout(HELLO_WITHIN, resp::read_line(reader, max)).await {
        Ok(Ok(Line::Command(l))) => l,
        _ => return Ok(None),
    };
    let hello: Hello = match line
        .strip_prefix("HELLO ")
        .and_then(|raw| serde_json::from_str(raw).ok())
    {
        Some(h) => h,
        None => {
            resp::write(writer, &Reply::err("invalid HELLO")).await?;
            return Ok(None);
        }
    };
    if let Some(password) = &fk.config().password {
        let iterations = if hello.v.unwrap_or(0) < 2 {
            1
        } else {
            iterations
        };
        let expected = password_hash(password, &salt, iterations);
        if !same_secret(hello.pwdhash.as_deref().unwrap_or(""), &expected) {
            resp::write(writer, &Reply::err("Invalid password")).await?;
            return Ok(None);
        }
    }
    Ok(Some(hello))
}

#[cfg(test)]
mod tests {
    use super::*;

    // Proves the password proof matches Faktory's definition (one round = plain sha256).
    #[test]
    fn password_hash_iterates_sha256() {
        let one = password_hash("pw", "salt", 1);
        assert_eq!(one, hex::encode(Sha256::digest(b"pwsalt")));
        let two = password_hash("pw", "salt", 2);
        assert_eq!(two, hex::encode(Sha256::digest(Sha256::digest(b"pwsalt"))));
        assert!(same_secret(&two, &two.clone()) && !same_secret(&one, &two));
    }
}
