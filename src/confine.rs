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

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use nix::libc;

// The Landlock ABI (linux/landlock.h), file-system rights that change something.
const WRITE_FILE: u64 = 1 << 1;
const REMOVE_DIR: u64 = 1 << 4;
const REMOVE_FILE: u64 = 1 << 5;
const MAKE_CHAR: u64 = 1 << 6;
const MAKE_DIR: u64 = 1 << 7;
const MAKE_REG: u64 = 1 << 8;
const MAKE_SOCK: u64 = 1 << 9;
const MAKE_FIFO: u64 = 1 << 10;
const MAKE_BLOCK: u64 = 1 << 11;
const MAKE_SYM: u64 = 1 << 12;
/// ABI 2: linking or renaming a file into another directory.
const REFER: u64 = 1 << 13;
/// ABI 3: truncating a file without opening it for writing.
const TRUNCATE: u64 = 1 << 14;
const CREATE_RULESET_VERSION: u32 = 1;
const RULE_PATH_BENEATH: libc::c_int = 1;

#[repr(C)]
struct RulesetAttr {
    handled_access_fs: u64,
}

#[repr(C, packed)]
struct PathBeneathAttr {
    allowed_access: u64,
    parent_fd: i32,
}

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
pub fn forbid_writes(except: &[&Path]) -> Result<Confined, String> {
    // SAFETY: the version query takes no pointer.
    let abi = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<RulesetAttr>(),
            0usize,
            CREATE_RULESET_VERSION,
        )
    };
    if abi < 1 {
        return Err(os_error(
            "cannot use Landlock to confine file-system writes (the kernel lacks it, or a \
             system-call filter denies it)",
        ));
    }
    let mut handled = WRITE_FILE
        | REMOVE_DIR
        | REMOVE_FILE
        | MAKE_CHAR
        | MAKE_DIR
        | MAKE_REG
        | MAKE_SOCK
        | MAKE_FIFO
        | MAKE_BLOCK
        | MAKE_SYM;
    if abi >= 2 {
        handled |= REFER;
    }
    if abi >= 3 {
        handled |= TRUNCATE;
    }
    let attr = RulesetAttr {
        handled_access_fs: handled,
    };
    // SAFETY: attr is a valid ruleset attribute of the size passed.
    let ruleset = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            &attr as *const RulesetAttr,
            std::mem::size_of::<RulesetAttr>(),
            0u32,
        )
    };
    if ruleset < 0 {
        return Err(os_error("cannot make a Landlock ruleset"));
    }
    let ruleset = ruleset as libc::c_int;
    let result = confine(ruleset, abi, except);
    // SAFETY: ruleset is the descriptor made above, closed once.
    unsafe { libc::close(ruleset) };
    result
}

fn confine(ruleset: libc::c_int, abi: i64, except: &[&Path]) -> Result<Confined, String> {
    let mut writable = Vec::new();
    for path in except {
        let Ok(c_path) = CString::new(path.as_os_str().as_bytes()) else {
            continue;
        };
        // SAFETY: a NUL-terminated path; O_PATH opens nothing for reading or writing.
        let fd = unsafe { libc::open(c_path.as_ptr(), libc::O_PATH | libc::O_CLOEXEC) };
        if fd < 0 {
            continue; // absent here (e.g. no iptables-legacy lock): nothing to allow
        }
        let beneath = PathBeneathAttr {
            allowed_access: WRITE_FILE | if abi >= 3 { TRUNCATE } else { 0 },
            parent_fd: fd,
        };
        // SAFETY: beneath is a valid path-beneath attribute; fd is open.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_landlock_add_rule,
                ruleset,
                RULE_PATH_BENEATH,
                &beneath as *const PathBeneathAttr,
                0u32,
            )
        };
        let err = std::io::Error::last_os_error();
        // SAFETY: fd was opened above and is closed once.
        unsafe { libc::close(fd) };
        if rc != 0 {
            return Err(format!("cannot allow writes to {}: {err}", path.display()));
        }
        writable.push(path.display().to_string());
    }
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(os_error("cannot set no_new_privs"));
    }
    // SAFETY: ruleset is a Landlock ruleset descriptor.
    if unsafe { libc::syscall(libc::SYS_landlock_restrict_self, ruleset, 0u32) } != 0 {
        return Err(os_error("cannot confine file-system writes"));
    }
    Ok(Confined { abi, writable })
}

/// `what`, then the error of the system call that just failed.
fn os_error(what: &str) -> String {
    format!("{what}: {}", std::io::Error::last_os_error())
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
