//! No writes to the node's files: a Landlock ruleset (Linux 5.13 and later) that forbids
//! creating, removing, renaming and writing files anywhere except the few paths discovery's tools
//! write, for this process and every tool it runs.
//!
//! It stands in for the unit's `ProtectSystem=strict`, `ProtectKernelTunables=`,
//! `ProtectControlGroups=` and the like, which need a mount namespace of their own that costs
//! systemd 40-55 ms at every start (measured in the test containers), all of it inside a
//! takeover. The process stays uid 0 without `CAP_DAC_OVERRIDE`, so without this it could still
//! write every file root owns, `/proc/sys` and cgroupfs included. Reads are not confined: the
//! tools read the node's state.

use std::path::Path;

use landlock::{
    ABI, AccessFs, CompatLevel, Compatible, LandlockStatus, PathBeneath, PathFd, Ruleset,
    RulesetAttr, RulesetCreatedAttr, RulesetStatus,
};

/// The paths discovery's tools write: iptables-legacy's lock (`-w`, where kube-proxy made it),
/// and the null device.
const TOOLS_WRITE: [&str; 2] = ["/run/xtables.lock", "/dev/null"];

/// Confines the rest of the process's life, and says what it did. Called by `main` before
/// anything else starts: nothing the daemon does writes a file (the link and the listeners are
/// netlink and sockets), and a ruleset made later would not hold for threads already running.
pub fn whole_process() {
    let except: Vec<&Path> = TOOLS_WRITE.iter().map(Path::new).collect();
    match forbid_writes(&except) {
        Ok(c) => tracing::info!(
            landlock_abi = c.abi,
            writable = ?c.writable,
            "file-system writes confined"
        ),
        Err(e) => tracing::warn!("{e}; file-system writes are not confined"),
    }
}

/// What [`forbid_writes`] did.
#[derive(Debug, PartialEq, Eq)]
pub struct Confined {
    /// The kernel's Landlock ABI version.
    pub abi: i64,
    /// The paths still writable (those of `except` that exist).
    pub writable: Vec<String>,
}

/// Forbids every write to the file system for this process and its future children, except
/// writing (not creating) the existing files in `except`. Sets `no_new_privs` (Landlock needs it
/// without `CAP_SYS_ADMIN`). An error sentence when the kernel cannot do it: the caller logs it
/// and serves on.
///
/// The rights that change something as of Landlock's first ABI are required (a kernel without
/// them is left as it is, `no_new_privs` unset); linking or renaming into another directory
/// (ABI 2) and truncating without opening for writing (ABI 3) are handled where the kernel has
/// them.
pub fn forbid_writes(except: &[&Path]) -> Result<Confined, String> {
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(AccessFs::from_write(ABI::V1))
        .map_err(|_| {
            "cannot use Landlock to confine file-system writes (the kernel lacks it, or a \
             system-call filter denies it)"
                .to_string()
        })?
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(AccessFs::from_write(ABI::V3))
        .and_then(Ruleset::create)
        .map_err(|e| format!("cannot make a Landlock ruleset: {e}"))?;
    let mut writable = Vec::new();
    for path in except {
        // Absent here (e.g. no iptables-legacy lock): nothing to allow.
        let Ok(fd) = PathFd::new(path) else { continue };
        let rule = PathBeneath::new(fd, AccessFs::WriteFile | AccessFs::Truncate);
        ruleset = ruleset
            .add_rule(rule)
            .map_err(|e| format!("cannot allow writes to {}: {e}", path.display()))?;
        writable.push(path.display().to_string());
    }
    let status = ruleset
        .restrict_self()
        .map_err(|e| format!("cannot confine file-system writes: {e}"))?;
    match status.landlock {
        LandlockStatus::Available {
            effective_abi,
            kernel_abi,
        } if status.ruleset != RulesetStatus::NotEnforced => Ok(Confined {
            abi: kernel_abi.map_or(effective_abi as i64, i64::from),
            writable,
        }),
        _ => Err("cannot confine file-system writes".to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHILD: &str = "LOCALDNS_FALLBACK_CONFINE_TEST_DIR";

    /// The confinement lasts for the rest of a process's life, so the test runs again in a
    /// process of its own (this test binary, this test only), which confines itself and checks.
    #[test]
    fn a_confined_process_writes_nothing_but_what_it_was_allowed() {
        if let Some(dir) = std::env::var_os(CHILD) {
            let dir = Path::new(&dir);
            let allowed = dir.join("allowed");
            let confined = forbid_writes(&[&allowed, Path::new("/no/such/file")]).unwrap();
            assert_eq!(confined.writable, [allowed.display().to_string()]);
            std::fs::write(&allowed, "after").unwrap();
            assert!(std::fs::write(dir.join("other"), "after").is_err());
            assert!(std::fs::write(dir.join("new"), "x").is_err());
            assert!(std::fs::remove_file(dir.join("other")).is_err());
            assert!(std::fs::create_dir(dir.join("d")).is_err());
            // Nor the kernel's tunables, which uid 0 could otherwise write without capabilities
            // (opened for writing only, never written).
            let tunable = std::fs::OpenOptions::new()
                .write(true)
                .open("/proc/sys/kernel/core_pattern");
            assert!(tunable.is_err(), "{tunable:?}");
            // The tools it runs are confined too.
            let touched = std::process::Command::new("touch")
                .arg(dir.join("by-child"))
                .status()
                .unwrap();
            assert!(!touched.success());
            return;
        }
        let dir = std::env::temp_dir().join(format!("confine-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("allowed"), "before").unwrap();
        std::fs::write(dir.join("other"), "before").unwrap();
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "confine::tests::a_confined_process_writes_nothing_but_what_it_was_allowed",
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .env(CHILD, &dir)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success() && text.contains("1 passed"), "{text}");
        assert_eq!(
            std::fs::read_to_string(dir.join("allowed")).unwrap(),
            "after"
        );
        assert_eq!(
            std::fs::read_to_string(dir.join("other")).unwrap(),
            "before"
        );
        assert!(!dir.join("new").exists() && !dir.join("by-child").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
