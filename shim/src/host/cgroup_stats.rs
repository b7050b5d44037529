//! A VM image's stats from its host cgroup (QEMU's; no agent runs in the image to ask):
//! cgroup v2's files, read as the agent reads a container's cgroup in the guest
//! ([`vmlet_protocol::cgroup_stats`]), or, on a node whose controllers are cgroup v1 (also a
//! hybrid one), v1's files under v2's names, which containerd's cgroup v2 `Metrics` carry.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use vmlet_protocol::agent::StatsResponse;
use vmlet_protocol::cgroup_stats::{keyed, parse_limit, read_stats, ReadError};

use crate::Error;

/// v1's `memory.stat` keys (the hierarchical `total_` ones) under v2's names.
const V1_MEMORY_STAT: &[(&str, &str)] = &[
    ("total_rss", "anon"),
    ("total_cache", "file"),
    ("total_shmem", "shmem"),
    ("total_mapped_file", "file_mapped"),
    ("total_dirty", "file_dirty"),
    ("total_writeback", "file_writeback"),
    ("total_rss_huge", "anon_thp"),
    ("total_inactive_anon", "inactive_anon"),
    ("total_active_anon", "active_anon"),
    ("total_inactive_file", "inactive_file"),
    ("total_active_file", "active_file"),
    ("total_unevictable", "unevictable"),
    ("total_pgfault", "pgfault"),
    ("total_pgmajfault", "pgmajfault"),
];

/// v1's "no limit" is the largest page-aligned number; anything from 2^62 on is none (0).
const V1_NO_LIMIT: u64 = 1 << 62;

/// The figures of the cgroup whose directory in each hierarchy is one of `dirs`: where
/// the memory controller is (cgroup v2's `memory.current`, else v1's
/// `memory.usage_in_bytes`); without it, FAILED_PRECONDITION says so.
pub fn read(dirs: &[PathBuf]) -> Result<StatsResponse, Error> {
    let context = |e: ReadError| Error::io(format!("read {}", e.path.display()), e.source);
    let has = |file: &str| dirs.iter().find(|d| d.join(file).exists());
    if let Some(v2) = has("memory.current") {
        return read_stats(v2).map_err(context);
    }
    if has("memory.usage_in_bytes").is_some() {
        return read_v1(dirs).map_err(context);
    }
    Err(Error::FailedPrecondition(match dirs.first() {
        None => "no cgroup hierarchy is mounted on the node (/proc/self/mountinfo)".into(),
        Some(_) => format!(
            "the VM's cgroup has no memory controller (neither cgroup v2's memory.current nor v1's memory.usage_in_bytes in {})",
            dirs.iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }))
}

fn read_v1(dirs: &[PathBuf]) -> Result<StatsResponse, ReadError> {
    // Each file in the hierarchy of its controller; a missing controller's file is the
    // error of the first directory.
    let file = |name: &str| -> Result<String, ReadError> {
        let dir = dirs
            .iter()
            .find(|d| d.join(name).exists())
            .or(dirs.first())
            .map(PathBuf::as_path)
            .unwrap_or(Path::new("/sys/fs/cgroup"));
        vmlet_protocol::cgroup_stats::read(dir, name)
    };
    let limit = |text: &str| {
        Some(parse_limit(text))
            .filter(|l| *l < V1_NO_LIMIT)
            .unwrap_or(0)
    };
    let ticks = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .filter(|t| *t > 0)
        .unwrap_or(100) as u64;
    let cpuacct = keyed(&file("cpuacct.stat")?);
    let tick_usec = |key: &str| cpuacct.get(key).copied().unwrap_or(0) * 1_000_000 / ticks;
    let cpu_stat = HashMap::from([
        (
            "usage_usec".to_owned(),
            parse_limit(&file("cpuacct.usage")?) / 1000,
        ),
        ("user_usec".to_owned(), tick_usec("user")),
        ("system_usec".to_owned(), tick_usec("system")),
    ]);
    let v1_stat = keyed(&file("memory.stat")?);
    let memory_stat = V1_MEMORY_STAT
        .iter()
        .filter_map(|(v1, v2)| Some(((*v2).to_owned(), *v1_stat.get(*v1)?)))
        .collect();
    let oom = keyed(&file("memory.oom_control")?);
    let memory_events = oom
        .get("oom_kill")
        .map(|n| HashMap::from([("oom_kill".to_owned(), *n)]))
        .unwrap_or_default();
    Ok(StatsResponse {
        memory_current: parse_limit(&file("memory.usage_in_bytes")?),
        memory_max: limit(&file("memory.limit_in_bytes")?),
        memory_stat,
        memory_events,
        cpu_stat,
        pids_current: parse_limit(&file("pids.current")?),
        pids_max: parse_limit(&file("pids.max")?),
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str, files: &[(&str, &str)]) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("vmlet-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for (file, text) in files {
            std::fs::write(dir.join(file), text).unwrap();
        }
        dir
    }

    #[test]
    fn v1_controllers_are_read_from_their_hierarchies_under_v2_names() {
        let cpu = dir(
            "cpuacct",
            &[
                ("cpuacct.usage", "2500000000\n"),
                ("cpuacct.stat", "user 150\nsystem 50\n"),
            ],
        );
        let memory = dir(
            "memory",
            &[
                ("memory.usage_in_bytes", "104857600\n"),
                ("memory.limit_in_bytes", "9223372036854771712\n"),
                (
                    "memory.stat",
                    "cache 1\nrss 2\ntotal_cache 4096\ntotal_rss 8192\ntotal_inactive_file 1024\n",
                ),
                (
                    "memory.oom_control",
                    "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n",
                ),
            ],
        );
        let pids = dir("pids", &[("pids.current", "4\n"), ("pids.max", "max\n")]);
        let stats = read(&[cpu.clone(), memory.clone(), pids.clone()]).unwrap();
        for d in [cpu, memory, pids] {
            std::fs::remove_dir_all(d).unwrap();
        }
        assert_eq!(stats.cpu_stat["usage_usec"], 2_500_000);
        assert!(stats.cpu_stat["user_usec"] > stats.cpu_stat["system_usec"]);
        assert_eq!(stats.memory_current, 100 << 20);
        assert_eq!(stats.memory_max, 0, "no limit");
        assert_eq!(stats.memory_stat["file"], 4096);
        assert_eq!(stats.memory_stat["anon"], 8192);
        assert_eq!(stats.memory_stat["inactive_file"], 1024);
        assert_eq!(stats.memory_events["oom_kill"], 1);
        assert_eq!(stats.pids_current, 4);
    }

    #[test]
    fn a_missing_controller_is_named() {
        let cpu = dir(
            "cpuacct-only",
            &[("cpuacct.usage", "1\n"), ("cpuacct.stat", "")],
        );
        let err = read(std::slice::from_ref(&cpu)).unwrap_err();
        assert!(err.to_string().contains("no memory controller"), "{err}");
        std::fs::write(cpu.join("memory.usage_in_bytes"), "1\n").unwrap();
        let err = read(std::slice::from_ref(&cpu)).unwrap_err();
        std::fs::remove_dir_all(&cpu).unwrap();
        assert!(err.to_string().contains("memory.stat"), "{err}");
        let err = read(&[]).unwrap_err();
        assert!(err.to_string().contains("no cgroup hierarchy"), "{err}");
    }
}
