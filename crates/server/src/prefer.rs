//! The `Prefer: return=minimal` request header (RFC 7240): a submit then answers each job's id
//! and state instead of the whole job, which for a batch of a thousand jobs is most of the work
//! of answering it (building, encoding and, on the client, decoding a thousand job views).

use axum::http::{HeaderMap, HeaderName, HeaderValue};
use axum::response::Response;

const PREFER: HeaderName = HeaderName::from_static("prefer");
const PREFERENCE_APPLIED: HeaderName = HeaderName::from_static("preference-applied");

/// Whether the request asks for `return=minimal`. Preferences are comma-separated and may come
/// in several `Prefer` headers; names and the `minimal` token match case-insensitively, and a
/// quoted value counts as the bare one. Anything not understood is ignored, as the RFC asks.
pub fn return_minimal(headers: &HeaderMap) -> bool {
    headers
        .get_all(PREFER)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|preference| {
            // Parameters after `;` qualify a preference; `return` takes none we know.
            let token = preference.split(';').next().unwrap_or_default();
            let Some((name, value)) = token.split_once('=') else {
                return false;
            };
            name.trim().eq_ignore_ascii_case("return")
                && value
                    .trim()
                    .trim_matches('"')
                    .eq_ignore_ascii_case("minimal")
        })
}

/// Marks `response` as answered minimally, so a client can tell a server that honoured the
/// preference from one that did not.
pub fn applied(mut response: Response) -> Response {
    response.headers_mut().insert(
        PREFERENCE_APPLIED,
        HeaderValue::from_static("return=minimal"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(values: &[&str]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for v in values {
            map.append(PREFER, HeaderValue::from_str(v).expect("header value"));
        }
        map
    }

    #[test]
    fn finds_return_minimal_among_other_preferences() {
        assert!(return_minimal(&headers(&["return=minimal"])));
        assert!(return_minimal(&headers(&[
            "respond-async, Return = \"Minimal\""
        ])));
        assert!(return_minimal(&headers(&[
            "wait=10",
            "return=minimal; x=1"
        ])));
    }

    #[test]
    fn anything_else_keeps_the_full_answer() {
        assert!(!return_minimal(&headers(&[])));
        assert!(!return_minimal(&headers(&["return=representation"])));
        assert!(!return_minimal(&headers(&["minimal", "return"])));
        assert!(!return_minimal(&headers(&["x-return=minimal"])));
    }
}
