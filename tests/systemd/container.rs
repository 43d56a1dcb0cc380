//! The test containers: two systemd generations, booted with systemd-nspawn from cached root
//! file systems, each in a cgroup of its own that teardown kills whole.

use super::*;

// ---------------------------------------------------------------------------------------------
// The two systemd generations
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Suite {
    Bookworm,
    Trixie,
}

impl Suite {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Suite::Bookworm => "bookworm",
            Suite::Trixie => "trixie",
        }
    }

    pub(crate) fn systemd(self) -> u32 {
        match self {
            Suite::Bookworm => 252,
            Suite::Trixie => 257,
        }
    }

    pub(crate) fn label(self) -> String {
        format!("{} (systemd {})", self.name(), self.systemd())
    }
}

/// The cached root file system of `suite`, built (once, under a lock) if missing or outdated.
pub(crate) fn rootfs(suite: Suite) -> PathBuf {
    static BUILT: [OnceLock<PathBuf>; 2] = [OnceLock::new(), OnceLock::new()];
    BUILT[suite as usize]
        .get_or_init(|| {
            let dir = Path::new(ROOTFS_CACHE).join(format!("rootfs-{}", suite.name()));
            let script = Path::new(MANIFEST_DIR).join("tests/systemd/build-rootfs.sh");
            let started = Instant::now();
            let out = Command::new(&script)
                .arg(suite.name())
                .arg(&dir)
                .stdin(Stdio::null())
                .output()
                .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
            assert!(
                out.status.success(),
                "{} {} failed ({}):\n{}{}",
                script.display(),
                suite.name(),
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            let note = String::from_utf8_lossy(&out.stderr);
            if !note.trim().is_empty() {
                eprintln!("{}(rootfs step took {:.1?})", note, started.elapsed());
            }
            dir
        })
        .clone()
}

// ---------------------------------------------------------------------------------------------
// Host requirements: fail loudly, never skip
// ---------------------------------------------------------------------------------------------

pub(crate) fn require_host() {
    // apt-get install systemd-container debootstrap util-linux bind9-dnsutils (tests/run.sh does).
    require_root_and_tools(&[
        "systemd-nspawn",
        "debootstrap",
        "nsenter",
        "dig",
        "flock",
        "rustc",
    ]);
    assert!(
        cgroup2_root().is_some(),
        "no cgroup2 hierarchy mounted (looked at /sys/fs/cgroup and /sys/fs/cgroup/unified): \
         each test container needs a cgroup of its own for teardown"
    );
}

/// The directory of this process's own cgroup in the cgroup2 hierarchy: `/sys/fs/cgroup` on a
/// unified host, `/sys/fs/cgroup/unified` on a hybrid one (like this sandbox, whose PID 1 is not
/// systemd). Containers get sub-cgroups of it.
pub(crate) fn cgroup2_root() -> Option<PathBuf> {
    let mount = ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
        .into_iter()
        .map(Path::new)
        .find(|m| m.join("cgroup.procs").exists() && m.join("cgroup.max.depth").exists())?;
    let own = fs::read_to_string("/proc/self/cgroup").ok()?;
    let rel = own.lines().find_map(|l| l.strip_prefix("0::"))?;
    Some(mount.join(rel.trim_start_matches('/')))
}

// ---------------------------------------------------------------------------------------------
// Time: CLOCK_MONOTONIC in microseconds, the clock systemd's *TimestampMonotonic values use
// (a container has no time namespace of its own), so poll samples and unit state changes compare.
// ---------------------------------------------------------------------------------------------

pub(crate) fn mono_us() -> u64 {
    let mut ts = nix::libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime only writes the timespec we pass.
    let rc = unsafe { nix::libc::clock_gettime(nix::libc::CLOCK_MONOTONIC, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_MONOTONIC)");
    ts.tv_sec as u64 * 1_000_000 + ts.tv_nsec as u64 / 1_000
}

pub(crate) fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

// ---------------------------------------------------------------------------------------------
// The container
// ---------------------------------------------------------------------------------------------

/// A booted test container: systemd as PID 1 in its own namespaces and cgroup. Dropping it kills
/// everything in the cgroup and removes what the boot left on the host.
pub(crate) struct Container {
    pub(crate) name: String,
    pub(crate) suite: Suite,
    pub(crate) boot: Boot,
    pub(crate) nspawn: Option<Child>,
    /// Host PID of the container's PID 1 (0 until known).
    pub(crate) leader: u32,
    /// Our cgroup2 directory for this container; nspawn and everything below it run in it.
    pub(crate) cgroup: PathBuf,
    /// The same path in the name=systemd v1 hierarchy, which nspawn mirrors on a hybrid host.
    pub(crate) cgroup_v1: PathBuf,
    /// The console log and the prober's samples (`out/`, bound into the container at /opt/out).
    pub(crate) tmp: TempDir,
    /// Tears the container down if this process dies without running Drop (see [`spawn_reaper`]).
    pub(crate) reaper: Option<Child>,
}

/// Options for [`Container::boot`]: the node as it was before `units/install.sh` ran, and what
/// an administrator did after.
#[derive(Clone, Copy)]
pub(crate) struct Boot {
    /// localdns.service already carries the node image's two lines (else install adds them).
    pub(crate) image_lines: bool,
    /// The standby unit runs, as install leaves it; false: an administrator's `systemctl disable
    /// --now`, which leaves the `OnFailure=` start alone to cover LocalDNS.
    pub(crate) standby: bool,
}

impl Default for Boot {
    fn default() -> Boot {
        Boot {
            image_lines: false,
            standby: true,
        }
    }
}

impl Boot {
    pub(crate) fn label(&self) -> String {
        format!(
            "{}, {}",
            if self.image_lines {
                "image's lines"
            } else {
                "lines added by install"
            },
            if self.standby {
                "standby"
            } else {
                "standby disabled"
            }
        )
    }
}

impl Container {
    /// Boots `suite` with systemd-nspawn, installs the stand-ins and our units inside
    /// (tests/systemd/setup.sh, which runs units/install.sh) and returns once the stand-in LocalDNS
    /// serves on both listeners.
    pub(crate) fn boot(suite: Suite, opts: Boot) -> Container {
        require_host();
        let rootfs = rootfs(suite);
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "{PREFIX}-{}-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed),
            suite.name()
        );
        let base = cgroup2_root().expect("checked by require_host");
        sweep_stale_cgroups(&base);
        let cgroup = base.join(&name);
        let rel = cgroup
            .strip_prefix(
                ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"]
                    .into_iter()
                    .find(|m| cgroup.starts_with(m))
                    .unwrap(),
            )
            .unwrap()
            .to_owned();
        let cgroup_v1 = Path::new("/sys/fs/cgroup/systemd").join(&rel);
        fs::create_dir(&cgroup)
            .unwrap_or_else(|e| panic!("cannot create cgroup {}: {e}", cgroup.display()));
        let tmp = TempDir::new(&format!("e2e-{}", suite.name()));
        let mut c = Container {
            name,
            suite,
            boot: opts,
            nspawn: None,
            leader: 0,
            cgroup,
            cgroup_v1,
            tmp,
            reaper: None,
        };
        fs::create_dir_all(c.tmp.path().join("out")).unwrap();
        c.reaper = Some(spawn_reaper(&c));
        let console = c.tmp.path().join("console.log");
        let log = fs::File::create(&console).unwrap();

        let mut cmd = Command::new("systemd-nspawn");
        cmd.args([
            "--quiet",
            "--boot",
            "--volatile=overlay",
            "--register=no",
            "--keep-unit",
        ])
        .arg(format!("--directory={}", rootfs.display()))
        .arg(format!("--machine={}", c.name))
        // Its own network namespace with only lo: the stand-ins add their links inside it.
        .arg("--private-network")
        .arg("--console=read-only")
        // nspawn's own system-call filter denies Landlock (systemd 252), with which the fallback
        // confines its file-system writes; a node has no such filter around its services.
        .arg(
            "--system-call-filter=landlock_create_ruleset landlock_add_rule landlock_restrict_self",
        )
        .arg(format!("--bind-ro={MANIFEST_DIR}/tests/systemd:/opt/test"))
        .arg(format!("--bind-ro={MANIFEST_DIR}/units:/opt/units"))
        .arg(format!("--bind-ro={}:/opt/bin/localdns-fallback", binary()))
        .arg(format!(
            "--bind-ro={}:/opt/bin/standin",
            standin().display()
        ))
        // The prober's samples, read by the test from the host side.
        .arg(format!(
            "--bind={}:/opt/out",
            c.tmp.path().join("out").display()
        ))
        // A pure cgroup2 tree inside, as on AKS nodes (and systemd 257 wants it), even where
        // the host is hybrid.
        .env("SYSTEMD_NSPAWN_UNIFIED_HIERARCHY", "1")
        // Several containers boot the same cached tree at once, each with its own overlay.
        .env("SYSTEMD_NSPAWN_LOCK", "0")
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log);
        // Move nspawn into the container's cgroup between fork and exec, so that nothing it starts
        // can escape the teardown. The file is opened before the fork; writing "0" moves the
        // writer.
        let procs = fs::OpenOptions::new()
            .write(true)
            .open(c.cgroup.join("cgroup.procs"))
            .unwrap();
        let procs_fd = std::os::fd::AsRawFd::as_raw_fd(&procs);
        // SAFETY: only an async-signal-safe call (write) between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                if nix::libc::write(procs_fd, b"0".as_ptr().cast(), 1) != 1 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        c.nspawn = Some(cmd.spawn().expect("cannot start systemd-nspawn"));
        drop(procs);

        // The container's PID 1 is nspawn's child: the process that is PID 1 in its own namespace.
        let nspawn_pid = c.nspawn.as_ref().unwrap().id();
        c.wait_until(
            "the container's PID 1 to appear",
            Duration::from_secs(20),
            |c| {
                c.assert_nspawn_alive();
                c.leader = container_leader(nspawn_pid).unwrap_or(0);
                c.leader != 0
            },
        );
        // systemctl fails until PID 1 listens on its private socket; then --wait blocks until boot
        // is done.
        c.wait_until(
            "systemd in the container to finish booting",
            Duration::from_secs(60),
            |c| {
                c.assert_nspawn_alive();
                let out = c.exec("systemctl is-system-running --wait");
                let state = String::from_utf8_lossy(&out.stdout).trim().to_owned();
                match state.as_str() {
                    "running" => true,
                    "degraded" => c.fail("the container booted degraded (a unit failed)"),
                    _ => false,
                }
            },
        );
        c.boot = opts;
        c.ok(&format!(
            "/opt/test/setup.sh {} {}",
            if opts.image_lines {
                "lines"
            } else {
                "no-lines"
            },
            if opts.standby {
                "standby"
            } else {
                "no-standby"
            }
        ));
        c.expect_answers(Who::LocalDns, "the stand-in LocalDNS serves after boot");
        c
    }

    pub(crate) fn assert_nspawn_alive(&mut self) {
        if let Some(status) = self.nspawn.as_mut().unwrap().try_wait().unwrap() {
            let console =
                fs::read_to_string(self.tmp.path().join("console.log")).unwrap_or_default();
            panic!(
                "systemd-nspawn for {} exited early ({status}); its output:\n{}",
                self.name,
                tail(&console, 60)
            );
        }
    }

    /// `nsenter` into every namespace of the container's PID 1, with a clean environment.
    pub(crate) fn nsenter(&self, namespaces: &[&str]) -> Command {
        assert!(self.leader != 0, "container {} has no PID 1 yet", self.name);
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--target={}", self.leader))
            .args(namespaces)
            .arg("--")
            .env_clear()
            .env(
                "PATH",
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            )
            .env("LANG", "C.UTF-8")
            .env("SYSTEMD_COLORS", "0")
            .env("SYSTEMD_PAGER", "")
            .stdin(Stdio::null());
        cmd
    }

    /// Runs a shell command inside the container (bounded: `timeout 60` inside).
    pub(crate) fn exec(&self, script: &str) -> Output {
        self.nsenter(&["--all"])
            .args(["timeout", "60", "/bin/sh", "-c", script])
            .output()
            .expect("cannot run nsenter")
    }

    /// [`exec`](Self::exec) that must succeed; returns stdout.
    pub(crate) fn ok(&self, script: &str) -> String {
        let out = self.exec(script);
        if !out.status.success() {
            self.fail(&format!(
                "`{script}` failed ({}):\nstdout: {}\nstderr: {}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// One property of a unit (`systemctl show -p PROP --value UNIT`).
    pub(crate) fn show(&self, unit: &str, prop: &str) -> String {
        self.ok(&format!("systemctl show -p {prop} --value {unit}"))
            .trim()
            .to_owned()
    }

    pub(crate) fn show_us(&self, unit: &str, prop: &str) -> u64 {
        let v = self.show(unit, prop);
        v.parse()
            .unwrap_or_else(|_| self.fail(&format!("{unit} {prop}={v:?} is not a number")))
    }

    /// A journal cursor: later reads can start after it.
    pub(crate) fn cursor(&self) -> String {
        let out = self.ok("journalctl --show-cursor -n 0 -q");
        out.lines()
            .find_map(|l| l.strip_prefix("-- cursor: "))
            .unwrap_or_else(|| self.fail(&format!("no cursor in {out:?}")))
            .to_owned()
    }

    /// Journal lines after `cursor`, with monotonic timestamps.
    pub(crate) fn journal_since(&self, cursor: &str) -> String {
        self.ok(&format!(
            "journalctl --sync; journalctl --no-pager -q -o short-monotonic --after-cursor='{cursor}'"
        ))
    }

    /// Panics with `msg`, the state of the units and the tail of the container's journal.
    pub(crate) fn fail(&self, msg: &str) -> ! {
        let status = self.exec(
            "systemctl status --no-pager -n 0 localdns.service localdns-fallback.service localdns-fallback-standby.service; ip -br addr show dev lo; \
             ip -br addr show dev localdns",
        );
        let journal = self.exec("journalctl --no-pager -q -o short-monotonic -n 80");
        panic!(
            "[{} {}] {msg}\n--- units ---\n{}{}\n--- journal tail ---\n{}",
            self.suite.label(),
            self.name,
            String::from_utf8_lossy(&status.stdout),
            String::from_utf8_lossy(&status.stderr),
            String::from_utf8_lossy(&journal.stdout)
        );
    }

    /// Polls `cond` every 50 ms until it holds; panics (with the journal) after `timeout`.
    pub(crate) fn wait_until(
        &mut self,
        what: &str,
        timeout: Duration,
        mut cond: impl FnMut(&mut Self) -> bool,
    ) {
        let deadline = Instant::now() + timeout;
        while !cond(self) {
            if Instant::now() > deadline {
                if self.leader == 0 {
                    let console =
                        fs::read_to_string(self.tmp.path().join("console.log")).unwrap_or_default();
                    panic!(
                        "timed out after {timeout:?} waiting for {what}; console:\n{}",
                        tail(&console, 60)
                    );
                }
                self.fail(&format!("timed out after {timeout:?} waiting for {what}"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Who answers `probe` right now.
    pub(crate) fn ask(&self, probe: Probe) -> Who {
        dig(self.leader, probe)
    }

    /// Waits until both probes are answered by `who`.
    pub(crate) fn expect_answers(&mut self, who: Who, what: &str) {
        self.expect_answers_on(&PROBES, who, what);
    }

    pub(crate) fn expect_answers_on(&mut self, probes: &[Probe], who: Who, what: &str) {
        let labels: Vec<&str> = probes.iter().map(|p| p.label).collect();
        self.wait_until(
            &format!("{what}: {who:?} answering {labels:?}"),
            Duration::from_secs(20),
            |c| probes.iter().all(|&p| c.ask(p) == who),
        );
    }

    /// `probes` answered by `who` at every ask for `window` (a change the daemon reads on a
    /// period, and which moves nothing it reports: it must keep answering through it).
    pub(crate) fn expect_answers_throughout(&self, probes: &[Probe], who: Who, window: Duration) {
        let end = Instant::now() + window;
        while Instant::now() < end {
            for &p in probes {
                let got = self.ask(p);
                if got != who {
                    self.fail(&format!("{} answered by {got:?}, not {who:?}", p.label));
                }
            }
        }
    }

    /// The listener addresses are on `lo` (while the fallback serves) or not (once it left).
    pub(crate) fn assert_listener_addresses_on_lo(&self, expected: bool, why: &str) {
        let out = self.ok("ip -o -4 addr show dev lo");
        let on_lo = ["169.254.10.10/32", "169.254.10.11/32"].map(|a| out.contains(a));
        if on_lo != [expected; 2] {
            self.fail(&format!(
                "{why}: listener addresses on lo should be {}: {out}",
                if expected { "present" } else { "gone" }
            ));
        }
    }

    /// Neither of our units is `failed` (and LocalDNS is not either unless `why` is a storm).
    pub(crate) fn assert_no_unit_failed(&self, why: &str) {
        for unit in [
            "localdns-fallback.service",
            "localdns-fallback-standby.service",
        ] {
            if self.is_failed(unit) {
                self.fail(&format!("{why}: {unit} is failed"));
            }
        }
    }

    /// `systemctl is-failed` says whether the unit's ActiveState is `failed`.
    pub(crate) fn is_failed(&self, unit: &str) -> bool {
        self.exec(&format!("systemctl is-failed --quiet {unit}"))
            .status
            .success()
    }

    pub(crate) fn link(&self) -> LinkState {
        let out = self.exec("ip -o link show dev localdns; ip -o -4 addr show dev localdns");
        LinkState::parse(&String::from_utf8_lossy(&out.stdout))
    }

    /// Makes every further start of the stand-in LocalDNS fail (`crash` or `graceful`, see
    /// tests/systemd/localdns.sh), or succeed again (`None`).
    pub(crate) fn set_localdns_failure(&self, mode: Option<&str>) {
        match mode {
            Some(m) => self.ok(&format!("echo {m} > /run/localdns-test/fail")),
            None => self.ok("rm -f /run/localdns-test/fail"),
        };
    }

    /// CoreDNS crashes (SIGKILL to the server only): LocalDNS's script sees it gone and exits 1,
    /// its EXIT trap deleting the link, as LocalDNS does.
    pub(crate) fn coredns_crash(&self) {
        self.ok("kill -KILL $(cat /run/localdns-test/coredns.pid)");
    }

    /// Crash storm: SIGKILL every process of the running LocalDNS (no EXIT trap runs), and let
    /// each automatic restart crash the same way until the start limit makes it `failed`.
    pub(crate) fn crash_storm(&self) {
        self.set_localdns_failure(Some("crash"));
        self.ok("systemctl kill --signal=SIGKILL localdns.service");
    }

    /// Recovery as an operator (or the node's repair) does it: clear the cause, reset-failed,
    /// start. Returns once LocalDNS is active (Type=notify: READY=1 sent).
    pub(crate) fn recover_localdns(&self) {
        self.set_localdns_failure(None);
        self.ok("systemctl reset-failed localdns.service && systemctl start localdns.service");
    }

    /// The unit that serves while LocalDNS does not: the standby, or where an administrator
    /// disabled it, the one `OnFailure=` starts.
    pub(crate) fn serving_unit(&self) -> &'static str {
        if self.boot.standby {
            "localdns-fallback-standby.service"
        } else {
            "localdns-fallback.service"
        }
    }

    /// Waits until LocalDNS is `failed` and the fallback answers both probes.
    pub(crate) fn wait_localdns_failed_and_served(&mut self) {
        self.wait_until(
            "localdns.service to reach `failed`",
            Duration::from_secs(40),
            |c| c.show("localdns.service", "ActiveState") == "failed",
        );
        self.expect_answers(Who::Fallback, "LocalDNS failed");
    }

    /// LocalDNS holds the flows again: the standby stands aside (still active) or the
    /// `OnFailure=` fallback stopped cleanly (inactive, not failed).
    pub(crate) fn assert_handed_back(&self, why: &str) {
        let unit = "localdns-fallback.service";
        let state = self.show(unit, "ActiveState");
        let result = self.show(unit, "Result");
        if state != "inactive" || result != "success" {
            self.fail(&format!(
                "{why}: expected {unit} inactive with Result=success, got {state}/{result}"
            ));
        }
        if self.boot.standby {
            let state = self.show("localdns-fallback-standby.service", "ActiveState");
            if state != "active" {
                self.fail(&format!("{why}: the standby is {state}, not active"));
            }
        }
        self.assert_listener_addresses_on_lo(false, why);
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        // Kill everything at once: nspawn, the container's PID 1 and all below (no graceful
        // poweroff: nothing in there is worth saving, and a wedged container must not hang us).
        let _ = fs::write(self.cgroup.join("cgroup.kill"), "1");
        if !self.cgroup.join("cgroup.kill").exists() {
            // Kernels before 5.14: SIGKILL every process, repeatedly, until none is left.
            for _ in 0..50 {
                let pids = cgroup_pids(&self.cgroup);
                if pids.is_empty() {
                    break;
                }
                for pid in pids {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid as i32),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        if let Some(mut child) = self.nspawn.take() {
            kill_and_reap(&mut child);
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while !cgroup_pids(&self.cgroup).is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        remove_cgroup_tree(&self.cgroup);
        remove_cgroup_tree(&self.cgroup_v1);
        // nspawn's per-machine directory on the host's /run (left behind when it is killed).
        let _ = fs::remove_dir(Path::new("/run/systemd/nspawn/propagate").join(&self.name));
        if let Some(mut reaper) = self.reaper.take() {
            kill_and_reap(&mut reaper);
        }
    }
}

/// A shell outside the container's cgroup that waits for end-of-file on a pipe only this process
/// holds open, then does what Drop does. Drop never runs when the test process is killed (a CI
/// timeout, ^C), and the container's PID 1 outlives nspawn; this catches that. Drop kills it.
pub(crate) fn spawn_reaper(c: &Container) -> Child {
    const SCRIPT: &str = r#"
        read -r _ || true
        echo 1 > "$1/cgroup.kill"
        for _ in $(seq 100); do grep -q '^populated 0' "$1/cgroup.events" && break; sleep 0.1; done
        find "$1" "$2" -depth -type d -exec rmdir {} + 2>/dev/null
        rmdir "/run/systemd/nspawn/propagate/$3" 2>/dev/null
        rm -rf "$4"
    "#;
    Command::new("/bin/sh")
        .args(["-c", SCRIPT, "reaper"])
        .arg(&c.cgroup)
        .arg(&c.cgroup_v1)
        .arg(&c.name)
        .arg(c.tmp.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("cannot start the teardown guard")
}

/// The host PID of the container's PID 1: the child of nspawn that is PID 1 in its namespace.
pub(crate) fn container_leader(nspawn_pid: u32) -> Option<u32> {
    let children =
        fs::read_to_string(format!("/proc/{nspawn_pid}/task/{nspawn_pid}/children")).ok()?;
    children
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .find(|pid: &u32| {
            fs::read_to_string(format!("/proc/{pid}/status"))
                .ok()
                .and_then(|s| {
                    s.lines()
                        .find(|l| l.starts_with("NSpid:"))
                        .map(str::to_owned)
                })
                .is_some_and(|l| {
                    l.split_whitespace().last() == Some("1") && l.split_whitespace().count() > 2
                })
        })
}

/// Every PID in a cgroup subtree.
pub(crate) fn cgroup_pids(dir: &Path) -> Vec<u32> {
    let mut pids: Vec<u32> = fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect();
    if let Ok(entries) = fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                pids.extend(cgroup_pids(&e.path()));
            }
        }
    }
    pids
}

/// rmdir a cgroup and its children, deepest first (cgroup directories go with rmdir only).
pub(crate) fn remove_cgroup_tree(dir: &Path) {
    if let Ok(entries) = fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_cgroup_tree(&e.path());
            }
        }
    }
    let _ = fs::remove_dir(dir);
}

/// Empty cgroups left by a test process that died before its Drop (and its reaper) ran. Names
/// carry the creating process's PID: a cgroup of a live test process (maybe just created, not
/// yet populated) is never touched.
pub(crate) fn sweep_stale_cgroups(base: &Path) {
    let Ok(entries) = fs::read_dir(base) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(owner) = name
            .strip_prefix(PREFIX)
            .and_then(|rest| rest.trim_start_matches('-').split('-').next())
        else {
            continue;
        };
        if Path::new("/proc").join(owner).exists() {
            continue;
        }
        if cgroup_pids(&e.path()).is_empty() {
            remove_cgroup_tree(&e.path());
            remove_cgroup_tree(&Path::new("/sys/fs/cgroup/systemd").join(&name));
        }
    }
}

pub(crate) fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

// ---------------------------------------------------------------------------------------------
// The link
// ---------------------------------------------------------------------------------------------

#[derive(Debug, PartialEq)]
pub(crate) struct LinkState {
    /// None: no link `localdns`.
    pub(crate) ifindex: Option<u32>,
    pub(crate) up: bool,
    pub(crate) addrs: Vec<String>,
}

impl LinkState {
    pub(crate) fn parse(out: &str) -> LinkState {
        let mut s = LinkState {
            ifindex: None,
            up: false,
            addrs: vec![],
        };
        for line in out.lines() {
            let mut words = line.split_whitespace();
            let index = words
                .next()
                .and_then(|w| w.trim_end_matches(':').parse().ok());
            if line.contains(" inet ") {
                let after = line.split(" inet ").nth(1).unwrap_or("");
                s.addrs
                    .extend(after.split_whitespace().next().map(str::to_owned));
            } else if index.is_some() {
                s.ifindex = index;
                s.up = line.contains(",UP") || line.contains("<UP");
            }
        }
        s.addrs.sort();
        s
    }

    pub(crate) fn complete(&self) -> bool {
        self.ifindex.is_some()
            && self.up
            && self.addrs == ["169.254.10.10/32".to_owned(), "169.254.10.11/32".to_owned()]
    }
}
