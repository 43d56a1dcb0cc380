#!/usr/bin/env bash
# The whole test suite, as CI runs it: installs the Debian packages the tests use, checks format and
# lints, then runs the unit tests and the integration tests (which need root: they build network
# namespaces and run real DNS servers and clients in them).
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ $(id -u) -ne 0 ]]; then
    echo "tests/run.sh: the integration tests build network namespaces; run as root" >&2
    exit 1
fi

# dig (bind9-dnsutils), kdig (knot-dnsutils), dnsmasq, unbound and knot (knotd, which signs its
# zone itself) are the real clients and servers the tests talk to; musl-tools builds a static musl
# client, busybox is the nslookup of Alpine pods and golang-go builds a client on Go's own resolver
# (tests/transparency.rs, tests/resilience.rs); iproute2 builds the namespaces; iptables and nftables hold the kube-proxy
# shaped rules that discovery reads; curl and promtool (prometheus) scrape and check /metrics.
packages=(bind9-dnsutils knot-dnsutils knot musl-tools busybox golang-go dnsmasq-base unbound iproute2 procps iptables nftables curl prometheus systemd-container debootstrap)
# The arm64 build and its smoke test (units/release.sh, tests/arm64.rs): Debian's rustc-web and
# cargo-web (bookworm-security; they install /usr/bin/rustc and /usr/bin/cargo, which rustup's
# proxies in ~/.cargo/bin shadow on PATH, so the toolchain everything else uses is unchanged), the
# arm64 standard library (multiarch, with libc6:arm64, which also gives qemu the arm64 loader),
# the cross linker and its C library (only a Recommends of the linker), binutils' readelf for the
# glibc floor, and qemu-user to run the result (about 260 MB to fetch, 1 min to unpack).
packages+=(rustc-web cargo-web libstd-rust-web-dev:arm64 gcc-aarch64-linux-gnu libc6-dev-arm64-cross binutils qemu-user)
# (Adding the architecture is idempotent; the apt-get update below then fetches its lists.)
dpkg --add-architecture arm64
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    echo "installing: ${missing[*]}"
    apt-get update -qq
    # Install without starting the packages' own services (unbound would take port 53 on the
    # host): policy-rc.d exit 101 tells invoke-rc.d "not now".
    made_policy=""
    if [[ ! -e /usr/sbin/policy-rc.d ]]; then
        made_policy=1
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
    fi
    # unsafe-io: dpkg skips its fsync of each of the thousands of files these packages unpack
    # (on a CI machine a crash mid-install loses nothing that matters).
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        -o Dpkg::Options::=--force-unsafe-io "${missing[@]}" >/dev/null
    [[ -z $made_policy ]] || rm -f /usr/sbin/policy-rc.d
fi

# Where the time goes, for the log: seconds since the start at each step.
step() { echo "run.sh: $* at $SECONDS s"; }
step "packages installed"
mkdir -p target

# The systemd containers' root file systems (debootstrap, about a minute each from the Debian
# mirror; cached in /var/cache, so seconds when warm), built beside the compiles: the tests that
# boot them would otherwise wait on them in turn. The tests build them too if this failed.
setsid bash -c 'for s in bookworm trixie; do
    tests/systemd/build-rootfs.sh "$s" "/var/cache/localdns-fallback-tests/rootfs-$s"; done' \
    >target/run-rootfs.log 2>&1 &
rootfs=$!
# Beside the compiles and the tests that may share the machine, at the lowest CPU priority: the
# arm64 release binary that tests/arm64.rs runs under qemu, then the instrumented fuzz targets
# and a short run of each (6 s, two at a time) from the seed corpus in fuzz/corpus/, into a
# scratch corpus so the repository's stays as committed. A crash fails the run and prints how to
# reproduce it. Long runs: fuzz/run-long.sh.
side_log=target/run-side-builds.log
fuzz_scratch=$(mktemp -d)
setsid nice -n 19 bash -c 'units/release.sh --arch arm64 && fuzz/run-long.sh --build-only &&
    fuzz/run-long.sh --seconds 6 --jobs 2 --work "$1"' side "$fuzz_scratch" >"$side_log" 2>&1 &
side=$!
# In process groups of their own, so that an early exit stops them whole.
trap 'kill -- -$side -$rootfs 2>/dev/null || true; rm -rf "$fuzz_scratch"' EXIT

cargo fmt --check
cargo fmt --check --manifest-path fuzz/Cargo.toml
cargo clippy --all-targets --locked -- -D warnings
step "format and lints checked"

# A process per test: each test's namespaces, servers and forwarder are its own. The tests whose
# verdict hangs on how fast real processes react (group real-time, .config/nextest.toml) run
# after the rest and after the side builds, one at a time, with nothing else on the machine.
status=0
cargo nextest run --locked --no-fail-fast --test-threads 4 \
    -E 'not binary(arm64) and not group(real-time)' "$@" || status=$?
step "tests run"
wait $rootfs || true
if ! wait $side; then
    echo "the arm64 build, the fuzz build or a fuzz run failed:" >&2
    tail -n 40 "$side_log" >&2
    exit 1
fi
step "side builds and fuzzing done"
cargo nextest run --locked --no-fail-fast --test-threads 1 \
    -E 'binary(arm64) or group(real-time)' "$@" || status=$?
step "real-time tests run"
((status == 0)) || exit "$status"

