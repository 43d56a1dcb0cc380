//! What a node-image build gets: the `.deb` that `units/deb.sh` makes, installed with the
//! real `dpkg` into a scratch copy of a real Debian 12 root file system (systemd 252), and
//! `units/install.sh --check` run on that tree, as an image pipeline would run it. Two kinds of
//! image, one wiring: a LocalDNS unit with the node image's two lines and one without (install
//! adds them as our drop-in); the standby unit enabled on both. An upgrade over the 0.1 package,
//! whose drop-in wiring 0.2 retired. And the same `.deb` installed with `dpkg -i` inside running
//! containers (systemd 252 and 257), as on a running node: it wires, reloads and starts nothing; a
//! reboot starts the standby.
//!
//! The scratch root is an overlay: the root file system the systemd tests cache
//! (`tests/systemd/build-rootfs.sh`) is the read-only lower layer, and every change (dpkg's, and
//! the files these tests remove or break) lands in an upper directory of the test's own. The
//! overlay is mounted only inside a private mount namespace of each command the tests run
//! (`unshare --mount`), so no mount is ever visible on the host or outlives its command, even if
//! the test is killed; `Drop` removes the directories. The host's dpkg database is never opened:
//! `dpkg --root` uses the scratch root's own.
//!
//! The package is built by `units/deb.sh` (what `units/release.sh` runs) around this test build's
//! binary, under a file lock shared by the tests here.

mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use common::{TempDir, require_root_and_tools};

const MANIFEST_DIR: &str = env!("CARGO_MANIFEST_DIR");
/// Where the systemd tests cache their Debian 12 root file system (see build-rootfs.sh).
const ROOTFS: &str = "/var/cache/localdns-fallback-tests/rootfs-bookworm";
/// The files the package installs, with their modes (the paths the units and LocalDNS use).
const INSTALLED: [(&str, u32); 3] = [
    ("opt/azure/containers/localdns/localdns-fallback", 0o755),
    (
        "etc/systemd/system/localdns-fallback-standby.service",
        0o644,
    ),
    ("etc/systemd/system/localdns-fallback.service", 0o644),
];
/// Our drop-in on localdns.service, written by install.sh (the postinst) with the node image's
/// lines that LocalDNS's unit lacks; never dpkg's.
const DROPIN: &str = "etc/systemd/system/localdns.service.d/50-localdns-fallback.conf";
const ON_FAILURE: &str = "OnFailure=localdns-fallback.service";
const START_PRE: &str =
    "ExecStartPre=-/usr/bin/timeout 10 /usr/bin/systemctl stop localdns-fallback.service";
/// Where the package keeps install.sh and the fleet view's pieces.
const PACKAGED: [(&str, u32); 3] = [
    ("usr/share/localdns-fallback/install.sh", 0o755),
    (
        "usr/share/localdns-fallback/node-problem-detector/localdns-fallback.json",
        0o644,
    ),
    (
        "usr/share/localdns-fallback/prometheus/localdns-fallback-alerts.yaml",
        0o644,
    ),
];
/// The standby unit's enablement, as `systemctl enable` makes it.
const STANDBY_LINK: &str =
    "etc/systemd/system/multi-user.target.wants/localdns-fallback-standby.service";
/// What the 0.1 package's drop-in wiring put on a node, which 0.2 retired.
const OLD_WIRING: [&str; 2] = [
    "opt/azure/containers/localdns/localdns-fallback-handoff",
    "etc/systemd/system/localdns-fallback.path",
];
/// The cached root file system of Debian 13 (systemd 257), built by the systemd tests' script.
const ROOTFS_TRIXIE: &str = "/var/cache/localdns-fallback-tests/rootfs-trixie";

