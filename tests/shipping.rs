//! What a node-image build gets: the `.deb` that `cargo deb` makes, installed with the
//! real `dpkg` into a scratch copy of a real Debian 12 root file system (systemd 252), and
//! `units/install.sh --check` run on that tree, as an image pipeline would run it.
//!
//! The scratch root is an overlay: the root file system the systemd tests cache
//! (`tests/systemd/build-rootfs.sh`) is the read-only lower layer, and every change (dpkg's, and
//! the files these tests remove or break) lands in an upper directory of the test's own. The
//! overlay is mounted only inside a private mount namespace of each command the tests run
//! (`unshare --mount`), so no mount is ever visible on the host or outlives its command, even if
//! the test is killed; `Drop` removes the directories. The host's dpkg database is never opened:
//! `dpkg --root` uses the scratch root's own.
//!
//! The package is built once per `cargo deb` invocation in its own target directory
//! (`target/shipping`, so a nested cargo never waits on the lock of the `cargo test` running us),
//! under a file lock shared by the tests here; it is a no-op when nothing changed.

mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use common::{TempDir, require_root_and_tools};

const MANIFEST_DIR: &str = env!("CARGO_MANIFEST_DIR");
/// Where the systemd tests cache their Debian 12 root file system (see build-rootfs.sh).
const ROOTFS: &str = "/var/cache/localdns-fallback-tests/rootfs-bookworm";
/// The files the package must install, with their modes (the paths the units and LocalDNS use).
const INSTALLED: [(&str, u32); 6] = [
    ("opt/azure/containers/localdns/localdns-fallback", 0o755),
    (
        "etc/systemd/system/localdns-fallback-standby.service",
        0o644,
    ),
    (
        "opt/azure/containers/localdns/localdns-fallback-handoff",
        0o755,
    ),
    ("etc/systemd/system/localdns-fallback.service", 0o644),
    ("etc/systemd/system/localdns-fallback.path", 0o644),
    (
        "etc/systemd/system/localdns.service.d/50-localdns-fallback.conf",
        0o644,
    ),
];
const DROPIN: &str = "etc/systemd/system/localdns.service.d/50-localdns-fallback.conf";

fn require() {
    require_root_and_tools(&[
        "cargo-deb",
        "dpkg",
        "dpkg-deb",
        "unshare",
        "mount",
        "chroot",
        "systemd-analyze",
        "debootstrap",
        "flock",
        "git",
    ]);
}

