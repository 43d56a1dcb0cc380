#!/usr/bin/env bash
# Scenario (not a test): does the cache keep memory flat under a stream of unique names?
# Sends NAMES (default 1,000,000) cache-miss queries with unique names through localdns-fallback
# and reports its resident memory (VmRSS after, VmHWM peak) and the cache's own entry and byte
# counts from /metrics: with the default cache (20,000 entries, 32 MiB), with a cache whose byte
# cap (8 MiB) binds before its entry cap, and with the cache off (the constant). Run as root; private namespaces
# only, removed on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
names=${NAMES:-1000000}
[[ $(id -u) -eq 0 ]] || { echo "run as root" >&2; exit 1; }
cargo build --release --locked --quiet
(cd loadtest && cargo build --release --locked --quiet)
bin=$PWD/target/release/localdns-fallback
load=$PWD/loadtest/target/release/dnsload
responder=$PWD/loadtest/target/release/responder
tag=lfmem$$
node=$tag-n up=$tag-u
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    ip netns del "$node" 2>/dev/null || true
    ip netns del "$up" 2>/dev/null || true
}
trap cleanup EXIT INT TERM
ip netns add "$node"; ip netns add "$up"
ip -n "$node" link set lo up; ip -n "$up" link set lo up
ip -n "$node" link add localdns type veth peer name localdns-p
ip -n "$node" addr add 169.254.10.10/32 dev localdns
ip -n "$node" addr add 169.254.10.11/32 dev localdns
ip -n "$node" link set localdns up; ip -n "$node" link set localdns-p up
ip -n "$node" link add up1 type veth peer name eth0 netns "$up"
ip -n "$node" addr add 198.18.1.1/24 dev up1; ip -n "$node" link set up1 up
ip -n "$up" addr add 198.18.1.2/24 dev eth0; ip -n "$up" link set eth0 up
ip netns exec "$up" "$responder" --listen 198.18.1.2:53 --threads 1 &
pids+=($!)

measure() { # measure LABEL FLAGS...
    local label=$1; shift
    ip netns exec "$node" "$bin" --node-upstream 198.18.1.2 --cluster-upstream 198.18.1.2 \
        --metrics 127.0.0.1:9355 --log-level warn "$@" &
    local fwd=$!
    ip netns exec "$node" "$load" probe --server 169.254.10.11:53 --wait 10 >/dev/null
    local idle; idle=$(awk '/VmRSS/ {print $2}' "/proc/$fwd/status")
    # Open loop at a rate the relay takes easily, until NAMES unique names were sent.
    local qps=20000 secs=$(( (names + 19999) / 20000 ))
    ip netns exec "$node" "$load" run --server 169.254.10.11:53 --names miss --rate "$qps:$secs" \
        --duration "$secs" --timeout 2 >"/tmp/$tag-$label.json"
    local sent; sent=$(grep -o '"sent":[0-9]*' "/tmp/$tag-$label.json" | head -1 | cut -d: -f2)
    local rss hwm; rss=$(awk '/VmRSS/ {print $2}' "/proc/$fwd/status"); hwm=$(awk '/VmHWM/ {print $2}' "/proc/$fwd/status")
    local m; m=$(ip netns exec "$node" curl -s 127.0.0.1:9355/metrics)
    local entries bytes
    entries=$(awk '/^localdns_fallback_cache_entries / {print $2}' <<<"$m")
    bytes=$(awk '/^localdns_fallback_cache_bytes / {print $2}' <<<"$m")
    printf '%-10s queries sent %9s  RSS idle %6d KiB  RSS after %6d KiB  peak %6d KiB  cache %6s entries %9s bytes\n' \
        "$label" "${sent:-?}" "$idle" "$rss" "$hwm" "${entries:-0}" "${bytes:-0}"
    kill "$fwd"; wait "$fwd" 2>/dev/null || true
    rm -f "/tmp/$tag-$label.json"
}
echo "unique names: $names"
measure default                                        # 20,000 entries, 32 MiB
measure bytes-8M --cache-size 1000000 --cache-bytes 8M # the byte cap binds first
measure off --cache-size 0
