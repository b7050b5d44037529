//! A minimal logger to the guest console (stderr of PID 1 is the kernel console).

use log::{LevelFilter, Metadata, Record};

struct ConsoleLogger;

impl log::Log for ConsoleLogger {
    fn enabled(&self, _: &Metadata) -> bool {
        true
    }

    fn log(&self, record: &Record) {
        if self.enabled(record.metadata()) {
            eprintln!("vmlet-agent {}: {}", record.level(), record.args());
        }
    }

    fn flush(&self) {}
}

pub fn init() {
    let level = std::fs::read_to_string("/proc/cmdline")
        .ok()
        .and_then(|c| {
            c.split_whitespace()
                .find_map(|w| w.strip_prefix("vmlet.log=").map(str::to_owned))
        })
        .and_then(|l| l.parse().ok())
        .unwrap_or(LevelFilter::Info);
    if log::set_logger(&ConsoleLogger).is_ok() {
        log::set_max_level(level);
    }
}
