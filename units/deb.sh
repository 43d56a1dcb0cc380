#!/usr/bin/env bash
# Builds the Debian package from a built binary with dpkg-deb, which every Debian machine has
# (cargo-deb cost each fresh CI machine a two-minute install for five files and a control file):
#   units/deb.sh ARCH BINARY OUT.deb        e.g. units/deb.sh amd64 target/release/localdns-fallback x.deb
# units/release.sh runs it for both architectures. The package holds the binary where the units
# run it; our two units (conffiles, as dpkg treats files under /etc: `dpkg --remove` keeps them,
# `--purge` removes them); and under /usr/share/localdns-fallback/ install.sh, which the
# maintainer scripts (units/debian/) run, and the fleet view's pieces for whoever deploys
# node-problem-detector and Prometheus. The postinst wires the node (install.sh: the standby
# enabled, our drop-in with the node image's lines localdns.service lacks) and starts nothing.
set -euo pipefail
arch=${1:?usage: deb.sh ARCH BINARY OUT.deb}
binary=${2:?usage: deb.sh ARCH BINARY OUT.deb}
out=${3:?usage: deb.sh ARCH BINARY OUT.deb}
units=$(cd "$(dirname "$0")" && pwd)
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$units/../Cargo.toml" | head -n 1)
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
# The archive's ./ is the node's /: never mktemp's 0700.
chmod 0755 "$stage"

put() { install -D -m "$1" "$2" "$stage/$3"; }
put 0755 "$binary" opt/azure/containers/localdns/localdns-fallback
put 0644 "$units/localdns-fallback.service" etc/systemd/system/localdns-fallback.service
put 0644 "$units/localdns-fallback-standby.service" etc/systemd/system/localdns-fallback-standby.service
put 0755 "$units/install.sh" usr/share/localdns-fallback/install.sh
put 0644 "$units/node-problem-detector/localdns-fallback.json" usr/share/localdns-fallback/node-problem-detector/localdns-fallback.json
put 0644 "$units/prometheus/localdns-fallback-alerts.yaml" usr/share/localdns-fallback/prometheus/localdns-fallback-alerts.yaml
printf 'localdns-fallback, MIT license (see the source repository).\n' >"$stage/copyright"
put 0644 "$stage/copyright" usr/share/doc/localdns-fallback/copyright
rm "$stage/copyright"

mkdir "$stage/DEBIAN"
install -m 0755 "$units"/debian/{preinst,postinst,prerm,postrm} "$stage/DEBIAN/"
(cd "$stage" && find etc -type f | sort | sed 's|^|/|') >"$stage/DEBIAN/conffiles"
# glibc 2.34 is the floor units/release.sh holds every binary to.
cat >"$stage/DEBIAN/control" <<CONTROL
Package: localdns-fallback
Version: ${version}-1
Architecture: $arch
Section: net
Priority: optional
Maintainer: localdns-fallback developers
Installed-Size: $(du -sk --exclude=DEBIAN "$stage" | cut -f1)
Depends: libc6 (>= 2.34)
Description: A tiny DNS forwarder of last resort for AKS nodes whose LocalDNS has failed
 Serves the LocalDNS listeners 169.254.10.10 and 169.254.10.11 (UDP and TCP port
 53) whenever localdns.service does not: a standby beside it in the SO_REUSEPORT
 groups of its ports takes its flows the moment it stops serving and hands them
 back without a gap.
CONTROL
dpkg-deb --root-owner-group --build "$stage" "$out" >/dev/null
