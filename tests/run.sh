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
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    [[ -z $made_policy ]] || rm -f /usr/sbin/policy-rc.d
fi

# Two builds the tests need only at the end run beside them, at the lowest CPU priority (the
# tests' own builds and timing go first; their waits on containers and timers leave a core idle
# most of the time): the arm64 release binary that tests/arm64.rs runs under qemu (about 55 s on
# an idle 2-core machine from scratch), then the instrumented fuzz targets (about 4 minutes from
# scratch; installing cargo-fuzz, when missing, about 70 s). Seconds each when warm.
if ! command -v cargo-fuzz >/dev/null 2>&1; then
    echo "installing cargo-fuzz"
    cargo install cargo-fuzz --locked
fi
mkdir -p target
side_log=target/run-side-builds.log
# In a process group of its own, so that an early exit stops the whole build.
setsid nice -n 19 bash -c 'units/release.sh --arch arm64 && cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz build --release' \
    >"$side_log" 2>&1 &
side=$!
trap 'kill -- -$side 2>/dev/null || true' EXIT

cargo fmt --check
cargo fmt --check --manifest-path fuzz/Cargo.toml
cargo clippy --all-targets --locked -- -D warnings

# A process per test: each test's namespaces, servers and forwarder are its own.
status=0
cargo nextest run --locked --no-fail-fast --test-threads 4 -E 'not binary(arm64)' "$@" || status=$?
if ! wait $side; then
    echo "the arm64 or fuzz build failed:" >&2
    tail -n 40 "$side_log" >&2
    exit 1
fi
cargo nextest run --locked --no-fail-fast -E 'binary(arm64)' "$@" || status=$?
((status == 0)) || exit "$status"

# ---- fuzzing (fuzz/) ------------------------------------------------------------------------
# A short run of every cargo-fuzz target (6 s each, about a minute in all) from the seed corpus
# in fuzz/corpus/, into a scratch corpus so the repository's stays as committed. A crash fails
# the run and prints how to reproduce it. Long runs: fuzz/run-long.sh.
fuzz_scratch=$(mktemp -d)
fuzz/run-long.sh --seconds 6 --work "$fuzz_scratch"
rm -rf "$fuzz_scratch"
# ---- end of fuzzing ---------------------------------------------------------------------------
