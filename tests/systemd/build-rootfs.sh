#!/usr/bin/env bash
# Builds (once) the root file system the systemd end-to-end tests boot with systemd-nspawn:
#
#   tests/systemd/build-rootfs.sh SUITE DIR      e.g. bookworm /var/cache/localdns-fallback-tests/rootfs-bookworm
#
# SUITE is a Debian suite: bookworm (systemd 252, OnFailure= fires once, at the terminal failure)
# or trixie (systemd 257, OnFailure= fires on every failed start). DIR is a cache: it is left alone
# when it holds a build of the same STAMP, and rebuilt when it is missing or older. The build goes
# into a temporary sibling and is renamed into place, so a killed build never leaves a half cache;
# a lock serialises concurrent callers (the tests run in parallel). The tests boot the image with
# --volatile=overlay and never write to it.
set -euo pipefail

# Bump when the package list or the tweaks below change: every cache is rebuilt on its next use.
STAMP=3

suite=${1:?usage: build-rootfs.sh SUITE DIR}
dir=${2:?usage: build-rootfs.sh SUITE DIR}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
stamp_file=.localdns-fallback-rootfs

# systemd and dbus: the init under test. iproute2, iptables: the links, addresses and kube-proxy
# shaped rules. dnsmasq-base: the stand-in LocalDNS, VNet DNS and kube-dns. bind9-dnsutils: dig.
# procps: pgrep/pkill in the stand-in scripts. Nothing else: no recommends.
packages=systemd,systemd-sysv,dbus,iproute2,iptables,dnsmasq-base,bind9-dnsutils,procps

current() { [[ -f $dir/$stamp_file ]] && [[ $(cat "$dir/$stamp_file") == "$suite $STAMP" ]]; }

[[ $(id -u) -eq 0 ]] || { echo "build-rootfs.sh: debootstrap needs root" >&2; exit 1; }
command -v debootstrap >/dev/null || { echo "build-rootfs.sh: debootstrap is not installed (apt-get install debootstrap)" >&2; exit 1; }

mkdir -p "$(dirname "$dir")"
exec 9>"$dir.lock"
flock 9
if current; then exit 0; fi

tmp=$(mktemp -d "$dir.tmp.XXXXXX")
trap 'rm -rf --one-file-system "$tmp"' EXIT
started=$SECONDS
echo "build-rootfs.sh: debootstrap $suite into $tmp (once; cached as $dir)" >&2
debootstrap --variant=minbase --include="$packages" "$suite" "$tmp" "$mirror" >"$tmp.log" 2>&1 || {
    tail -n 30 "$tmp.log" >&2
    echo "build-rootfs.sh: debootstrap $suite failed (full log: $tmp.log)" >&2
    exit 1
}
rm -f "$tmp.log"

# Boot straight to multi-user, and quickly: mask what fails, waits or has no job in a throw-away
# container (consoles, logins, timers, first-boot and hardware units).
ln -sfn /lib/systemd/system/multi-user.target "$tmp/etc/systemd/system/default.target"
for unit in \
    console-getty.service container-getty@.service getty@.service serial-getty@.service getty.target \
    systemd-logind.service systemd-user-sessions.service systemd-update-utmp.service \
    systemd-update-utmp-runlevel.service systemd-firstboot.service systemd-machine-id-commit.service \
    systemd-timesyncd.service systemd-resolved.service systemd-networkd.service systemd-networkd.socket \
    systemd-networkd-wait-online.service systemd-network-generator.service \
    systemd-remount-fs.service systemd-journal-flush.service systemd-random-seed.service \
    systemd-pstore.service systemd-tmpfiles-clean.timer systemd-hwdb-update.service \
    systemd-journald-audit.socket systemd-binfmt.service sys-kernel-config.mount sys-kernel-debug.mount \
    sys-kernel-tracing.mount proc-sys-fs-binfmt_misc.automount ldconfig.service \
    apt-daily.timer apt-daily-upgrade.timer dpkg-db-backup.timer e2scrub_all.timer e2scrub_reap.service \
    fstrim.timer man-db.timer motd-news.timer; do
    ln -sfn /dev/null "$tmp/etc/systemd/system/$unit"
done
# Quiet, volatile journal: the tests read it with journalctl inside the container.
mkdir -p "$tmp/etc/systemd/journald.conf.d"
printf '[Journal]\nStorage=volatile\nRateLimitBurst=0\n' >"$tmp/etc/systemd/journald.conf.d/50-test.conf"
# A machine id, so nothing tries to commit one at boot on the read-only lower layer.
tr -d '-' </proc/sys/kernel/random/uuid >"$tmp/etc/machine-id"
echo "localdns-test" >"$tmp/etc/hostname"
# Small: no documentation, manuals, locales or package caches.
rm -rf "$tmp"/usr/share/doc/* "$tmp"/usr/share/man/* "$tmp"/usr/share/info/* \
    "$tmp"/var/cache/apt/*.bin "$tmp"/var/cache/apt/archives/*.deb "$tmp"/var/lib/apt/lists/*
find "$tmp/usr/share/locale" -mindepth 1 -maxdepth 1 ! -name 'locale.alias' -exec rm -rf {} + 2>/dev/null || true

echo "$suite $STAMP" >"$tmp/$stamp_file"
# Swap in atomically: the old cache (if any) moves aside first, then the new one takes its name.
if [[ -e $dir ]]; then
    old=$(mktemp -d "$dir.old.XXXXXX")
    mv "$dir" "$old/rootfs"
    mv "$tmp" "$dir"
    rm -rf --one-file-system "$old"
else
    mv "$tmp" "$dir"
fi
trap - EXIT
echo "build-rootfs.sh: $suite ready in $((SECONDS - started)) s: $(du -sh "$dir" | cut -f1) at $dir" >&2
