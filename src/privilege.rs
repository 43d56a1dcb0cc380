//! Least privilege after start-up: once the listeners are bound and the link is in place, the
//! process keeps only the capabilities discovery still needs, and drops the rest from its bounding
//! set too, so the tools it runs (iptables, nft) cannot regain them.
//!
//! It stays root (uid 0) on purpose: iptables' lock file `/run/xtables.lock` and the Cilium agent's
//! socket are root's, and with every other capability gone root is just an owner of root's files.

use nix::libc;

pub const CAP_NET_ADMIN: u32 = 12;
pub const CAP_NET_RAW: u32 = 13;
/// The highest capability number this code knows; higher ones (future kernels) are dropped too.
const CAP_LAST_KNOWN: u32 = 63;
const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// Keeps exactly the capabilities in `keep` (effective and permitted), clears inheritable and
/// ambient ones, and removes every other capability from the bounding set.
pub fn keep_only(keep: &[u32]) -> Result<(), String> {
    // The bounding set first: dropping from it needs CAP_SETPCAP, which the capset below removes.
    // Capabilities the service manager already left out of it need no dropping.
    for cap in 0..=CAP_LAST_KNOWN {
        if keep.contains(&cap) {
            continue;
        }
        // SAFETY: prctl with integer arguments only; EINVAL for numbers the kernel does not know.
        match unsafe { libc::prctl(libc::PR_CAPBSET_READ, cap as libc::c_ulong, 0, 0, 0) } {
            0 => continue,
            1 => {}
            _ => break, // past the kernel's last capability
        }
        // SAFETY: as above.
        let rc = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) };
        if rc != 0 {
            let err = std::io::Error::last_os_error();
            return Err(format!(
                "cannot drop capability {cap} from the bounding set (is CAP_SETPCAP in it?): {err}"
            ));
        }
    }
    // SAFETY: prctl with integer arguments only.
    unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0,
            0,
            0,
        );
    }
    let mut data = [CapData::default(); 2];
    for &cap in keep {
        let (word, bit) = ((cap / 32) as usize, 1u32 << (cap % 32));
        data[word].effective |= bit;
        data[word].permitted |= bit;
    }
    let header = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    // SAFETY: capset reads a header and two data structs laid out as the kernel's
    // __user_cap_header_struct and __user_cap_data_struct (version 3).
    let rc = unsafe { libc::syscall(libc::SYS_capset, &header as *const CapHeader, data.as_ptr()) };
    if rc != 0 {
        return Err(format!(
            "cannot set capabilities: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

/// Capability names for the log.
pub fn names(caps: &[u32]) -> Vec<&'static str> {
    caps.iter()
        .map(|&c| match c {
            CAP_NET_ADMIN => "CAP_NET_ADMIN",
            CAP_NET_RAW => "CAP_NET_RAW",
            _ => "other",
        })
        .collect()
}