/// Runs `cmd`, returns its output; panics if it cannot be started.
fn run(cmd: &mut Command) -> Output {
    cmd.stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

/// Runs `cmd` and panics with its output unless it succeeds.
fn run_ok(cmd: &mut Command) -> String {
    let out = run(cmd);
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The `.deb`, built by `cargo deb` (the README's command) from this source tree.
fn package() -> PathBuf {
    let target = Path::new(MANIFEST_DIR).join("target/shipping");
    fs::create_dir_all(&target).expect("create target/shipping");
    let deb = target.join("localdns-fallback.deb");
    let fresh = target.join(format!("localdns-fallback.deb.{}", std::process::id()));
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    // flock: the tests of this file run as parallel processes and share one build.
    run_ok(
        Command::new("flock")
            .arg(target.join("build.lock"))
            .arg(cargo)
            .args(["deb", "--locked", "--output"])
            .arg(&fresh)
            .current_dir(MANIFEST_DIR)
            .env("CARGO_TARGET_DIR", &target),
    );
    // Renamed into place: another test's dpkg reading the previous one keeps reading it whole.
    fs::rename(&fresh, &deb).expect("rename the package into place");
    deb
}

/// Builds the cached Debian 12 root file system once (under build-rootfs.sh's own lock) if missing.
fn ensure_rootfs() {
    run_ok(
        Command::new(Path::new(MANIFEST_DIR).join("tests/systemd/build-rootfs.sh"))
            .arg("bookworm")
            .arg(ROOTFS),
    );
}

/// A writable scratch copy of a node image: Debian 12 with a stand-in `localdns.service` (the
/// systemd tests' one, shaped like AKS's), as an image is before our package goes in.
struct ScratchRoot {
    dir: TempDir,
}

impl ScratchRoot {
    fn new() -> ScratchRoot {
        ensure_rootfs();
        let dir = TempDir::new("ship");
        for sub in ["upper", "work", "root"] {
            fs::create_dir(dir.path().join(sub)).expect("create overlay directories");
        }
        let root = ScratchRoot { dir };
        let standins = Path::new(MANIFEST_DIR).join("tests/systemd");
        root.sh(
            "install -m 0644 \"$1/localdns.service\" \"$1/localdns.slice\" \"$ROOT/etc/systemd/system/\" \
             && install -D -m 0755 \"$1/localdns.sh\" \"$ROOT/opt/azure/containers/localdns/localdns.sh\"",
            &[standins.to_str().expect("utf-8 path")],
        )
        .assert_ok();
        root
    }

    /// The root as the commands see it (the overlay is mounted there only inside each command).
    fn path(&self) -> PathBuf {
        self.dir.path().join("root")
    }

    /// Runs a shell snippet with the overlay mounted at $ROOT, in a mount namespace of its own;
    /// `args` are $1, $2, ...
    fn sh(&self, script: &str, args: &[&str]) -> Ran {
        let d = self.dir.path();
        let options = format!(
            "lowerdir={ROOTFS},upperdir={},workdir={}",
            d.join("upper").display(),
            d.join("work").display()
        );
        let wrapper =
            format!("mount -t overlay overlay -o \"$OPTIONS\" \"$ROOT\" || exit 99\n{script}");
        let out = run(Command::new("unshare")
            .args(["--mount", "--propagation", "private", "--", "bash", "-c"])
            .arg(wrapper)
            .arg("scratch-root")
            .args(args)
            .env("ROOT", self.path())
            .env("OPTIONS", options));
        Ran {
            what: script.to_owned(),
            out,
        }
    }

    /// `dpkg --install` of the package into this root, without a terminal (as an image
    /// pipeline runs it).
    fn dpkg(&self, deb: &Path) -> Ran {
        self.sh(
            "dpkg --root=\"$ROOT\" --install \"$1\" </dev/null",
            &[deb.to_str().expect("utf-8 path")],
        )
    }

    fn dpkg_install(&self, deb: &Path) {
        self.dpkg(deb).assert_ok();
    }

    /// `units/install.sh ARGS --root $ROOT`.
    fn install_sh(&self, args: &[&str]) -> Ran {
        let script = Path::new(MANIFEST_DIR).join("units/install.sh");
        let mut all = vec![script.to_str().expect("utf-8 path")];
        all.extend_from_slice(args);
        self.sh(
            "script=$1; shift; \"$script\" \"$@\" --root \"$ROOT\"",
            &all,
        )
    }

    /// Installs this test build's binary with `units/install.sh`.
    fn install(&self) -> Ran {
        self.install_sh(&["--binary", env!("CARGO_BIN_EXE_localdns-fallback")])
    }

    fn uninstall(&self) -> Ran {
        self.install_sh(&["--uninstall"])
    }

    fn check(&self) -> Ran {
        self.install_sh(&["--check"])
    }
}

/// A finished command's output, with what it was for messages.
struct Ran {
    what: String,
    out: Output,
}

impl Ran {
    fn text(&self) -> String {
        format!(
            "{}{}",
            String::from_utf8_lossy(&self.out.stdout),
            String::from_utf8_lossy(&self.out.stderr)
        )
    }
    fn assert_ok(&self) -> &Ran {
        assert!(
            self.out.status.success(),
            "`{}` failed ({}):\n{}",
            self.what,
            self.out.status,
            self.text()
        );
        self
    }
    /// Asserts the command failed (not merely could not mount: exit 99) and said `needle`.
    fn assert_fails_naming(&self, needle: &str) {
        let code = self.out.status.code();
        assert!(
            code != Some(0) && code != Some(99),
            "`{}` should have failed naming {needle:?} ({}):\n{}",
            self.what,
            self.out.status,
            self.text()
        );
        assert!(
            self.text().contains(needle),
            "`{}` failed but did not name {needle:?}:\n{}",
            self.what,
            self.text()
        );
    }
}

/// The short hash of HEAD, as `git rev-parse --short` prints it.
fn head_commit() -> String {
    run_ok(Command::new("git").args(["-C", MANIFEST_DIR, "rev-parse", "--short", "HEAD"]))
        .trim()
        .to_owned()
}

#[test]
fn the_package_installs_into_a_node_image_and_passes_the_check() {
    require();
    let deb = package();

    // Nothing runs at install: the package has no maintainer scripts at all.
    let info = run_ok(Command::new("dpkg-deb").arg("--info").arg(&deb));
    for script in ["preinst", "postinst", "prerm", "postrm", "config"] {
        assert!(
            !info.contains(script),
            "the package has a {script}:\n{info}"
        );
    }

    let root = ScratchRoot::new();
    root.dpkg_install(&deb);
    let listed = root
        .sh("dpkg --root=\"$ROOT\" --listfiles localdns-fallback", &[])
        .assert_ok()
        .text();
    for (path, mode) in INSTALLED {
        assert!(
            listed.lines().any(|l| l == format!("/{path}")),
            "dpkg does not list /{path}:\n{listed}"
        );
        let stat = root
            .sh("stat -c %a \"$ROOT/$1\"", &[path])
            .assert_ok()
            .text();
        assert_eq!(stat.trim(), format!("{mode:o}"), "mode of /{path}");
    }

    let checked = root.check();
    checked.assert_ok();
    assert!(checked.text().contains("check OK"), "{}", checked.text());

    // The packaged binary runs on the image's own C library and names this commit.
    let version = root
        .sh("chroot \"$ROOT\" /$1 --version", &[INSTALLED[0].0])
        .assert_ok()
        .text();
    assert!(
        version.contains(&format!("(commit {}", head_commit())),
        "{version}"
    );

    // Purging takes every file back out (the units are conffiles, so --remove alone keeps them).
    root.sh("dpkg --root=\"$ROOT\" --purge localdns-fallback", &[])
        .assert_ok();
    for (path, _) in INSTALLED {
        root.sh("! test -e \"$ROOT/$1\"", &[path]).assert_ok();
    }
    root.check().assert_fails_naming(&format!(
        "missing: {}/{}",
        root.path().display(),
        INSTALLED[0].0
    ));
}

#[test]
fn the_check_names_a_removed_file_and_a_wrong_mode() {
    require();
    let deb = package();
    let root = ScratchRoot::new();
    root.dpkg_install(&deb);
    root.check().assert_ok();

    for (path, mode) in INSTALLED {
        let full = format!("{}/{path}", root.path().display());
        root.sh("mv \"$ROOT/$1\" \"$ROOT/$1.away\"", &[path])
            .assert_ok();
        root.check()
            .assert_fails_naming(&format!("missing: {full}"));
        root.sh("mv \"$ROOT/$1.away\" \"$ROOT/$1\"", &[path])
            .assert_ok();

        let wrong = if mode == 0o644 { "0600" } else { "0700" };
        root.sh("chmod \"$2\" \"$ROOT/$1\"", &[path, wrong])
            .assert_ok();
        root.check()
            .assert_fails_naming(&format!("wrong mode: {full} is {wrong}, must be 0{mode:o}"));
        root.sh("chmod \"$2\" \"$ROOT/$1\"", &[path, &format!("{mode:o}")])
            .assert_ok();
    }
    // A binary that is there but not executable is named as such.
    root.sh("chmod 0644 \"$ROOT/$1\"", &[INSTALLED[0].0])
        .assert_ok();
    root.check().assert_fails_naming("not executable");
    root.sh("chmod 0755 \"$ROOT/$1\"", &[INSTALLED[0].0])
        .assert_ok();
    root.check().assert_ok();
}

#[test]
fn the_check_requires_every_directive_of_the_drop_in() {
    require();
    let deb = package();
    let root = ScratchRoot::new();
    root.dpkg_install(&deb);

    // Every directive the drop-in in units/ has: removing any one of them from the installed
    // drop-in must fail the check, naming it. So install.sh's list of directives cannot fall behind.
    let source = fs::read_to_string(
        Path::new(MANIFEST_DIR)
            .join("units")
            .join(DROPIN.trim_start_matches("etc/systemd/system/")),
    )
    .expect("read the drop-in");
    let directives: Vec<&str> = source
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#') && !l.starts_with('['))
        .collect();
    assert!(
        directives.iter().any(|d| d.starts_with("ExecStopPost=")),
        "the drop-in has no ExecStopPost= (the start on failure): {directives:?}"
    );
    for directive in directives {
        root.sh(
            "cp \"$ROOT/$1\" \"$ROOT/$1.orig\" && grep -vxF \"$2\" \"$ROOT/$1.orig\" >\"$ROOT/$1\"",
            &[DROPIN, directive],
        )
        .assert_ok();
        root.check().assert_fails_naming(directive);
        root.sh("mv \"$ROOT/$1.orig\" \"$ROOT/$1\"", &[DROPIN])
            .assert_ok();
    }
    root.check().assert_ok();
}

/// The drop-in replaces LocalDNS's ExecStopPost= list (the fallback's start first, then LocalDNS's
/// own cleanup, restated): on a node whose LocalDNS has any other ExecStopPost=, install.sh must
/// refuse to install and --check must fail, naming it, rather than drop or change LocalDNS's own.
#[test]
fn install_and_check_refuse_a_localdns_whose_stop_post_the_drop_in_does_not_restate() {
    require();
    let deb = package();
    let unit = "etc/systemd/system/localdns.service";
    let theirs = "etc/systemd/system/localdns.service.d/10-theirs.conf";
    for (what, change) in [
        (
            "another cleanup command",
            format!("sed -i 's/^ExecStopPost=.*/& --all/' \"$ROOT/{unit}\""),
        ),
        (
            "a second command from a drop-in of LocalDNS's own",
            format!(
                "mkdir -p \"$(dirname \"$ROOT/{theirs}\")\" && \
                 printf '[Service]\\nExecStopPost=/bin/true\\n' >\"$ROOT/{theirs}\""
            ),
        ),
    ] {
        let root = ScratchRoot::new();
        root.sh(&change, &[]).assert_ok();
        root.install()
            .assert_fails_naming("LocalDNS's own ExecStopPost=");
        root.sh("test ! -e \"$ROOT/$1\"", &[DROPIN]).assert_ok();
        root.dpkg_install(&deb);
        root.check()
            .assert_fails_naming("LocalDNS's own ExecStopPost=");
        eprintln!("{what}: install refused, check failed");
    }
    // A drop-in of LocalDNS's own that restates the same list changes nothing.
    let root = ScratchRoot::new();
    root.sh(
        &format!(
            "mkdir -p \"$(dirname \"$ROOT/{theirs}\")\" && printf \
             '[Service]\\nExecStopPost=\\nExecStopPost=/opt/azure/containers/localdns/localdns.sh cleanup\\n' \
             >\"$ROOT/{theirs}\""
        ),
        &[],
    )
    .assert_ok();
    root.install().assert_ok();
    root.check().assert_ok();
}

/// The node image's own wiring (`OnFailure=localdns-fallback.service` and an `ExecStartPre=` that
/// stops it, in LocalDNS's unit): `install.sh --wiring on-failure` installs only the binary and our
/// units, refuses a LocalDNS unit that lacks either line (naming it), and `--check` agrees;
/// `--standby` enables the standby unit the way `systemctl enable` does, and uninstall removes it;
/// without `--wiring`, a LocalDNS unit with both lines gets exactly that.
#[test]
fn the_on_failure_wiring_installs_only_our_units_and_needs_both_lines_of_localdns() {
    require();
    let binary = env!("CARGO_BIN_EXE_localdns-fallback");
    let unit = "etc/systemd/system/localdns.service";
    let on_failure =
        "sed -i 's/^\\[Unit\\]$/&\\nOnFailure=localdns-fallback.service/' \"$ROOT/$1\"";
    let stop_pre = "sed -i 's/^\\[Service\\]$/&\\nExecStartPre=-\\/usr\\/bin\\/systemctl stop localdns-fallback.service/' \"$ROOT/$1\"";
    let wiring = ["--wiring", "on-failure"];

    // Neither line, then only one: refused, each missing line named, nothing installed.
    let root = ScratchRoot::new();
    let mut args = vec!["--binary", binary];
    args.extend_from_slice(&wiring);
    root.install_sh(&args)
        .assert_fails_naming("no OnFailure=localdns-fallback.service");
    root.sh(on_failure, &[unit]).assert_ok();
    root.install_sh(&args)
        .assert_fails_naming("no ExecStartPre= that stops localdns-fallback.service");
    root.sh("test ! -e \"$ROOT/$1\"", &[INSTALLED[0].0])
        .assert_ok();

    // Both lines: installed, exactly our binary and units, no drop-in; the check agrees.
    root.sh(stop_pre, &[unit]).assert_ok();
    let mut with_standby = args.clone();
    with_standby.push("--standby");
    root.install_sh(&with_standby).assert_ok();
    let mut check = vec!["--check", "--standby"];
    check.extend_from_slice(&wiring);
    root.install_sh(&check).assert_ok();
    for (path, _) in INSTALLED {
        let present = root
            .sh("test -e \"$ROOT/$1\"", &[path])
            .out
            .status
            .success();
        let ours = !path.contains("handoff") && !path.ends_with(".path") && path != DROPIN;
        assert_eq!(
            present, ours,
            "{path}: installed {present}, expected {ours}"
        );
    }
    root.sh(
        "test \"$(readlink \"$ROOT/$1\")\" = /etc/systemd/system/localdns-fallback-standby.service",
        &["etc/systemd/system/multi-user.target.wants/localdns-fallback-standby.service"],
    )
    .assert_ok();
    // The drop-in wiring's check fails on this tree (no drop-in), naming what is missing.
    root.install_sh(&["--check", "--wiring", "drop-in"])
        .assert_fails_naming("missing:");
    // Uninstall removes what either wiring installed, the standby's enablement too.
    root.uninstall().assert_ok();
    for (path, _) in INSTALLED {
        root.sh("test ! -e \"$ROOT/$1\"", &[path]).assert_ok();
    }
    root.sh(
        "test ! -e \"$ROOT/$1\"",
        &["etc/systemd/system/multi-user.target.wants/localdns-fallback-standby.service"],
    )
    .assert_ok();

    // No --wiring: the node as it is. This LocalDNS carries both lines: the on-failure wiring
    // with the standby unit, and the plain --check agrees.
    root.install().assert_ok();
    root.check().assert_ok();
    root.sh("test ! -e \"$ROOT/$1\"", &[DROPIN]).assert_ok();
    root.sh(
        "test -L \"$ROOT/$1\"",
        &["etc/systemd/system/multi-user.target.wants/localdns-fallback-standby.service"],
    )
    .assert_ok();
}

/// Some AKS images ship a `localdns-fallback.service` of their own (NAT redirects of the listener
/// addresses, applied by `localdns-fallback.sh`). install.sh must not overwrite it, --uninstall
/// must not remove it, and --check must name it, also after the `.deb` went in.
#[test]
fn another_fallbacks_unit_of_the_same_name_is_neither_overwritten_nor_removed() {
    require();
    let deb = package();
    let theirs = "[Unit]\nDescription=Localdns DNS fallback (NAT redirects)\n[Service]\n\
                  Type=oneshot\nRemainAfterExit=yes\n\
                  ExecStart=/opt/azure/containers/localdns/localdns-fallback.sh apply\n\
                  ExecStop=/opt/azure/containers/localdns/localdns-fallback.sh clear\n";
    let put_theirs = "printf \"$1\" >\"$ROOT/etc/systemd/system/localdns-fallback.service\"";
    let still_theirs = "grep -qx 'ExecStart=/opt/azure/containers/localdns/localdns-fallback.sh apply' \
                        \"$ROOT/etc/systemd/system/localdns-fallback.service\"";

    let root = ScratchRoot::new();
    root.sh(put_theirs, &[theirs]).assert_ok();
    root.install()
        .assert_fails_naming("another fallback's unit");
    root.sh(still_theirs, &[]).assert_ok();
    root.sh("test ! -e \"$ROOT/$1\"", &[DROPIN]).assert_ok();
    root.check().assert_fails_naming("another fallback's unit");

    // Ours was installed, then theirs took the unit's path: uninstall removes ours only.
    let root = ScratchRoot::new();
    root.install().assert_ok();
    root.sh(put_theirs, &[theirs]).assert_ok();
    root.uninstall().assert_ok();
    root.sh(still_theirs, &[]).assert_ok();
    root.sh("test ! -e \"$ROOT/$1\"", &[DROPIN]).assert_ok();

    // Our unit is a conffile of the .deb (it lives under /etc): dpkg finds a file it does not own
    // there and asks what to do, so a run without a terminal stops with an error and keeps
    // theirs; the check then names it.
    let root = ScratchRoot::new();
    root.sh(put_theirs, &[theirs]).assert_ok();
    let dpkg = root.dpkg(&deb);
    assert!(
        !dpkg.out.status.success() && dpkg.text().contains("conffile prompt"),
        "dpkg should stop at the conffile prompt:\n{}",
        dpkg.text()
    );
    root.sh(still_theirs, &[]).assert_ok();
    root.check().assert_fails_naming("another fallback's unit");
}

#[test]
fn the_package_and_install_sh_install_the_same_files() {
    require();
    let deb = package();
    let from_deb = TempDir::new("ship-deb");
    run_ok(
        Command::new("dpkg-deb")
            .arg("-x")
            .arg(&deb)
            .arg(from_deb.path()),
    );
    let from_script = TempDir::new("ship-script");
    run_ok(
        Command::new(Path::new(MANIFEST_DIR).join("units/install.sh"))
            .arg("--binary")
            .arg(env!("CARGO_BIN_EXE_localdns-fallback"))
            .arg("--root")
            .arg(from_script.path()),
    );
    // The package's own documentation (copyright) is Debian's business, not install.sh's.
    let deb_files: Vec<(String, u32)> = files_with_modes(from_deb.path())
        .into_iter()
        .filter(|(p, _)| !p.starts_with("usr/share/doc/"))
        .collect();
    let script_files = files_with_modes(from_script.path());
    assert_eq!(
        deb_files, script_files,
        "the .deb and units/install.sh differ"
    );
    let expected: Vec<(String, u32)> = {
        let mut v: Vec<_> = INSTALLED.iter().map(|(p, m)| (p.to_string(), *m)).collect();
        v.sort();
        v
    };
    assert_eq!(deb_files, expected);
    // The units are the repository's, byte for byte.
    for (path, _) in &INSTALLED[1..] {
        assert_eq!(
            fs::read(from_deb.path().join(path)).expect("read the packaged unit"),
            fs::read(from_script.path().join(path)).expect("read the installed unit"),
            "{path}"
        );
    }
    // And the check sees a tree with no OS in it for what it is: no systemd to verify with.
    let out = run(
        Command::new(Path::new(MANIFEST_DIR).join("units/install.sh"))
            .arg("--check")
            .arg("--root")
            .arg(from_script.path()),
    );
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("systemd-analyze verify"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Every regular file under `dir` (relative path, permission bits), sorted.
fn files_with_modes(dir: &Path) -> Vec<(String, u32)> {
    fn walk(base: &Path, dir: &Path, out: &mut Vec<(String, u32)>) {
        for entry in fs::read_dir(dir).expect("read dir") {
            let path = entry.expect("dir entry").path();
            let meta = fs::symlink_metadata(&path).expect("stat");
            if meta.is_dir() {
                walk(base, &path, out);
            } else {
                let rel = path.strip_prefix(base).expect("under base");
                out.push((
                    rel.display().to_string(),
                    meta.permissions().mode() & 0o7777,
                ));
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

#[test]
fn version_names_the_commit_of_head() {
    let out = run_ok(Command::new(env!("CARGO_BIN_EXE_localdns-fallback")).arg("--version"));
    let head = head_commit();
    let clean = format!(
        "localdns-fallback {} (commit {head})",
        env!("CARGO_PKG_VERSION")
    );
    // "-dirty" is decided when the binary is built; the tree may have changed since.
    let dirty = format!(
        "localdns-fallback {} (commit {head}-dirty)",
        env!("CARGO_PKG_VERSION")
    );
    assert!(
        out.trim() == clean || out.trim() == dirty,
        "--version says {out:?}, HEAD is {head}"
    );
}
