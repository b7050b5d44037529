//! The guest's wall clock, set from the host's ([`vmlet_protocol::agent::PingRequest`]'s
//! `host_realtime_ns`) once per boot: a guest restored from a template resumes with the
//! clock it was saved with, and a cold-booted one read the RTC only to the second.

use std::sync::atomic::{AtomicBool, Ordering};

use nix::sys::time::TimeSpec;
use nix::time::{clock_settime, ClockId};

use crate::Error;

/// Whether the clock has been set this boot.
#[derive(Default)]
pub struct GuestClock {
    set: AtomicBool,
}

impl GuestClock {
    /// Sets the guest's clock to `host_ns` (ns since the epoch) unless it is 0 or the clock
    /// was set before.
    pub fn set_once(&self, host_ns: u64) -> Result<(), Error> {
        self.set_once_with(host_ns, |time| {
            clock_settime(ClockId::CLOCK_REALTIME, time)
                .map_err(|e| Error::Boot(format!("set the guest's clock: {e}")))
        })
    }

    fn set_once_with(
        &self,
        host_ns: u64,
        set: impl FnOnce(TimeSpec) -> Result<(), Error>,
    ) -> Result<(), Error> {
        if host_ns == 0 || self.set.load(Ordering::Acquire) {
            return Ok(());
        }
        set(time_of(host_ns))?;
        self.set.store(true, Ordering::Release);
        Ok(())
    }
}

fn time_of(ns: u64) -> TimeSpec {
    const NS: u64 = 1_000_000_000;
    TimeSpec::new((ns / NS) as i64, (ns % NS) as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_first_ping_with_a_time_sets_the_clock() {
        let clock = GuestClock::default();
        let mut seen = Vec::new();
        clock.set_once_with(0, |_| panic!("0 is no time")).unwrap();
        clock
            .set_once_with(1_700_000_000_250_000_000, |t| {
                seen.push(t);
                Ok(())
            })
            .unwrap();
        clock
            .set_once_with(1_800_000_000_000_000_000, |_| panic!("set twice"))
            .unwrap();
        assert_eq!(seen, [TimeSpec::new(1_700_000_000, 250_000_000)]);
    }

    #[test]
    fn a_failed_set_is_tried_again_by_the_next_ping() {
        let clock = GuestClock::default();
        let err = clock
            .set_once_with(5, |_| Err(Error::Boot("EPERM".into())))
            .unwrap_err();
        assert!(err.to_string().contains("EPERM"));
        let mut again = false;
        clock
            .set_once_with(5, |_| {
                again = true;
                Ok(())
            })
            .unwrap();
        assert!(again);
    }
}
