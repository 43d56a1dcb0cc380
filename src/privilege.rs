//! Least privilege after start-up: once the listeners are bound and the link is in place, the
//! process keeps only the capabilities discovery still needs, and drops the rest from its bounding
//! set too, so the tools it runs (iptables, nft) cannot regain them.
//!
//! It stays root (uid 0) on purpose: iptables' lock file `/run/xtables.lock` and the Cilium agent's
//! socket are root's, and with every other capability gone root is just an owner of root's files.

use caps::{CapSet, Capability, CapsHashSet};

/// Keeps exactly the capabilities in `keep` (effective and permitted), clears inheritable and
/// ambient ones, and removes every other capability from the bounding set.
pub fn keep_only(keep: &[Capability]) -> Result<(), String> {
    let kept = |cap: &Capability| keep.contains(cap);
    // The bounding set first: dropping from it needs CAP_SETPCAP, which the sets below remove.
    // Capabilities the service manager already left out of it need no dropping.
    let bounding = caps::read(None, CapSet::Bounding)
        .map_err(|e| format!("cannot read the bounding set: {e}"))?;
    for cap in bounding.into_iter().filter(|cap| !kept(cap)) {
        caps::drop(None, CapSet::Bounding, cap).map_err(|e| {
            format!("cannot drop {cap} from the bounding set (is CAP_SETPCAP in it?): {e}")
        })?;
    }
    // A capability newer than the crate's list (above CAP_CHECKPOINT_RESTORE, 40) is dropped by
    // its number: a kernel that adds one must not leave it to the tools we run.
    let last: u64 = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(40);
    for n in 41..=last {
        // SAFETY: prctl with integer arguments only.
        if unsafe { nix::libc::prctl(nix::libc::PR_CAPBSET_DROP, n, 0, 0, 0) } != 0 {
            let e = std::io::Error::last_os_error();
            return Err(format!(
                "cannot drop capability {n} from the bounding set: {e}"
            ));
        }
    }
    // A kernel without ambient capabilities has none to clear.
    let _ = caps::clear(None, CapSet::Ambient);
    let keep: CapsHashSet = caps::all().into_iter().filter(kept).collect();
    // Effective first: the kernel takes no effective set beyond the permitted one.
    let sets = [
        (CapSet::Effective, keep.clone()),
        (CapSet::Permitted, keep),
        (CapSet::Inheritable, CapsHashSet::new()),
    ];
    for (set, value) in sets {
        caps::set(None, set, &value)
            .map_err(|e| format!("cannot set the {set:?} capabilities: {e}"))?;
    }
    Ok(())
}
