//! A cgroup v2 directory's figures as [`StatsResponse`] carries them. The agent reads a
//! container's cgroup in the guest; the shim reads a VM image's cgroup on the host, where
//! QEMU's use is the VM's (no agent runs in a VM image to ask).

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use crate::agent::StatsResponse;

/// The most read of one cgroup file (the largest, `memory.stat`, is a few KiB).
const MAX_FILE: u64 = 64 << 10;

/// A cgroup file that could not be read.
#[derive(Debug)]
pub struct ReadError {
    pub path: PathBuf,
    pub source: std::io::Error,
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "read {}: {}", self.path.display(), self.source)
    }
}

impl std::error::Error for ReadError {}

/// The figures of the cgroup v2 directory `dir`: memory and CPU use, memory events,
/// processes, and the limits (0: none).
pub fn read_stats(dir: &Path) -> Result<StatsResponse, ReadError> {
    let number = |name: &str| -> Result<u64, ReadError> { Ok(parse_limit(&read(dir, name)?)) };
    let map =
        |name: &str| -> Result<HashMap<String, u64>, ReadError> { Ok(keyed(&read(dir, name)?)) };
    Ok(StatsResponse {
        memory_current: number("memory.current")?,
        memory_max: number("memory.max")?,
        memory_stat: map("memory.stat")?,
        memory_events: map("memory.events")?,
        cpu_stat: map("cpu.stat")?,
        pids_current: number("pids.current")?,
        pids_max: number("pids.max")?,
        ..Default::default()
    })
}

/// A cgroup file of `dir`, at most [`MAX_FILE`] of it.
pub fn read(dir: &Path, name: &str) -> Result<String, ReadError> {
    let path = dir.join(name);
    let mut text = String::new();
    std::fs::File::open(&path)
        .and_then(|f| f.take(MAX_FILE).read_to_string(&mut text))
        .map_err(|source| ReadError { path, source })?;
    Ok(text)
}

/// A one-number file; `max` (no limit) and anything unreadable are 0.
pub fn parse_limit(text: &str) -> u64 {
    text.trim().parse().unwrap_or(0)
}

/// `key value` lines (memory.stat, cpu.stat, memory.events, cgroup.events).
pub fn keyed(text: &str) -> HashMap<String, u64> {
    text.lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(' ')?;
            Some((k.to_owned(), v.trim().parse().ok()?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keyed_files_and_limits_parse() {
        let m = keyed("anon 4096\nfile 8192\nbad\noom_kill 2\n");
        assert_eq!(m["anon"], 4096);
        assert_eq!(m["oom_kill"], 2);
        assert!(!m.contains_key("bad"));
        assert_eq!(parse_limit("max\n"), 0);
        assert_eq!(parse_limit("67108864\n"), 67108864);
    }

    #[test]
    fn a_cgroup_directory_is_read_whole_or_the_missing_file_named() {
        let dir = std::env::temp_dir().join(format!("vmlet-cgroup-stats-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for (name, text) in [
            ("memory.current", "1048576\n"),
            ("memory.max", "max\n"),
            ("memory.stat", "anon 4096\ninactive_file 512\n"),
            ("memory.events", "oom_kill 0\n"),
            ("cpu.stat", "usage_usec 1500\nuser_usec 1000\n"),
            ("pids.current", "3\n"),
        ] {
            std::fs::write(dir.join(name), text).unwrap();
        }
        let err = read_stats(&dir).unwrap_err();
        assert!(err.to_string().contains("pids.max"), "{err}");
        std::fs::write(dir.join("pids.max"), "max\n").unwrap();
        let stats = read_stats(&dir).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(stats.memory_current, 1 << 20);
        assert_eq!(stats.memory_max, 0);
        assert_eq!(stats.cpu_stat["usage_usec"], 1500);
        assert_eq!(stats.memory_stat["inactive_file"], 512);
        assert_eq!(stats.pids_current, 3);
    }
}
