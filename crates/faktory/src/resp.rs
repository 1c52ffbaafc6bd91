//! The wire format: clients send one command per line (`VERB args\r\n`); the server answers in
//! RESP (the Redis serialization protocol): `+simple\r\n`, `-ERR message\r\n`,
//! `$len\r\npayload\r\n`, and the null bulk string `$-1\r\n`.

use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// One answer to a command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    /// `+OK`
    Ok,
    /// `+<text>` (the greeting)
    Simple(String),
    /// `-<text>`; `text` includes its code, e.g. `ERR jobs must have a jobtype parameter`.
    Error(String),
    /// `$<len>` and the bytes
    Bulk(Vec<u8>),
    /// `$-1`
    Null,
}

impl Reply {
    /// An error with Faktory's generic `ERR` code.
    pub fn err(message: impl std::fmt::Display) -> Reply {
        Reply::Error(format!("ERR {message}"))
    }

    pub fn json(value: &serde_json::Value) -> Reply {
        Reply::Bulk(serde_json::to_vec(value).unwrap_or_default())
    }

    pub fn encode(&self) -> Vec<u8> {
        // Simple strings and errors cannot carry line breaks.
        let line = |s: &str| s.replace(['\r', '\n'], " ");
        match self {
            Reply::Ok => b"+OK\r\n".to_vec(),
            Reply::Simple(s) => format!("+{}\r\n", line(s)).into_bytes(),
            Reply::Error(s) => format!("-{}\r\n", line(s)).into_bytes(),
            Reply::Bulk(b) => {
                let mut out = format!("${}\r\n", b.len()).into_bytes();
                out.extend_from_slice(b);
                out.extend_from_slice(b"\r\n");
                out
            }
            Reply::Null => b"$-1\r\n".to_vec(),
        }
    }
}

pub async fn write<W: AsyncWrite + Unpin>(w: &mut W, reply: &Reply) -> std::io::Result<()> {
    w.write_all(&reply.encode()).await?;
    w.flush().await
}

/// What reading a line gave.
#[derive(Debug, PartialEq, Eq)]
pub enum Line {
    Command(String),
    /// The peer closed the connection.
    Closed,
    /// Longer than the limit: the connection cannot be resynchronised.
    TooLong,
    /// Not UTF-8.
    Invalid,
}

/// Reads one command line of at most `max` bytes, without its line ending.
pub async fn read_line<R: AsyncBufRead + Unpin>(r: &mut R, max: usize) -> std::io::Result<Line> {
    let mut buf = Vec::new();
    let n = (&mut *r)
        .take(max as u64 + 2)
        .read_until(b'\n', &mut buf)
        .await?;
    if n == 0 {
        return Ok(Line::Closed);
    }
    if buf.last() != Some(&b'\n') {
        return Ok(if buf.len() as u64 >= max as u64 + 2 {
            Line::TooLong
        } else {
            Line::Closed
        });
    }
    buf.pop();
    if buf.last() == Some(&b'\r') {
        buf.pop();
    }
    match String::from_utf8(buf) {
        Ok(s) => Ok(Line::Command(s)),
        Err(_) => Ok(Line::Invalid),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Proves each reply kind is framed as RESP, and error text cannot break the framing.
    #[test]
    fn replies_are_resp_framed() {
        assert_eq!(Reply::Ok.encode(), b"+OK\r\n");
        assert_eq!(Reply::Null.encode(), b"$-1\r\n");
        assert_eq!(Reply::Bulk(b"{}".to_vec()).encode(), b"$2\r\n{}\r\n");
        assert_eq!(Reply::err("a\r\nb").encode(), b"-ERR a  b\r\n");
    }

    // Proves lines are split on LF (CR optional), and an endless line is refused, not buffered.
    #[tokio::test]
    async fn lines_are_bounded() {
        let mut r = tokio::io::BufReader::new(&b"PUSH {}\r\nINFO\nxxxxxxxxxxxxxxxxxxxx\n"[..]);
        assert_eq!(
            read_line(&mut r, 16).await.unwrap(),
            Line::Command("PUSH {}".into())
        );
        assert_eq!(
            read_line(&mut r, 16).await.unwrap(),
            Line::Command("INFO".into())
        );
        assert_eq!(read_line(&mut r, 16).await.unwrap(), Line::TooLong);
    }
}
