//! How long each phase of a task's create or start took. A [`Phases`] is marked as the work
//! goes (each mark closes the phase since the one before) and logged as one line:
//!
//! ```text
//! phases of create pod1 (ms): config=2 plan=1 host_setup=14 ... container=38 total=2603
//! ```
//!
//! `make bench-start` reads these lines from containerd's log and prints each phase's median
//! beside the floor's.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The word that starts every phases line (what `make bench-start` looks for).
pub const LINE_PREFIX: &str = "phases of";

pub struct Phases {
    what: String,
    started: Instant,
    marks: Mutex<Marks>,
}

struct Marks {
    last: Instant,
    done: Vec<(&'static str, Duration)>,
}

impl Phases {
    /// Starts the clock for `what` (`create ID`, `start ID`).
    pub fn start(what: impl Into<String>) -> Self {
        let now = Instant::now();
        Self {
            what: what.into(),
            started: now,
            marks: Mutex::new(Marks {
                last: now,
                done: Vec::new(),
            }),
        }
    }

    /// Closes `phase`: the time since the previous mark (or the start) is its.
    pub fn mark(&self, phase: &'static str) {
        let now = Instant::now();
        let mut marks = self.marks.lock().unwrap();
        let took = now - marks.last;
        marks.last = now;
        marks.done.push((phase, took));
    }

    /// The time since the start.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// How long `phase` took, if it was marked.
    pub fn took(&self, phase: &str) -> Option<Duration> {
        let marks = self.marks.lock().unwrap();
        marks
            .done
            .iter()
            .find(|(p, _)| *p == phase)
            .map(|(_, d)| *d)
    }

    /// The phases so far as one line, in milliseconds, with the total since the start.
    pub fn line(&self) -> String {
        let marks = self.marks.lock().unwrap();
        let mut line = format!("{LINE_PREFIX} {} (ms):", self.what);
        for (phase, took) in &marks.done {
            line.push_str(&format!(" {phase}={}", took.as_millis()));
        }
        line.push_str(&format!(" total={}", self.started.elapsed().as_millis()));
        line
    }

    /// Logs [`Phases::line`].
    pub fn log(&self) {
        log::info!("{}", self.line());
    }
}

/// Parses a [`Phases::line`] found in a log: `(what, [(phase, ms)])`, the total last.
pub fn parse(text: &str) -> Option<(String, Vec<(String, u64)>)> {
    let rest = &text[text.find(LINE_PREFIX)? + LINE_PREFIX.len()..];
    let (what, rest) = rest.split_once(" (ms):")?;
    let mut phases = Vec::new();
    for field in rest.split_whitespace() {
        let Some((phase, ms)) = field.split_once('=') else {
            break;
        };
        // A log line may end in a quote after the last number.
        let ms = ms.trim_end_matches(|c: char| !c.is_ascii_digit());
        phases.push((phase.to_owned(), ms.parse().ok()?));
    }
    Some((what.trim().to_owned(), phases))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_are_the_time_between_them_and_the_line_parses_back() {
        let phases = Phases::start("create pod1");
        std::thread::sleep(Duration::from_millis(20));
        phases.mark("config");
        phases.mark("plan");
        let line = phases.line();
        let logged = format!("time=\"...\" level=info msg=\"{line}\"");
        let (what, parsed) = parse(&logged).unwrap();
        assert_eq!(what, "create pod1");
        let names: Vec<&str> = parsed.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(names, ["config", "plan", "total"]);
        assert!(parsed[0].1 >= 20, "{line}");
        assert!(parsed[1].1 < 20, "{line}");
        assert!(parsed[2].1 >= parsed[0].1 + parsed[1].1, "{line}");
    }

    #[test]
    fn other_lines_are_not_phases() {
        assert_eq!(parse("pod p: torn down in 12 ms"), None);
        assert_eq!(parse("phases of create p (ms): config=x"), None);
    }
}
