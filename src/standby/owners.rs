//! Who made LocalDNS's sockets, and what they do: read from the sockets' cgroups (v2), not over
//! netlink.

use crate::flows::Owners;

/// What the processes that made sockets of `cgroups` do: a thread running or waiting for a CPU
/// (state R: its unread queue is starvation or its slice's CPU quota, not a hang) or for the
/// machine (D: a page fault under memory pressure, a disk read; the probe judges one that lasts),
/// every thread
/// stopped (T: SIGSTOP), or else asleep. Found through the sockets' cgroups (v2; a cgroup id is
/// its directory's inode number), whose threads anyone may list and whose states anyone may
/// read: the standby keeps no capability to look into another process's descriptors. `paths`
/// keeps the directories found, by id. The root cgroup, or one not found (no cgroup mount, as
/// under `ip netns exec`), counts as asleep: the queue alone decides.
pub fn owners(cgroups: &[u64], paths: &mut Vec<(u64, std::path::PathBuf)>) -> Owners {
    let root = cgroup_root();
    let mut states = Vec::new();
    for &id in cgroups {
        if !paths.iter().any(|(i, _)| *i == id) {
            if let Some(p) = find_cgroup(&root, id) {
                paths.push((id, p));
            }
        }
        let Some((_, path)) = paths.iter().find(|(i, p)| *i == id && *p != root) else {
            return Owners::Asleep;
        };
        let threads = std::fs::read_to_string(path.join("cgroup.threads")).unwrap_or_default();
        for tid in threads.lines() {
            let stat = std::fs::read_to_string(format!("/proc/{}/stat", tid.trim()));
            if let Some(state) = stat
                .ok()
                .and_then(|s| s.rsplit_once(") ").map(|(_, r)| r.chars().next()))
            {
                states.extend(state);
            }
        }
    }
    if states.iter().any(|&c| c == 'R' || c == 'D') {
        Owners::Runnable
    } else if !states.is_empty() && states.iter().all(|&c| c == 'T' || c == 't') {
        Owners::Stopped
    } else {
        Owners::Asleep
    }
}

/// The cgroup v2 hierarchy (on a hybrid host, its `unified` mount).
pub fn cgroup_root() -> std::path::PathBuf {
    let v2 = std::path::Path::new("/sys/fs/cgroup");
    if v2.join("cgroup.controllers").exists() {
        v2.to_path_buf()
    } else {
        v2.join("unified")
    }
}

fn find_cgroup(dir: &std::path::Path, id: u64) -> Option<std::path::PathBuf> {
    use std::os::unix::fs::MetadataExt;
    if std::fs::metadata(dir).ok()?.ino() == id {
        return Some(dir.to_path_buf());
    }
    std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .find_map(|e| find_cgroup(&e.path(), id))
}
