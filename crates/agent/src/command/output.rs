//! What a program says: its stdout as the step's result, its stderr logged line by line with
//! progress lines passed on and the last bytes kept for the error message, and the lease fed to
//! its stdin.

use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tracing::{debug, info, warn};

use super::{PROGRESS_PREFIX, STDERR_LINE_MAX};
use crate::worker::StepContext;

/// The result of a successful run: stdout as JSON when it parses, else as a string without
/// its final line break; nothing at all is `null`.
pub fn parse_result(stdout: &[u8]) -> Value {
    let text = String::from_utf8_lossy(stdout);
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Value::Null;
    }
    if let Ok(value) = serde_json::from_str::<Value>(trimmed) {
        return value;
    }
    Value::String(text.trim_end_matches(['\n', '\r']).to_string())
}

/// Writes the lease to the program's stdin and closes it, so a program reading to the end
/// sees the end. A program that does not read stdin makes this fail quietly.
pub(super) async fn feed_stdin(stdin: Option<tokio::process::ChildStdin>, input: &[u8]) {
    if let Some(mut stdin) = stdin {
        if let Err(e) = stdin.write_all(input).await {
            debug!(error = %e, "the program did not read all of its stdin");
        }
    }
}

/// Reads stdout into `out` up to `limit` bytes; answers `true` as soon as it goes over.
pub(super) async fn read_bounded(
    stdout: Option<impl AsyncRead + Unpin>,
    out: &mut Vec<u8>,
    limit: usize,
) -> bool {
    let Some(mut stdout) = stdout else {
        return false;
    };
    let mut buf = [0u8; 8192];
    loop {
        match stdout.read(&mut buf).await {
            Ok(0) => return false,
            Ok(n) => {
                if out.len() + n > limit {
                    return true;
                }
                out.extend_from_slice(&buf[..n]);
            }
            Err(e) => {
                warn!(error = %e, "cannot read the program's stdout");
                return false;
            }
        }
    }
}

/// Logs the program's stderr line by line, keeps its last bytes for error messages, and hands
/// progress lines to the attempt's next heartbeat.
pub(super) async fn pass_stderr(
    stderr: Option<impl AsyncRead + Unpin>,
    tail: &mut Tail,
    ctx: &StepContext,
) {
    let Some(mut stderr) = stderr else { return };
    let mut buf = [0u8; 8192];
    let mut line: Vec<u8> = Vec::new();
    loop {
        let n = match stderr.read(&mut buf).await {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) => {
                warn!(error = %e, "cannot read the program's stderr");
                break;
            }
        };
        tail.push(&buf[..n]);
        for &byte in &buf[..n] {
            if byte == b'\n' || line.len() >= STDERR_LINE_MAX {
                // A progress line cut by the length limit is only logged.
                if byte == b'\n' {
                    report_progress(&line, ctx);
                }
                log_stderr_line(&line);
                line.clear();
                if byte == b'\n' {
                    continue;
                }
            }
            line.push(byte);
        }
    }
    if !line.is_empty() {
        report_progress(&line, ctx);
        log_stderr_line(&line);
    }
}

/// Sets the attempt's progress from a stderr line starting with [`PROGRESS_PREFIX`].
fn report_progress(line: &[u8], ctx: &StepContext) {
    let text = String::from_utf8_lossy(line);
    let Some(value) = text.trim_end_matches('\r').strip_prefix(PROGRESS_PREFIX) else {
        return;
    };
    let progress = serde_json::from_str(value.trim())
        .unwrap_or_else(|_| Value::String(value.trim().to_string()));
    ctx.set_progress(progress);
}

fn log_stderr_line(line: &[u8]) {
    let text = String::from_utf8_lossy(line);
    info!(target: "overseer_agent::command::stderr", "{}", text.trim_end_matches('\r'));
}

/// The last `cap` bytes written to it.
pub(super) struct Tail {
    cap: usize,
    bytes: Vec<u8>,
}

impl Tail {
    pub(super) fn new(cap: usize) -> Self {
        Tail {
            cap,
            bytes: Vec::new(),
        }
    }

    fn push(&mut self, data: &[u8]) {
        self.bytes.extend_from_slice(data);
        // Trim only once it doubles, so pushing is amortised constant per byte.
        if self.bytes.len() > self.cap.saturating_mul(2).max(1024) {
            let cut = self.bytes.len() - self.cap;
            self.bytes.drain(..cut);
        }
    }

    pub(super) fn into_string(mut self) -> String {
        let cut = self.bytes.len().saturating_sub(self.cap);
        let truncated = cut > 0;
        self.bytes.drain(..cut);
        let text = String::from_utf8_lossy(&self.bytes);
        let text = text.trim_end();
        if truncated {
            format!("…{text}")
        } else {
            text.to_string()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    // Proves stdout maps to JSON when it parses, to a string otherwise, and to null when empty.
    #[test]
    fn results_from_stdout() {
        assert_eq!(parse_result(b" {\"a\": 1}\n"), json!({"a": 1}));
        assert_eq!(parse_result(b"42\n"), json!(42));
        assert_eq!(parse_result(b"hello world\n"), json!("hello world"));
        assert_eq!(parse_result(b"  indented\r\n"), json!("  indented"));
        assert_eq!(parse_result(b"\n  \n"), Value::Null);
        assert_eq!(parse_result(b""), Value::Null);
    }

    // Proves the stderr tail keeps only the last bytes and marks the cut.
    #[test]
    fn tail_keeps_the_end() {
        let mut t = Tail::new(10);
        for _ in 0..1000 {
            t.push(b"0123456789");
        }
        t.push(b"the end\n");
        let s = t.into_string();
        assert_eq!(s, "…89the end");
        let mut t = Tail::new(100);
        t.push(b"short\n");
        assert_eq!(t.into_string(), "short");
    }
}
