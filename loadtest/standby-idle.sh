#!/usr/bin/env bash
# What the standby mode costs beside a LocalDNS that serves: CPU time and resident memory of
# `localdns-fallback --standby` over an idle window, in a private network namespace with a
# stand-in LocalDNS (tests/systemd/standin.rs, bound with SO_REUSEPORT like CoreDNS).
#   loadtest/standby-idle.sh [SECONDS]     (default 30; needs root and a release build)
# BINARY=path measures another build; STRACE=1 (STRACE_ARGS=..., default -c) and PERF=1 (perf
# record into $TMPDIR/standby-idle.perf) look inside it for 5 s after the window.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-30}
binary=${BINARY:-target/release/localdns-fallback}
[[ -x $binary ]] || { echo "no $binary (cargo build --release first)" >&2; exit 1; }
ns=lf-standby-idle-$$
standin=$(mktemp -d)/standin
rustc --edition 2021 -O -o "$standin" tests/systemd/standin.rs
cleanup() {
    [[ -n ${fwd:-} ]] && kill "$fwd" 2>/dev/null
    [[ -n ${localdns:-} ]] && kill "$localdns" 2>/dev/null
    wait 2>/dev/null || true
    ip netns del "$ns" 2>/dev/null || true
    rm -rf "$(dirname "$standin")"
}
trap cleanup EXIT
ip netns add "$ns"
ip -n "$ns" link set lo up
ip -n "$ns" addr add 169.254.10.10/32 dev lo
ip -n "$ns" addr add 169.254.10.11/32 dev lo
ip netns exec "$ns" "$standin" serve --delay-ms 0 example.com=192.0.2.1 >/dev/null 2>&1 &
localdns=$!
sleep 0.5
ip netns exec "$ns" "$binary" --standby --node-upstream 127.0.0.1:5353 --cluster-upstream 127.0.0.1:5353 \
    --log-level warn &
fwd=$!
sleep 3
# CPU time of all its threads in nanoseconds (schedstat; the clock ticks of /proc/PID/stat count
# 10 ms each, too coarse for a fraction of a percent).
ticks() { cat /proc/"$fwd"/task/*/schedstat | awk '{ s += $1 } END { print s }'; }
t0=$(ticks); s0=$(date +%s.%N)
sleep "$seconds"; [[ -n ${STRACE:-} ]] && timeout 5 strace ${STRACE_ARGS:--c} -f -p "$fwd" 2>&1 | head -25
[[ -n ${PERF:-} ]] && perf record -o "${TMPDIR:-/tmp}/standby-idle.perf" -F 20000 -g -p "$fwd" -- sleep 5 >/dev/null 2>&1
t1=$(ticks); s1=$(date +%s.%N)
rss=$(awk '/^VmRSS/ {print $2}' "/proc/$fwd/status")
cpu=$(awk -v t="$((t1 - t0))" -v a="$s0" -v b="$s1" 'BEGIN { printf "%.3f", 100 * t / 1e9 / (b - a) }')
echo "standby idle over ${seconds}s: ${cpu} % of one core, VmRSS $((rss / 1024)).$(((rss % 1024) * 10 / 1024)) MiB"
