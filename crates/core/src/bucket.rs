//! The token bucket behind per-agent `rate` limits: pure arithmetic shared by every backend, so
//! they agree to the millisecond on when the next lease may start.

use crate::time::Timestamp;

/// Tokens within this of a whole number count as that whole number (float dust).
const TOKEN_EPSILON: f64 = 1e-9;

/// What the bucket holds when full: one second's worth, and never less than one lease.
pub fn capacity(rate: f64) -> f64 {
    rate.max(1.0)
}

/// The bucket brought up to `now`: its tokens and the instant they are counted at. A `now`
/// before the stored instant (another node's clock runs behind) adds nothing.
pub fn refill(
    rate: f64,
    tokens: Option<f64>,
    tokens_at: Option<Timestamp>,
    now: Timestamp,
) -> (f64, Timestamp) {
    let cap = capacity(rate);
    match (tokens, tokens_at) {
        (Some(tokens), Some(at)) if at >= now => (tokens.min(cap), at),
        (Some(tokens), Some(at)) => {
            let elapsed_s = (now.as_millis() - at.as_millis()) as f64 / 1000.0;
            ((tokens + rate * elapsed_s).min(cap), now)
        }
        _ => (cap, now),
    }
}

/// Whole tokens in a bucket holding `tokens`.
pub fn whole(tokens: f64) -> usize {
    (tokens + TOKEN_EPSILON).floor().max(0.0) as usize
}

/// The first millisecond after `at` at which a bucket holding `left` tokens then holds a whole
/// one, by the very arithmetic of [`refill`], so a claim made at that instant finds it.
pub fn next_token_at(rate: f64, left: f64, at: Timestamp) -> Timestamp {
    let missing = (1.0 - left).max(0.0);
    let guess = ((missing * 1000.0 / rate).floor() as i64).max(1);
    let mut wait_ms = guess;
    // The float estimate is at most a millisecond or two short; step until the refill agrees.
    while wait_ms < guess.saturating_add(4) {
        let later = Timestamp::from_millis(at.as_millis().saturating_add(wait_ms));
        if whole(refill(rate, Some(left), Some(at), later).0) >= 1 {
            break;
        }
        wait_ms += 1;
    }
    Timestamp::from_millis(at.as_millis().saturating_add(wait_ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    // Proves the bucket refills at `rate` per second up to one second's worth (at least one
    // token), and that a clock running behind the stored instant adds nothing.
    #[test]
    fn the_bucket_refills_and_caps() {
        let t = |ms: i64| Timestamp::from_millis(1_000_000 + ms);
        assert_eq!(refill(10.0, Some(0.0), Some(t(0)), t(100)), (1.0, t(100)));
        assert_eq!(
            refill(10.0, Some(0.0), Some(t(0)), t(5_000)),
            (10.0, t(5_000))
        );
        assert_eq!(
            refill(0.5, Some(0.0), Some(t(0)), t(10_000)),
            (1.0, t(10_000))
        );
        assert_eq!(refill(10.0, Some(3.0), Some(t(50)), t(0)), (3.0, t(50)));
        assert_eq!(refill(2.0, None, None, t(7)), (2.0, t(7)));
    }

    // Proves the next-token instant is the first millisecond at which a refill yields a whole
    // token, for rates that do and do not divide a second evenly.
    #[test]
    fn the_next_token_is_found_to_the_millisecond() {
        let t = |ms: i64| Timestamp::from_millis(1_000_000 + ms);
        assert_eq!(next_token_at(10.0, 0.0, t(0)), t(100));
        assert_eq!(next_token_at(10.0, 0.99, t(0)), t(1));
        assert_eq!(next_token_at(3.0, 0.0, t(0)), t(334));
        assert_eq!(next_token_at(0.5, 0.25, t(0)), t(1_500));
        assert_eq!(next_token_at(1_000_000.0, 0.0, t(0)), t(1));
        for (rate, left) in [(3.0, 0.1), (7.0, 0.3), (0.3, 0.0), (123.4, 0.77)] {
            let next = next_token_at(rate, left, t(0));
            let before = Timestamp::from_millis(next.as_millis() - 1);
            assert_eq!(
                whole(refill(rate, Some(left), Some(t(0)), next).0),
                1,
                "{rate} {left}"
            );
            if before > t(0) {
                assert_eq!(
                    whole(refill(rate, Some(left), Some(t(0)), before).0),
                    0,
                    "{rate} {left}"
                );
            }
        }
    }
}