fn require() {
    require_root_and_tools(&[
        "dpkg",
        "dpkg-deb",
        "unshare",
        "mount",
        "chroot",
        "systemd-analyze",
        "debootstrap",
        "flock",
        "strip",
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

/// The `.deb`, built by `units/deb.sh` (what `units/release.sh` runs) around this test build's
/// binary, stripped: what is under test is the package and its wiring, and a release build
/// with fat LTO would cost every run two minutes (`units/release.sh` makes the real one).
fn package() -> PathBuf {
    let target = Path::new(MANIFEST_DIR).join("target/shipping");
    fs::create_dir_all(&target).expect("create target/shipping");
    let deb = target.join("localdns-fallback.deb");
    let fresh = target.join(format!("localdns-fallback.deb.{}", std::process::id()));
    // flock: the tests of this file run as parallel processes and share one binary.
    run_ok(
        Command::new("flock")
            .arg(target.join("build.lock"))
            .args([
                "sh",
                "-c",
                "cp \"$1\" \"$2\" && strip \"$2\" && units/deb.sh amd64 \"$2\" \"$3\"",
                "package",
                env!("CARGO_BIN_EXE_localdns-fallback"),
            ])
            .arg(stripped_binary())
            .arg(&fresh)
            .current_dir(MANIFEST_DIR),
    );
    // Renamed into place: another test's dpkg reading the previous one keeps reading it whole.
    fs::rename(&fresh, &deb).expect("rename the package into place");
    deb
}

/// The binary [`package`] puts in the package.
fn stripped_binary() -> PathBuf {
    Path::new(MANIFEST_DIR).join("target/shipping/localdns-fallback.stripped")
}

/// Builds a cached root file system once (under build-rootfs.sh's own lock) if missing: `suite`
/// bookworm (systemd 252) or trixie (257) into `dir`.
fn ensure_rootfs(suite: &str, dir: &str) {
    run_ok(
        Command::new(Path::new(MANIFEST_DIR).join("tests/systemd/build-rootfs.sh"))
            .arg(suite)
            .arg(dir),
    );
}

/// Which LocalDNS unit the image has.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Image {
    /// The stand-in localdns.service alone: no wiring of a fallback.
    Plain,
    /// With the node image's two lines (tests/systemd/node-image-wiring.conf, as a drop-in of
    /// LocalDNS's own): `OnFailure=localdns-fallback.service` and an `ExecStartPre=` that stops it.
    NodeImageLines,
}

/// A writable scratch copy of a node image: Debian 12 with a stand-in `localdns.service` (the
/// systemd tests' one, shaped like AKS's), as an image is before our package goes in.
struct ScratchRoot {
    dir: TempDir,
    lower: &'static str,
}

impl ScratchRoot {
    fn new() -> ScratchRoot {
        ScratchRoot::of(ROOTFS, Image::Plain)
    }

    /// A scratch copy of the cached root file system `lower` (bookworm's or trixie's) with the
    /// stand-in LocalDNS unit of `image`.
    fn of(lower: &'static str, image: Image) -> ScratchRoot {
        let suite = if lower == ROOTFS_TRIXIE {
            "trixie"
        } else {
            "bookworm"
        };
        ensure_rootfs(suite, lower);
        let dir = TempDir::new("ship");
        for sub in ["upper", "work", "root"] {
            fs::create_dir(dir.path().join(sub)).expect("create overlay directories");
        }
        let root = ScratchRoot { dir, lower };
        let standins = Path::new(MANIFEST_DIR).join("tests/systemd");
        root.sh(
            "install -m 0644 \"$1/localdns.service\" \"$1/localdns.slice\" \"$ROOT/etc/systemd/system/\" \
             && install -D -m 0755 \"$1/localdns.sh\" \"$ROOT/opt/azure/containers/localdns/localdns.sh\" \
             && if [ \"$2\" = lines ]; then install -D -m 0644 \"$1/node-image-wiring.conf\" \
                \"$ROOT/etc/systemd/system/localdns.service.d/10-node-image.conf\"; fi",
            &[
                standins.to_str().expect("utf-8 path"),
                if image == Image::NodeImageLines {
                    "lines"
                } else {
                    "plain"
                },
            ],
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
            "lowerdir={},upperdir={},workdir={}",
            self.lower,
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

/// The maintainer scripts start, stop or restart nothing but the standby at removal: no
/// `systemctl start`/`restart`/`enable --now`, no `deb-systemd-invoke`; what they run is the
/// shipped install.sh with `--no-start` (postinst) and `--uninstall` (prerm).
fn assert_maintainer_scripts_start_nothing(deb: &Path) {
    let info = run_ok(Command::new("dpkg-deb").arg("--info").arg(deb));
    assert!(
        !info.contains(" config "),
        "the package has a config:\n{info}"
    );
    let control = TempDir::new("ship-control");
    run_ok(
        Command::new("dpkg-deb")
            .arg("--control")
            .arg(deb)
            .arg(control.path()),
    );
    for script in ["preinst", "postinst", "prerm", "postrm"] {
        let text = fs::read_to_string(control.path().join(script))
            .unwrap_or_else(|e| panic!("the package has no {script}: {e}"));
        let code: Vec<&str> = text
            .lines()
            .filter(|l| !l.trim_start().starts_with('#'))
            .collect();
        for forbidden in [
            "systemctl start",
            "systemctl restart",
            "try-restart",
            "reload-or-restart",
            "--now",
            "deb-systemd-invoke",
            "invoke-rc.d",
        ] {
            assert!(
                !code.iter().any(|l| l.contains(forbidden)),
                "{script} runs `{forbidden}`:\n{text}"
            );
        }
    }
    let postinst = fs::read_to_string(control.path().join("postinst")).expect("read postinst");
    assert!(
        postinst.contains("/usr/share/localdns-fallback/install.sh --no-start"),
        "{postinst}"
    );
}

impl ScratchRoot {
    /// Is there a file or a link (the standby's points at /etc/... of the image) at `path`?
    fn has(&self, path: &str) -> bool {
        self.sh("test -e \"$ROOT/$1\" -o -L \"$ROOT/$1\"", &[path])
            .out
            .status
            .success()
    }

    /// The lines of our drop-in that are not comments or section headers.
    fn dropin_lines(&self) -> Vec<String> {
        if !self.has(DROPIN) {
            return Vec::new();
        }
        self.sh("cat \"$ROOT/$1\"", &[DROPIN])
            .assert_ok()
            .text()
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#') && !l.starts_with('['))
            .map(str::to_owned)
            .collect()
    }

    /// A digest of LocalDNS's own files (its unit, its drop-ins but ours, its script): what
    /// install must never change.
    fn localdns_own(&self) -> String {
        self.sh(
            "cd \"$ROOT\" && find etc/systemd/system/localdns.service etc/systemd/system/localdns.service.d \
             opt/azure/containers/localdns/localdns.sh -type f ! -name 50-localdns-fallback.conf \
             2>/dev/null | sort | xargs sha256sum",
            &[],
        )
        .text()
    }
}

/// The 0.1 package (tests/fixtures/package-0.1: its drop-in wiring, install.sh and maintainer
/// scripts) with the binary [`package`] packs, made with dpkg-deb.
fn old_package() -> (TempDir, PathBuf) {
    let dir = TempDir::new("ship-old");
    let fixture = Path::new(MANIFEST_DIR).join("tests/fixtures/package-0.1");
    let tree = dir.path().join("tree");
    let script = "set -e; f=$1; t=$2; \
        install -D -m 0755 \"$3\" \"$t/opt/azure/containers/localdns/localdns-fallback\"; \
        install -D -m 0755 \"$f/localdns-fallback-handoff\" \"$t/opt/azure/containers/localdns/localdns-fallback-handoff\"; \
        for u in localdns-fallback.service localdns-fallback-standby.service localdns-fallback.path; do \
            install -D -m 0644 \"$f/$u\" \"$t/etc/systemd/system/$u\"; done; \
        install -D -m 0755 \"$f/install.sh\" \"$t/usr/share/localdns-fallback/install.sh\"; \
        install -D -m 0644 \"$f/50-localdns-fallback.conf\" \"$t/usr/share/localdns-fallback/localdns.service.d/50-localdns-fallback.conf\"; \
        mkdir -p \"$t/DEBIAN\"; cp \"$f\"/DEBIAN/* \"$t/DEBIAN/\"; chmod 0755 \"$t\"/DEBIAN/p*; \
        dpkg-deb --root-owner-group -Znone --build \"$t\" \"$4\" >/dev/null";
    let deb = dir.path().join("localdns-fallback_0.1.0-1_amd64.deb");
    run_ok(
        Command::new("bash")
            .args(["-c", script, "old-package"])
            .arg(&fixture)
            .arg(&tree)
            .arg(stripped_binary())
            .arg(&deb),
    );
    (dir, deb)
}

#[test]
fn the_package_wires_each_kind_of_node_image_the_one_way_and_passes_the_check() {
    require();
    let deb = package();
    assert_maintainer_scripts_start_nothing(&deb);

    for image in [Image::Plain, Image::NodeImageLines] {
        let root = ScratchRoot::of(ROOTFS, image);
        let before = root.localdns_own();
        root.dpkg(&deb).assert_ok();
        let listed = root
            .sh("dpkg --root=\"$ROOT\" --listfiles localdns-fallback", &[])
            .assert_ok()
            .text();
        for &(path, mode) in INSTALLED.iter().chain(PACKAGED.iter()) {
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
        assert!(
            !listed.lines().any(|l| l == format!("/{DROPIN}")),
            "dpkg owns our drop-in:\n{listed}"
        );

        // One wiring: the standby enabled on both kinds; the node image's two lines added where
        // LocalDNS's unit lacked them, nothing where it has them; LocalDNS's own files untouched.
        let lines = image == Image::NodeImageLines;
        let expected: Vec<String> = if lines {
            Vec::new()
        } else {
            vec![ON_FAILURE.into(), START_PRE.into()]
        };
        assert_eq!(root.dropin_lines(), expected, "{image:?}: our drop-in");
        assert!(root.has(STANDBY_LINK), "{image:?}: standby not enabled");
        root.sh(
            "test \"$(readlink \"$ROOT/$1\")\" = /etc/systemd/system/localdns-fallback-standby.service",
            &[STANDBY_LINK],
        )
        .assert_ok();
        assert_eq!(
            root.localdns_own(),
            before,
            "{image:?}: LocalDNS's own files changed"
        );
        let checked = root.check();
        checked.assert_ok();
        assert!(
            checked.text().contains("check OK") && checked.text().contains("standby enabled"),
            "{image:?}: {}",
            checked.text()
        );
        // The shipped install.sh says the same from inside the image.
        root.sh(
            "chroot \"$ROOT\" /usr/share/localdns-fallback/install.sh --check",
            &[],
        )
        .assert_ok();
        eprintln!(
            "{image:?}: {}",
            checked.text().lines().last().unwrap_or_default()
        );

        // The packaged binary runs on the image's own C library and names this commit.
        let version = root
            .sh("chroot \"$ROOT\" /$1 --version", &[INSTALLED[0].0])
            .assert_ok()
            .text();
        assert!(
            version.contains(&format!("(commit {}", head_commit())),
            "{version}"
        );

        // An upgrade (dpkg -i over the installed package: the postinst's $2 is the old version)
        // wires as before, and keeps an administrator's `systemctl disable` of the standby; the
        // check then says so, and passes.
        root.dpkg_install(&deb);
        assert_eq!(root.dropin_lines(), expected, "{image:?}: after an upgrade");
        assert!(root.has(STANDBY_LINK), "{image:?}: after an upgrade");
        root.sh("rm \"$ROOT/$1\"", &[STANDBY_LINK]).assert_ok();
        root.dpkg_install(&deb);
        assert!(
            !root.has(STANDBY_LINK),
            "an upgrade enabled the disabled standby again"
        );
        let checked = root.check();
        checked.assert_ok();
        assert!(
            checked.text().contains("standby disabled"),
            "{}",
            checked.text()
        );

        // Purging takes every file back out, the postinst's too (the units are conffiles, so
        // --remove alone keeps them).
        root.sh("dpkg --root=\"$ROOT\" --purge localdns-fallback", &[])
            .assert_ok();
        for path in INSTALLED.iter().chain(PACKAGED.iter()).map(|(p, _)| *p) {
            assert!(!root.has(path), "{path} after purge");
        }
        assert!(!root.has(STANDBY_LINK) && !root.has(DROPIN));
        assert_eq!(
            root.localdns_own(),
            before,
            "{image:?}: LocalDNS's own files after purge"
        );
        root.check().assert_fails_naming(&format!(
            "missing: {}/{}",
            root.path().display(),
            INSTALLED[0].0
        ));
    }
}

/// `dpkg -i` of this package over the 0.1 package, on both kinds of image: 0.1 put its drop-in
/// wiring (the long drop-in, the handoff script, the path unit) where LocalDNS lacked the node
/// image's lines and left the standby disabled there; where it had them, 0.1 enabled the standby
/// and an administrator may have disabled it since. After the upgrade nothing of the old wiring
/// is left (dpkg forgets the path unit, a conffile), the node has the one wiring, the standby is
/// enabled unless an administrator disabled it, and `--check` is clean; before the upgrade it
/// names every leftover.
#[test]
fn an_upgrade_over_the_0_1_drop_in_wiring_leaves_the_one_wiring() {
    require();
    let deb = package();
    let (_old_dir, old) = old_package();
    for (image, disabled) in [
        (Image::Plain, false),
        (Image::NodeImageLines, false),
        (Image::NodeImageLines, true),
    ] {
        let what = format!(
            "{image:?}{}",
            if disabled { ", standby disabled" } else { "" }
        );
        let root = ScratchRoot::of(ROOTFS, image);
        // 0.1's install refused a LocalDNS whose ExecStopPost= list was not exactly AKS's: the
        // stand-in's extra line goes, or 0.1 would not be installed to begin with.
        root.sh(
            "sed -i '/^ExecStopPost=-\\/bin\\/true$/d' \"$ROOT/etc/systemd/system/localdns.service\"",
            &[],
        )
        .assert_ok();
        let before = root.localdns_own();
        root.dpkg_install(&old);
        let lines = image == Image::NodeImageLines;
        assert_eq!(root.has(DROPIN), !lines, "{what}: 0.1's drop-in");
        assert_eq!(root.has(STANDBY_LINK), lines, "{what}: 0.1's standby");
        if disabled {
            root.sh("rm \"$ROOT/$1\"", &[STANDBY_LINK]).assert_ok();
        }
        if !lines {
            // The new check on the old tree names what is left of the retired wiring.
            root.sh(
                "cp \"$1\" \"$ROOT/tmp/install.sh\"",
                &[Path::new(MANIFEST_DIR)
                    .join("units/install.sh")
                    .to_str()
                    .expect("utf-8 path")],
            )
            .assert_ok();
            let checked = root.sh("\"$ROOT/tmp/install.sh\" --check --root \"$ROOT\"", &[]);
            for left in OLD_WIRING.iter().chain([&DROPIN]) {
                checked.assert_fails_naming(&format!(
                    "left of the retired drop-in wiring: {}/{left}",
                    root.path().display()
                ));
            }
        }

        root.dpkg_install(&deb);
        for left in OLD_WIRING {
            assert!(!root.has(left), "{what}: /{left} after the upgrade");
        }
        let conffiles = root
            .sh("dpkg-query --admindir=\"$ROOT/var/lib/dpkg\" -W -f='${Conffiles}' localdns-fallback", &[])
            .assert_ok()
            .text();
        assert!(
            !conffiles.contains("localdns-fallback.path"),
            "{what}: dpkg still lists the path unit: {conffiles}"
        );
        let expected: Vec<String> = if lines {
            Vec::new()
        } else {
            vec![ON_FAILURE.into(), START_PRE.into()]
        };
        assert_eq!(
            root.dropin_lines(),
            expected,
            "{what}: our drop-in after the upgrade"
        );
        assert_eq!(
            root.has(STANDBY_LINK),
            !disabled,
            "{what}: the standby after the upgrade"
        );
        assert_eq!(root.localdns_own(), before, "{what}: LocalDNS's own files");
        let checked = root.check();
        checked.assert_ok();
        eprintln!("{what}, upgraded from 0.1: {}", checked.text().trim());
    }
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
    root.check().assert_ok();
}

/// LocalDNS's unit is read for the node image's two lines and nothing else: whatever else it and
/// its own drop-ins say (another cleanup, more ExecStopPost= lines, a reset list), install adds
/// exactly the lines it lacks, never refuses, and never changes a file of LocalDNS's; --check
/// names a line that goes missing later.
#[test]
fn install_adds_exactly_the_missing_lines_whatever_else_localdns_says() {
    require();
    let unit = "etc/systemd/system/localdns.service";
    let theirs = "etc/systemd/system/localdns.service.d/10-theirs.conf";
    let add_theirs = |body: &str| {
        format!("mkdir -p \"$(dirname \"$ROOT/{theirs}\")\" && printf '{body}' >\"$ROOT/{theirs}\"")
    };
    let cases = [
        (
            "another cleanup command",
            format!("sed -i 's/^ExecStopPost=.*/& --all/' \"$ROOT/{unit}\""),
            vec![ON_FAILURE, START_PRE],
        ),
        (
            "an ExecStopPost= list reset by a drop-in of its own",
            add_theirs("[Service]\\nExecStopPost=\\nExecStopPost=/bin/true\\n"),
            vec![ON_FAILURE, START_PRE],
        ),
        (
            "OnFailure= already (in a list with another unit)",
            add_theirs("[Unit]\\nOnFailure=other.service localdns-fallback.service\\n"),
            vec![START_PRE],
        ),
        (
            "the ExecStartPre= already",
            add_theirs(
                "[Service]\\nExecStartPre=-/usr/bin/systemctl stop localdns-fallback.service\\n",
            ),
            vec![ON_FAILURE],
        ),
        (
            "both lines",
            add_theirs(
                "[Unit]\\nOnFailure=localdns-fallback.service\\n[Service]\\nExecStartPre=-/usr/bin/systemctl stop localdns-fallback\\n",
            ),
            vec![],
        ),
    ];
    for (what, change, expected) in cases {
        let root = ScratchRoot::new();
        root.sh(&change, &[]).assert_ok();
        let before = root.localdns_own();
        root.install().assert_ok();
        assert_eq!(root.dropin_lines(), expected, "{what}");
        assert_eq!(
            root.localdns_own(),
            before,
            "{what}: LocalDNS's own files changed"
        );
        root.check().assert_ok();
        // Installed again (an upgrade): the same.
        root.install().assert_ok();
        assert_eq!(root.dropin_lines(), expected, "{what}: installed twice");
        for line in &expected {
            root.sh(
                "cp \"$ROOT/$1\" \"$ROOT/$1.orig\" && grep -vxF \"$2\" \"$ROOT/$1.orig\" >\"$ROOT/$1\"",
                &[DROPIN, line],
            )
            .assert_ok();
            root.check()
                .assert_fails_naming(&format!("localdns.service lacks {line}"));
            root.sh("mv \"$ROOT/$1.orig\" \"$ROOT/$1\"", &[DROPIN])
                .assert_ok();
        }
        root.uninstall().assert_ok();
        assert!(
            !root.has(DROPIN) && !root.has(STANDBY_LINK),
            "{what}: after uninstall"
        );
        assert_eq!(
            root.localdns_own(),
            before,
            "{what}: LocalDNS's own files after uninstall"
        );
        eprintln!("{what}: our drop-in held {expected:?}; LocalDNS's files untouched");
    }
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
    assert!(!root.has(DROPIN));
    root.check().assert_fails_naming("another fallback's unit");

    // Ours was installed, then theirs took the unit's path: uninstall removes ours only.
    let root = ScratchRoot::new();
    root.install().assert_ok();
    root.sh(put_theirs, &[theirs]).assert_ok();
    root.uninstall().assert_ok();
    root.sh(still_theirs, &[]).assert_ok();
    assert!(!root.has(DROPIN));

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
    // The package's own documentation (copyright) is Debian's business, not install.sh's; its
    // /usr/share/localdns-fallback is what the postinst installs from. What install.sh writes
    // beside the files (the drop-in, the standby's link) is the postinst's in the package.
    let deb_files: Vec<(String, u32)> = files_with_modes(from_deb.path())
        .into_iter()
        .filter(|(p, _)| !p.starts_with("usr/share/"))
        .collect();
    let script_files: Vec<(String, u32)> = files_with_modes(from_script.path())
        .into_iter()
        .filter(|(p, _)| p != DROPIN && p != STANDBY_LINK)
        .collect();
    assert_eq!(
        deb_files, script_files,
        "the .deb and units/install.sh differ"
    );
    let mut expected: Vec<(String, u32)> =
        INSTALLED.iter().map(|(p, m)| (p.to_string(), *m)).collect();
    expected.sort();
    assert_eq!(deb_files, expected);
    let shipped: Vec<(String, u32)> = files_with_modes(from_deb.path())
        .into_iter()
        .filter(|(p, _)| p.starts_with("usr/share/localdns-fallback/"))
        .collect();
    let mut packaged: Vec<(String, u32)> =
        PACKAGED.iter().map(|(p, m)| (p.to_string(), *m)).collect();
    packaged.sort();
    assert_eq!(shipped, packaged);
    // The units are the repository's, byte for byte; so is install.sh.
    for (path, _) in &INSTALLED[1..] {
        assert_eq!(
            fs::read(from_deb.path().join(path)).expect("read the packaged unit"),
            fs::read(from_script.path().join(path)).expect("read the installed unit"),
            "{path}"
        );
    }
    assert_eq!(
        fs::read(from_deb.path().join(PACKAGED[0].0)).expect("read the packaged install.sh"),
        fs::read(Path::new(MANIFEST_DIR).join("units/install.sh")).expect("read install.sh"),
    );
    // With no LocalDNS unit in the tree (an image that gets it later), both lines go in.
    assert_eq!(
        fs::read_to_string(from_script.path().join(DROPIN))
            .expect("read the drop-in")
            .lines()
            .filter(|l| l.contains('='))
            .collect::<Vec<_>>(),
        [ON_FAILURE, START_PRE]
    );
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

// ---------------------------------------------------------------------------------------------
// On a running node: the package installed with `dpkg -i` inside a booted container
// ---------------------------------------------------------------------------------------------

/// A scratch image booted with `systemd-nspawn --boot` (systemd as PID 1, a network namespace of
/// its own with only `lo`), the package bound in at /opt/ship/localdns-fallback.deb. The overlay
/// is mounted in a mount namespace of nspawn's own, inside a PID namespace whose end (nspawn's
/// death, or this test's: `unshare --kill-child` and a parent-death signal) kills the whole
/// container; `Drop` also kills its cgroup and removes it. Changes persist in the scratch root's
/// upper layer, so the same image boots again after a power-off.
struct Booted {
    nspawn: std::process::Child,
    leader: u32,
    cgroup: PathBuf,
    cgroup_v1: PathBuf,
    what: String,
}

/// This process's cgroup in the cgroup2 hierarchy (`/sys/fs/cgroup` on a unified host,
/// `/sys/fs/cgroup/unified` on a hybrid one); containers get sub-cgroups of it.
fn cgroup2_root() -> PathBuf {
    let mount = ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
        .into_iter()
        .map(Path::new)
        .find(|m| m.join("cgroup.procs").exists() && m.join("cgroup.max.depth").exists())
        .expect("no cgroup2 hierarchy at /sys/fs/cgroup or /sys/fs/cgroup/unified");
    let own = fs::read_to_string("/proc/self/cgroup").expect("read /proc/self/cgroup");
    let rel = own
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .expect("no cgroup2 line in /proc/self/cgroup");
    mount.join(rel.trim_start_matches('/'))
}

/// The host PID of a container's PID 1 below `pid`: the descendant that is PID 1 in a PID
/// namespace nested two deep (nspawn itself is PID 1 of the first).
fn container_leader(pid: u32) -> Option<u32> {
    let children = fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).ok()?;
    for child in children
        .split_whitespace()
        .filter_map(|p| p.parse::<u32>().ok())
    {
        let status = fs::read_to_string(format!("/proc/{child}/status")).unwrap_or_default();
        let nspid: Vec<&str> = status
            .lines()
            .find_map(|l| l.strip_prefix("NSpid:"))
            .unwrap_or_default()
            .split_whitespace()
            .collect();
        if nspid.len() > 2 && nspid.last() == Some(&"1") {
            return Some(child);
        }
        if let Some(found) = container_leader(child) {
            return Some(found);
        }
    }
    None
}

impl Booted {
    fn boot(root: &ScratchRoot, deb: &Path, what: &str) -> Booted {
        use std::os::unix::process::CommandExt;
        static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let name = format!(
            "lf-ship-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        let cgroup = cgroup2_root().join(&name);
        fs::create_dir(&cgroup)
            .unwrap_or_else(|e| panic!("cannot create cgroup {}: {e}", cgroup.display()));
        let rel = ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"]
            .into_iter()
            .find_map(|m| cgroup.strip_prefix(m).ok())
            .expect("a cgroup under /sys/fs/cgroup")
            .to_owned();
        let cgroup_v1 = Path::new("/sys/fs/cgroup/systemd").join(rel);
        let d = root.dir.path();
        let options = format!(
            "lowerdir={},upperdir={},workdir={}",
            root.lower,
            d.join("upper").display(),
            d.join("work").display()
        );
        let script = "mount -t overlay overlay -o \"$OPTIONS\" \"$ROOT\" || exit 99\n\
            exec systemd-nspawn --quiet --boot --register=no --keep-unit --private-network \
            --console=read-only --machine=\"$NAME\" --directory=\"$ROOT\" \
            --system-call-filter='landlock_create_ruleset landlock_add_rule landlock_restrict_self' \
            --bind-ro=\"$DEB\":/opt/ship/localdns-fallback.deb";
        let mut cmd = Command::new("unshare");
        cmd.args([
            "--pid",
            "--fork",
            "--kill-child",
            "--mount-proc",
            "--mount",
            "--propagation",
            "private",
            "--",
            "sh",
            "-c",
            script,
        ])
        .env("ROOT", root.path())
        .env("OPTIONS", options)
        .env("NAME", &name)
        .env("DEB", deb)
        // A pure cgroup2 tree inside, as on AKS nodes (systemd 257 wants it).
        .env("SYSTEMD_NSPAWN_UNIFIED_HIERARCHY", "1")
        .env("SYSTEMD_NSPAWN_LOCK", "0")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
        // Into the container's cgroup between fork and exec (the file is opened before the fork;
        // writing "0" moves the writer), and killed if this test dies.
        let procs = fs::OpenOptions::new()
            .write(true)
            .open(cgroup.join("cgroup.procs"))
            .expect("open cgroup.procs");
        let procs_fd = std::os::fd::AsRawFd::as_raw_fd(&procs);
        // SAFETY: only async-signal-safe calls (write, prctl) between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                if nix::libc::write(procs_fd, b"0".as_ptr().cast(), 1) != 1 {
                    return Err(std::io::Error::last_os_error());
                }
                nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
                    .map_err(std::io::Error::from)
            });
        }
        let nspawn = cmd.spawn().expect("cannot start unshare/systemd-nspawn");
        drop(procs);
        let mut c = Booted {
            leader: 0,
            nspawn,
            cgroup,
            cgroup_v1,
            what: what.to_owned(),
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(90);
        loop {
            if let Some(status) = c.nspawn.try_wait().expect("wait for nspawn") {
                panic!("{}: systemd-nspawn exited at boot ({status})", c.what);
            }
            if c.leader == 0 {
                c.leader = container_leader(c.nspawn.id()).unwrap_or(0);
            } else {
                let state = c.exec("systemctl is-system-running --wait");
                match String::from_utf8_lossy(&state.stdout).trim() {
                    "running" => break,
                    "degraded" => panic!(
                        "{}: booted degraded:\n{}",
                        c.what,
                        c.text("systemctl --failed --no-pager")
                    ),
                    _ => {}
                }
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{}: did not boot within 90 s",
                c.what
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        c
    }

    /// Runs a shell command inside the container (bounded: `timeout 60` inside).
    fn exec(&self, script: &str) -> Output {
        run(Command::new("nsenter")
            .arg(format!("--target={}", self.leader))
            .args(["--all", "--", "timeout", "60", "/bin/sh", "-c", script])
            .env_clear()
            .env(
                "PATH",
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            )
            .env("SYSTEMD_COLORS", "0")
            .env("SYSTEMD_PAGER", ""))
    }

    /// stdout and stderr of a command inside, whatever its status.
    fn text(&self, script: &str) -> String {
        let out = self.exec(script);
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    }

    /// A command inside that must succeed; its stdout.
    fn ok(&self, script: &str) -> String {
        let out = self.exec(script);
        assert!(
            out.status.success(),
            "{}: `{script}` failed ({}):\n{}{}\njournal:\n{}",
            self.what,
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            self.text("journalctl --no-pager -q -n 40")
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `systemctl is-active` of a unit (`active`, `inactive`, ...).
    fn state(&self, unit: &str) -> String {
        self.text(&format!("systemctl is-active {unit}"))
            .trim()
            .to_owned()
    }

    /// Powers the container off and waits for nspawn to end (the overlay goes with it).
    fn power_off(mut self) {
        let _ = self.exec("systemctl poweroff");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while self.nspawn.try_wait().expect("wait for nspawn").is_none() {
            assert!(
                std::time::Instant::now() < deadline,
                "{}: did not power off within 60 s",
                self.what
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
}

impl Drop for Booted {
    fn drop(&mut self) {
        let _ = fs::write(self.cgroup.join("cgroup.kill"), "1");
        common::kill_and_reap(&mut self.nspawn);
        for _ in 0..500 {
            let populated = fs::read_to_string(self.cgroup.join("cgroup.events"))
                .map(|e| e.contains("populated 1"))
                .unwrap_or(false);
            if !populated {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        for dir in [&self.cgroup, &self.cgroup_v1] {
            let _ = run(Command::new("find")
                .arg(dir)
                .args(["-depth", "-type", "d", "-exec", "rmdir", "{}", "+"]));
        }
    }
}

/// `dpkg -i` on a running node (systemd `version`, the cached root file system `lower`), on both
/// kinds of image: nothing starts, systemd has reloaded (no unit needs a reload), the one wiring
/// is in place, `install.sh --check` is clean; and the next boot starts the standby.
fn the_package_on_a_running_node(lower: &'static str, version: u32) {
    require();
    require_root_and_tools(&["systemd-nspawn", "nsenter", "find"]);
    let deb = package();
    for image in [Image::Plain, Image::NodeImageLines] {
        let what = format!("systemd {version}, {image:?}");
        let root = ScratchRoot::of(lower, image);
        let c = Booted::boot(&root, &deb, &what);
        let installed = c.ok("dpkg -i /opt/ship/localdns-fallback.deb </dev/null 2>&1");
        let lines = image == Image::NodeImageLines;

        // Nothing started: no unit of ours, no process of our binary.
        for unit in [
            "localdns-fallback.service",
            "localdns-fallback-standby.service",
        ] {
            assert_eq!(
                c.state(unit),
                "inactive",
                "{what}: {unit} after dpkg -i:\n{installed}"
            );
        }
        let procs = c.text("pgrep -l localdns-fallb || true");
        assert!(
            procs.trim().is_empty(),
            "{what}: our binary runs after dpkg -i: {procs}"
        );
        // Reloaded by the postinst: systemd already sees the wiring.
        assert_eq!(
            c.ok("systemctl show -p NeedDaemonReload --value localdns.service")
                .trim(),
            "no",
            "{what}"
        );
        let dropins = c.ok("systemctl show -p DropInPaths --value localdns.service");
        assert_eq!(
            dropins.contains("50-localdns-fallback.conf"),
            !lines,
            "{what}: localdns.service's drop-ins: {dropins}"
        );
        let on_failure = c.ok("systemctl show -p OnFailure --value localdns.service");
        assert_eq!(on_failure.trim(), "localdns-fallback.service", "{what}");
        let enabled = c.text("systemctl is-enabled localdns-fallback-standby.service");
        assert_eq!(enabled.trim(), "enabled", "{what}: the standby unit");
        let checked = c.ok("/usr/share/localdns-fallback/install.sh --check");
        eprintln!("{what}, dpkg -i on a running node: {}", checked.trim());

        if !lines {
            // The next boot starts the standby, and the check stays clean.
            c.power_off();
            let c = Booted::boot(&root, &deb, &format!("{what}, rebooted"));
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
            while c.state("localdns-fallback-standby.service") != "active" {
                assert!(
                    std::time::Instant::now() < deadline,
                    "{what}: the standby is not active after a reboot:\n{}",
                    c.text(
                        "systemctl status --no-pager localdns-fallback-standby.service; journalctl --no-pager -q -n 40"
                    )
                );
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            let checked = c.ok("/usr/share/localdns-fallback/install.sh --check");
            eprintln!("{what}, after a reboot: standby active; {}", checked.trim());
        }
    }
}

#[test]
fn on_a_running_node_under_systemd_252_dpkg_starts_nothing_and_the_next_boot_starts_the_standby() {
    the_package_on_a_running_node(ROOTFS, 252);
}

#[test]
fn on_a_running_node_under_systemd_257_dpkg_starts_nothing_and_the_next_boot_starts_the_standby() {
    the_package_on_a_running_node(ROOTFS_TRIXIE, 257);
}
