//! containerd's cgroup v2 `Metrics` (what `ctr task metrics` and CRI's ContainerStats read)
//! from the agent's figures of a container's guest cgroup.

use std::collections::HashMap;

use containerd_shim_protos::cgroups_v2::metrics::{
    CPUStat, MemoryEvents, MemoryStat, Metrics, PidsStat,
};
use vmlet_protocol::agent::StatsResponse;

/// The type containerd registers for cgroup v2 metrics.
pub const TYPE_URL: &str = "io.containerd.cgroups.v2.Metrics";

pub fn from_agent(s: &StatsResponse) -> Metrics {
    let get = |map: &HashMap<String, u64>, key: &str| map.get(key).copied().unwrap_or(0);
    let m = |key: &str| get(&s.memory_stat, key);
    let c = |key: &str| get(&s.cpu_stat, key);
    let e = |key: &str| get(&s.memory_events, key);
    Metrics {
        pids: Some(PidsStat {
            current: s.pids_current,
            limit: s.pids_max,
            ..Default::default()
        })
        .into(),
        cpu: Some(CPUStat {
            usage_usec: c("usage_usec"),
            user_usec: c("user_usec"),
            system_usec: c("system_usec"),
            nr_periods: c("nr_periods"),
            nr_throttled: c("nr_throttled"),
            throttled_usec: c("throttled_usec"),
            ..Default::default()
        })
        .into(),
        memory: Some(MemoryStat {
            usage: s.memory_current,
            usage_limit: s.memory_max,
            anon: m("anon"),
            file: m("file"),
            kernel_stack: m("kernel_stack"),
            slab: m("slab"),
            sock: m("sock"),
            shmem: m("shmem"),
            file_mapped: m("file_mapped"),
            file_dirty: m("file_dirty"),
            file_writeback: m("file_writeback"),
            anon_thp: m("anon_thp"),
            inactive_anon: m("inactive_anon"),
            active_anon: m("active_anon"),
            inactive_file: m("inactive_file"),
            active_file: m("active_file"),
            unevictable: m("unevictable"),
            slab_reclaimable: m("slab_reclaimable"),
            slab_unreclaimable: m("slab_unreclaimable"),
            pgfault: m("pgfault"),
            pgmajfault: m("pgmajfault"),
            workingset_refault: m("workingset_refault"),
            workingset_activate: m("workingset_activate"),
            workingset_nodereclaim: m("workingset_nodereclaim"),
            pgrefill: m("pgrefill"),
            pgscan: m("pgscan"),
            pgsteal: m("pgsteal"),
            pgactivate: m("pgactivate"),
            pgdeactivate: m("pgdeactivate"),
            pglazyfree: m("pglazyfree"),
            pglazyfreed: m("pglazyfreed"),
            thp_fault_alloc: m("thp_fault_alloc"),
            thp_collapse_alloc: m("thp_collapse_alloc"),
            ..Default::default()
        })
        .into(),
        memory_events: Some(MemoryEvents {
            low: e("low"),
            high: e("high"),
            max: e("max"),
            oom: e("oom"),
            oom_kill: e("oom_kill"),
            ..Default::default()
        })
        .into(),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_land_in_their_fields() {
        let s = StatsResponse {
            memory_current: 10 << 20,
            memory_max: 64 << 20,
            memory_stat: [("anon", 4096u64), ("inactive_file", 8192)]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v))
                .collect(),
            memory_events: [("oom_kill".to_owned(), 1u64)].into_iter().collect(),
            cpu_stat: [("usage_usec".to_owned(), 1500u64)].into_iter().collect(),
            pids_current: 3,
            pids_max: 0,
            ..Default::default()
        };
        let m = from_agent(&s);
        assert_eq!(m.memory.usage, 10 << 20);
        assert_eq!(m.memory.usage_limit, 64 << 20);
        assert_eq!((m.memory.anon, m.memory.inactive_file), (4096, 8192));
        assert_eq!(m.memory_events.oom_kill, 1);
        assert_eq!(m.cpu.usage_usec, 1500);
        assert_eq!(m.pids.current, 3);
    }
}
