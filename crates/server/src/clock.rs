//! Where the server gets the time. The core never reads a clock; the server passes `now` in, and
//! tests (and the simulator) can drive time by hand.

use std::sync::atomic::{AtomicI64, Ordering};

use overseer_core::{Span, Timestamp};

pub trait Clock: Send + Sync + 'static {
    fn now(&self) -> Timestamp;
}

/// The wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        let ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0);
        Timestamp::from_millis(ms)
    }
}

/// A clock that moves only when told to.
#[derive(Debug, Default)]
pub struct ManualClock(AtomicI64);

impl ManualClock {
    pub fn new(start: Timestamp) -> Self {
        ManualClock(AtomicI64::new(start.as_millis()))
    }

    pub fn advance(&self, by: Span) {
        self.0.fetch_add(by.as_millis_i64(), Ordering::SeqCst);
    }

    pub fn set(&self, to: Timestamp) {
        self.0.store(to.as_millis(), Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp::from_millis(self.0.load(Ordering::SeqCst))
    }
}
