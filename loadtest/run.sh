#!/usr/bin/env bash
# The load-test harness: localdns-fallback against kernel DNAT, a bare relay, dnsdist, dnsmasq and
# unbound, side by side, on this machine. Run as root:
#
#   loadtest/run.sh [--quick] [--scenario NAME] [--systems a,b,c] [--generator own|dnsperf]
#                   [--upstream own|knot] [--reps N] [--gen-threads N] [--lf-args 'FLAGS']
#                   [--lf-bin PATH] [--lf-base PATH] [--misses-only] [--faults a,b] [--install]
#                   [--no-build] [--out DIR]
#
# Scenarios: throughput (default), kill, slow, faults, outage-stale, tcp, overload, calibrate, all.
# See loadtest/README.md for what each one does and what each figure means.
#
# For every measurement it builds fresh private network namespaces — a node namespace with the
# listeners 169.254.10.10 and .11 on a link named `localdns`, and one or two upstream namespaces
# reached over veth (198.18.K.2) — starts the upstream, then the system under test, runs the load
# generator in the node namespace, and tears everything down again. Traffic never leaves those
# namespaces (they have no default route). Every run is bounded in time and query count, and
# everything it makes is removed on exit, also on Ctrl-C or failure.
set -euo pipefail
self=$(readlink -f "$0")
cd "$(dirname "$self")/.."
repo=$PWD

usage() { sed -n '2,11p' "$self" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }

# ---------------------------------------------------------------- options
quick=0 scenario=throughput systems_opt="" generator=own upstream=own reps="" install=0 build=1 out="" gen_threads=1 lf_args=""
lf_bin="" lf_base="" faults_opt="" misses_only=0
while (($#)); do
    case $1 in
        --quick) quick=1 ;;
        --scenario) scenario=${2:?--scenario needs a name}; shift ;;
        --systems) systems_opt=${2:?--systems needs a list}; shift ;;
        --generator) generator=${2:?}; shift ;;
        --upstream) upstream=${2:?}; shift ;;
        --reps) reps=${2:?}; shift ;;
        --gen-threads) gen_threads=${2:?}; shift ;;
        --lf-args) lf_args=${2?}; shift ;;
        --lf-bin) lf_bin=${2:?--lf-bin needs a path}; shift ;;
        --lf-base) lf_base=$(readlink -f "${2:?--lf-base needs a path}"); shift ;;
        --misses-only) misses_only=1 ;;
        --faults) faults_opt=${2:?--faults needs a list}; shift ;;
        --install) install=1 ;;
        --no-build) build=0 ;;
        --out) out=${2:?}; shift ;;
        -h|--help) usage 0 ;;
        *) echo "run.sh: unknown option $1" >&2; usage 2 ;;
    esac
    shift
done
case $generator in own|dnsperf) ;; *) echo "run.sh: --generator is own or dnsperf" >&2; exit 2 ;; esac
case $upstream in own|knot) ;; *) echo "run.sh: --upstream is own or knot" >&2; exit 2 ;; esac
case $scenario in throughput|kill|slow|faults|outage-stale|tcp|overload|calibrate|all) ;;
    *) echo "run.sh: unknown scenario $scenario (throughput, kill, slow, faults, outage-stale, tcp, overload, calibrate, all)" >&2; exit 2 ;;
esac
if [[ -n $lf_bin ]]; then
    lf_bin=$(readlink -f "$lf_bin")
    [[ -x $lf_bin ]] || { echo "run.sh: --lf-bin $lf_bin is not an executable" >&2; exit 2; }
fi
[[ $(id -u) -eq 0 ]] || { echo "run.sh: run as root (it creates network namespaces)" >&2; exit 1; }

# ---------------------------------------------------------------- one run at a time
# Two load tests on the same cores would measure each other: wait for the other to finish.
exec 9<"$repo/loadtest"
if ! flock -n 9; then
    echo "run.sh: another load test is running on this machine; waiting for it (up to 30 min)" >&2
    flock -w 1800 9 || { echo "run.sh: gave up waiting for the other load test" >&2; exit 1; }
fi

# ---------------------------------------------------------------- the load, by mode
if ((quick)); then
    duration=2 warmup=0.5 default_reps=1 overload_secs=10 recover_secs=5 kill_secs=8 kill_at=3
else
    duration=5 warmup=1 default_reps=3 overload_secs=30 recover_secs=10 kill_secs=12 kill_at=4
fi
reps_opt=$reps
reps=${reps_opt:-$default_reps}    # throughput, tcp, calibrate
event_reps=${reps_opt:-1}          # kill, slow, faults, outage-stale, overload: one unless --reps says so
outstanding=200      # closed loop: queries in flight (saturation)
rate=2000            # open loop: the fixed moderate rate of the latency figures
scenario_rate=5000   # open loop rate of the kill and slow scenarios
tcp_rate=1000        # open loop rate of the TCP latency figures (a node sees little DNS over TCP)
channels=8           # client sockets (UDP) or connections (TCP)
slow_delay_ms=200    # the slow backend's added delay
fault_rate=1000      # open loop rate of the refuse, servfail and closed-port faults
blackhole_rate=100   # ... and of the black-holed backend (the resilience goal is stated at 100 QPS)
check_queries=200    # the forwarding check before each measurement
serve_stale=0        # the peers' serve-stale options: on in the outage-stale scenario only
# The record a good answer carries: the responder's address derived from the name, or the
# address of knot's wildcard.
if [[ $upstream == knot ]]; then expect=192.0.2.1; else expect=derived; fi
cache_entries=100000 # dnsdist's packet cache

# ---------------------------------------------------------------- packages and build
peer_packages=(dnsperf dnsdist dnsmasq-base unbound knot gnuplot-nox iproute2 iptables)
if ((install)); then
    missing=()
    for p in "${peer_packages[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    if ((${#missing[@]})); then
        echo "installing: ${missing[*]}" >&2
        apt-get update -qq
        # policy-rc.d exit 101: install without starting the packages' own services.
        made_policy=0
        if [[ ! -e /usr/sbin/policy-rc.d ]]; then
            printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
            made_policy=1
        fi
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
        if ((made_policy)); then rm -f /usr/sbin/policy-rc.d; fi
    fi
fi

build_note=""
if ((build)); then
    echo "building localdns-fallback and the harness (release)" >&2
    cargo build --release --quiet --manifest-path loadtest/Cargo.toml
    # Others may be in the middle of an edit of src/: if the forwarder does not build, measure the
    # binary already there, and say so in the report. With --lf-bin there is nothing to build.
    if [[ -n $lf_bin ]]; then
        :
    elif ! cargo build --release --locked --quiet 2>"${TMPDIR:-/tmp}/loadtest-build.$$"; then
        if [[ -x target/release/localdns-fallback ]]; then
            build_note="the forwarder did not build; measured the existing binary of $(date -r target/release/localdns-fallback '+%F %T')"
            echo "run.sh: WARNING: $build_note:" >&2
            head -5 "${TMPDIR:-/tmp}/loadtest-build.$$" >&2
        else
            cat "${TMPDIR:-/tmp}/loadtest-build.$$" >&2
            rm -f "${TMPDIR:-/tmp}/loadtest-build.$$"
            exit 1
        fi
    fi
    rm -f "${TMPDIR:-/tmp}/loadtest-build.$$"
fi
lf=${lf_bin:-$repo/target/release/localdns-fallback}
dnsload=$repo/loadtest/target/release/dnsload
bare_relay=$repo/loadtest/target/release/bare-relay
responder=$repo/loadtest/target/release/responder
dnsreport=$repo/loadtest/target/release/dnsreport
for b in "$lf" "$dnsload" "$responder" "$dnsreport" "$bare_relay"; do
    [[ -x $b ]] || { echo "run.sh: $b is missing (run without --no-build)" >&2; exit 1; }
done
lf_has_cache=0
lf_help=$("$lf" --help 2>&1 || true)
[[ $lf_help == *--cache-size* ]] && lf_has_cache=1

# ---------------------------------------------------------------- bookkeeping and cleanup
tag=lt$$x$(printf '%04x' $((RANDOM % 65536)))   # unique per run: namespaces are $tag-*

# Namespaces left by a run that was SIGKILLed (no trap ran): lt<PID>x... whose PID is gone.
for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^lt[0-9]+x[0-9a-f]{4}-' || true); do
    owner=${ns#lt}; owner=${owner%%x*}
    if [[ ! -d /proc/$owner ]]; then
        echo "run.sh: removing $ns, left by an earlier run (pid $owner) that did not clean up" >&2
        for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null || true; done
        ip netns del "$ns" 2>/dev/null || true
    fi
done
work=$(mktemp -d /tmp/loadtest.XXXXXX)
stamp=$(date +%Y%m%d-%H%M%S)
out=${out:-$repo/loadtest/results/$stamp}
mkdir -p "$out"
raw=$out/raw.jsonl
: >"$raw"
pids=()          # every process we started (by pid)
made_ns=()       # every namespace we made
ns_seq=0

stop_pid() { # stop_pid PID: SIGTERM, up to 3 s, then SIGKILL
    local p=$1 i
    kill -TERM "$p" 2>/dev/null || return 0
    for i in $(seq 30); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
}
del_ns() { # del_ns NS: kills what still runs inside (children we started), deletes it
    local ns=$1 p
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
}
cleanup() {
    local p ns
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    sleep 0.2
    for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    for ns in "${made_ns[@]}"; do del_ns "$ns"; done
    rm -rf "$work"
}
trap cleanup EXIT
trap 'echo "run.sh: interrupted" >&2; exit 130' INT TERM

note() { echo "[$(date +%H:%M:%S)] $*" >&2; }

# ---------------------------------------------------------------- the network
# new_net K: a node namespace ($node) with the `localdns` link and K upstream namespaces
# (${ups[1]}, ${ups[2]}) at 198.18.K.2, each over its own veth. No default routes anywhere.
new_net() {
    local k n=$1
    ns_seq=$((ns_seq + 1))
    node=$tag-n$ns_seq
    ip netns add "$node"; made_ns+=("$node")
    ip -n "$node" link set lo up
    # LocalDNS's link (a veth: this kernel may lack the dummy type) with both listener addresses.
    ip -n "$node" link add localdns type veth peer name localdns-p
    ip -n "$node" addr add 169.254.10.10/32 dev localdns
    ip -n "$node" addr add 169.254.10.11/32 dev localdns
    ip -n "$node" link set localdns up
    ip -n "$node" link set localdns-p up
    ups=()
    for k in $(seq "$n"); do
        ups[k]=$tag-u$ns_seq-$k
        ip netns add "${ups[k]}"; made_ns+=("${ups[k]}")
        ip -n "${ups[k]}" link set lo up
        ip -n "$node" link add "up$k" type veth peer name eth0 netns "${ups[k]}"
        ip -n "$node" addr add "198.18.$k.1/24" dev "up$k"
        ip -n "${ups[k]}" addr add "198.18.$k.2/24" dev eth0
        ip -n "$node" link set "up$k" up
        ip -n "${ups[k]}" link set eth0 up
        # The way back for kernel-dnat's packets, which keep the listener address as source.
        ip -n "${ups[k]}" route add 169.254.10.0/24 via "198.18.$k.1"
    done
}
drop_net() {
    local ns keep=()
    for ns in "${made_ns[@]}"; do
        if [[ $ns == "$node" || $ns == "$tag-u${node#"$tag"-n}-"* ]]; then del_ns "$ns"; else keep+=("$ns"); fi
    done
    made_ns=("${keep[@]}")
}

# start_upstream K KIND [RESPONDER-FLAGS...]: the upstream in ${ups[K]} (e.g. `--delay-ms 200`,
# `--fault-rcode REFUSED`, `--ttl 2` for the responder); sets up_pid[K] and up_kind[K].
up_pid=() up_kind=()
start_upstream() {
    local k=$1 kind=$2 dir
    shift 2
    up_kind[k]=$kind
    if [[ $kind == knot ]]; then
        dir=$work/knot-${ups[k]}; mkdir -p "$dir"
        cat >"$dir/load.test.zone" <<'ZONE'
$ORIGIN load.test.
$TTL 300
@   SOA ns.load.test. hostmaster.load.test. 1 3600 600 86400 300
@   NS  ns
ns  A   192.0.2.53
*   A   192.0.2.1
*   AAAA 2001:db8::1
ZONE
        cat >"$dir/knot.conf" <<CONF
server:
    rundir: "$dir"
    user: root:root
    listen: 198.18.$k.2@53
    udp-workers: $(nproc)
    tcp-workers: 1
    background-workers: 1
control:
    listen: "$dir/knot.sock"
log:
  - target: stderr
    any: warning
database:
    storage: "$dir"
# Counts the queries knot receives (the forwarding check reads them with knotc); nothing else.
mod-stats:
  - id: count
    request-protocol: on
    server-operation: off
    request-bytes: off
    response-bytes: off
    edns-presence: off
    flag-presence: off
    response-code: off
    reply-nodata: off
    query-type: off
    query-size: off
    reply-size: off
template:
  - id: default
    storage: "$dir"
    file: "%s.zone"
    global-module: mod-stats/count
zone:
  - domain: load.test
CONF
        ip netns exec "${ups[k]}" knotd -c "$dir/knot.conf" 2>"$work/knot-$k.log" 9<&- &
    else
        ip netns exec "${ups[k]}" "$responder" --listen "198.18.$k.2:53" "$@" 2>"$work/responder-$k.log" 9<&- &
    fi
    up_pid[k]=$!
    pids+=("${up_pid[k]}")
    ip netns exec "$node" "$dnsload" probe --server "198.18.$k.2:53" --wait 10 \
        || { echo "run.sh: the $kind upstream in ${ups[k]} did not answer" >&2; cat "$work"/*-"$k".log >&2; return 1; }
}

# upstream_count K: how many queries the upstream in ${ups[K]} has received so far.
upstream_count() {
    local k=$1
    if [[ ${up_kind[k]} == knot ]]; then
        knotc -c "$work/knot-${ups[k]}/knot.conf" stats 2>/dev/null \
            | awk -F' = ' '/request-protocol/ {n += $2} END {print n + 0}'
    else
        ip netns exec "$node" "$dnsload" count --server "198.18.$k.2:53"
    fi
}
upstream_total() { # the sum over the upstreams started for this measurement
    local k n total=0
    for k in "${!up_pid[@]}"; do n=$(upstream_count "$k") || return 1; total=$((total + n)); done
    echo "$total"
}

# check_forwarding SYSTEM REP: before a measurement, proves that the system relays: a short burst
# of fresh names must all get the upstream's answer, and the upstream must have received at least
# as many queries. Appends a phase=check line (check_ok true/false) to the raw file; returns 1 when
# the check failed. The measurement still runs (its figures show what the system did), and the
# report marks the row INVALID and does not rank it.
check_forwarding() {
    local sys=$1 rep=$2 before after line sent good saw ok=true
    before=$(upstream_total) || { note "$sys: cannot read the upstream's query count"; return 1; }
    line=$(ip netns exec "$node" "$dnsload" run --server "$target" --channels 1 --names miss --expect "$expect" \
        --rate "$((check_queries * 5))" --duration 0.2 --warmup 0 --timeout 1 \
        --label "scenario=$scen" --label "system=$sys" --label "rep=$rep" --label phase=check 2>/dev/null) \
        || { note "$sys: the forwarding check could not run"; return 1; }
    sleep 0.2 # what a system sends upstream late (retries) still counts
    after=$(upstream_total) || return 1
    sent=$(grep -o '"sent":[0-9]*' <<<"$line" | cut -d: -f2)
    good=$(grep -o '"good":[0-9]*' <<<"$line" | cut -d: -f2)
    saw=$((after - before))
    if ((sent == 0 || good != sent || saw < sent)); then ok=false; fi
    echo "${line%\}},\"upstream_saw\":$saw,\"check_ok\":$ok}" >>"$raw"
    if [[ $ok != true ]]; then
        note "$sys FAILED the forwarding check: $good of $sent answers were the upstream's, the upstream saw $saw queries"
        return 1
    fi
}

# ---------------------------------------------------------------- the systems under test
all_systems=(direct kernel-dnat bare-relay dnsdist dnsdist-cache dnsmasq unbound localdns-fallback localdns-fallback-base localdns-fallback-2threads localdns-fallback-cache)

# available SYSTEM: empty if it can run here, else why not.
available() {
    case $1 in
        direct|bare-relay) ;;
        kernel-dnat) command -v iptables >/dev/null || echo "iptables is not installed" ;;
        dnsdist|dnsdist-cache) command -v dnsdist >/dev/null || echo "dnsdist is not installed (--install)" ;;
        dnsmasq) command -v dnsmasq >/dev/null || echo "dnsmasq is not installed (--install)" ;;
        unbound) command -v unbound >/dev/null || echo "unbound is not installed (--install)" ;;
        localdns-fallback) ;;
        localdns-fallback-base) [[ -x $lf_base ]] || echo "no --lf-base binary given" ;;
        localdns-fallback-2threads) grep -q -- --udp-threads <<<"$lf_help" || echo "this build has no --udp-threads flag" ;;
        localdns-fallback-cache) ((lf_has_cache)) || echo "this build has no --cache-size flag yet" ;;
        *) echo "unknown system (known: ${all_systems[*]})" ;;
    esac
}

# start_system SYSTEM NUPSTREAMS: starts it in $node; sets $target (where clients send) and
# $sys_pid (whose CPU and memory are measured; empty when there is no process).
start_system() {
    local sys=$1 n=$2 k dir conf
    target=169.254.10.11:53 sys_pid=""
    dir=$work/$sys-$ns_seq; mkdir -p "$dir"
    case $sys in
        direct)
            target=198.18.1.2:53 ;;
        bare-relay)
            # The yardstick: one thread, one connected upstream socket, ID rewrite only.
            ip netns exec "$node" "$bare_relay" --listen 169.254.10.11:53 --upstream 198.18.1.2:53 >"$dir/log" 2>&1 9<&- &
            sys_pid=$! ;;
        kernel-dnat)
            # What AgentBaker's fallback does: nat OUTPUT DNAT of the listener to kube-dns; with
            # two backends, kube-proxy's way of spreading (statistic random).
            for proto in udp tcp; do
                if ((n == 2)); then
                    ip netns exec "$node" iptables -w -t nat -A OUTPUT -d 169.254.10.11/32 -p "$proto" --dport 53 \
                        -m statistic --mode random --probability 0.5 -j DNAT --to-destination 198.18.1.2:53
                    ip netns exec "$node" iptables -w -t nat -A OUTPUT -d 169.254.10.11/32 -p "$proto" --dport 53 \
                        -j DNAT --to-destination 198.18.2.2:53
                else
                    ip netns exec "$node" iptables -w -t nat -A OUTPUT -d 169.254.10.11/32 -p "$proto" --dport 53 \
                        -j DNAT --to-destination 198.18.1.2:53
                fi
            done ;;
        dnsdist|dnsdist-cache)
            conf=$dir/dnsdist.conf
            {
                echo 'setLocal("169.254.10.11:53")'
                echo 'setSecurityPollSuffix("")'
                for k in $(seq "$n"); do
                    echo "newServer({address=\"198.18.$k.2:53\", name=\"up$k\", checkName=\"probe.load.test.\"})"
                done
                if [[ $sys == dnsdist-cache ]]; then
                    echo "pc = newPacketCache($cache_entries)"
                    echo 'getPool(""):setCache(pc)'
                    # Stale entries are served (for up to an hour) only when every backend is down.
                    if ((serve_stale)); then echo 'setStaleCacheEntriesTTL(3600)'; fi
                fi
            } >"$conf"
            ip netns exec "$node" dnsdist --supervised --disable-syslog -C "$conf" >"$dir/log" 2>&1 9<&- &
            sys_pid=$! ;;
        dnsmasq)
            local servers=()
            for k in $(seq "$n"); do servers+=("--server=198.18.$k.2"); done
            # Answers stale entries at once and refreshes them behind (dnsmasq 2.87 and later).
            if ((serve_stale)); then servers+=(--use-stale-cache); fi
            ip netns exec "$node" dnsmasq --keep-in-foreground --conf-file=/dev/null --no-resolv --no-hosts \
                --bind-interfaces --listen-address=169.254.10.11 --port=53 --user=root --group=root \
                --pid-file= --log-facility=- --dns-forward-max=$((5 * outstanding)) \
                "${servers[@]}" >"$dir/log" 2>&1 9<&- &
            sys_pid=$! ;;
        unbound)
            conf=$dir/unbound.conf
            {
                cat <<CONF
server:
    interface: 169.254.10.11
    port: 53
    do-ip6: no
    do-daemonize: no
    chroot: ""
    username: ""
    directory: "$dir"
    pidfile: ""
    logfile: ""
    use-syslog: no
    verbosity: 0
    num-threads: $(nproc)
    so-reuseport: yes
    so-rcvbuf: 4m
    so-sndbuf: 4m
    access-control: 0.0.0.0/0 allow
    module-config: "iterator"
    qname-minimisation: no
    do-not-query-localhost: no
    outgoing-range: 8192
    num-queries-per-thread: 4096
    incoming-num-tcp: 64
    minimal-responses: yes
    # test. is one of unbound's default local zones (RFC 6761): without this unbound answers
    # every name under load.test. NXDOMAIN itself and never forwards one.
    local-zone: "test." nodefault
CONF
                if ((serve_stale)); then
                    # RFC 8767: try the upstream for 1.8 s, then answer from the expired entry.
                    printf '    serve-expired: yes\n    serve-expired-ttl: 3600\n    serve-expired-client-timeout: 1800\n'
                fi
                cat <<CONF
remote-control:
    control-enable: no
forward-zone:
    name: "."
CONF
                for k in $(seq "$n"); do echo "    forward-addr: 198.18.$k.2@53"; done
            } >"$conf"
            ip netns exec "$node" unbound -d -c "$conf" >"$dir/log" 2>&1 9<&- &
            sys_pid=$! ;;
        localdns-fallback|localdns-fallback-base|localdns-fallback-2threads|localdns-fallback-cache)
            local args=(--node-listen 169.254.10.10:53 --cluster-listen 169.254.10.11:53
                        --node-upstream 198.18.1.2:53 --log-level warn)
            for k in $(seq "$n"); do args+=(--cluster-upstream "198.18.$k.2:53"); done
            if [[ $sys != localdns-fallback-cache ]] && ((lf_has_cache)); then args+=(--cache-size 0); fi
            # The scaling row: the same forwarder with two relay threads per listener.
            if [[ $sys == localdns-fallback-2threads ]]; then args+=(--udp-threads 2); fi
            # Extra flags to try (--lf-args), split on spaces.
            if [[ -n $lf_args ]]; then read -r -a extra_lf <<<"$lf_args"; args+=("${extra_lf[@]}"); fi
            # The baseline row (--lf-base): another build with the same flags, in the same run.
            local bin=$lf
            [[ $sys == localdns-fallback-base ]] && bin=$lf_base
            ip netns exec "$node" "$bin" "${args[@]}" >"$dir/log" 2>&1 9<&- &
            sys_pid=$! ;;
    esac
    [[ -n $sys_pid ]] && pids+=("$sys_pid")
    if ! ip netns exec "$node" "$dnsload" probe --server "$target" --wait 15; then
        echo "run.sh: $sys did not come up; its log:" >&2
        cat "$dir/log" >&2 2>/dev/null || true
        return 1
    fi
}

stop_system() { [[ -n ${sys_pid:-} ]] && stop_pid "$sys_pid"; sys_pid=""; }

# teardown: the system, the upstreams and the namespaces of this measurement.
teardown() {
    local k
    stop_system
    for k in "${!up_pid[@]}"; do stop_pid "${up_pid[k]}"; done
    up_pid=()
    drop_net
}

# ---------------------------------------------------------------- one measurement
# load LABELS... -- DNSLOAD-ARGS...: runs the generator in the node namespace against $target,
# appends its JSON line (with the labels) to the raw file. With --generator dnsperf, phases that
# dnsperf can run go through it (same JSON shape).
load() {
    local labels=() args=() line
    while [[ $1 != -- ]]; do labels+=(--label "$1"); shift; done
    shift
    args=("$@")
    local cmd=run
    if [[ $generator == dnsperf && $use_dnsperf == 1 ]]; then cmd=dnsperf; args+=(--datafile "$datafile"); fi
    args+=(--expect "$expect")
    [[ -n $sys_pid ]] && args+=(--watch-pid "$sys_pid")
    local p
    for p in "${up_pid[@]}"; do args+=(--also-pid "$p"); done
    [[ $cmd == run && $gen_threads != 1 && ! " ${args[*]} " =~ " --threads " ]] && args+=(--threads "$gen_threads")
    if line=$(ip netns exec "$node" "$dnsload" "$cmd" --server "$target" --channels "$channels" "${labels[@]}" "${args[@]}"); then
        echo "$line" >>"$raw"
    else
        echo "run.sh: the generator failed (${labels[*]})" >&2
    fi
}
use_dnsperf=0 datafile=""

idle_rss() { # idle_rss SYSTEM REP: the memory of a system that has only just started
    [[ -n $sys_pid ]] || return 0
    local kib
    kib=$(awk '/^VmRSS:/ {print $2}' "/proc/$sys_pid/status" 2>/dev/null) || return 0
    printf '{"scenario":"%s","system":"%s","rep":"%s","phase":"idle","rss_idle_kib":%s}\n' "$scen" "$1" "$2" "${kib:-0}" >>"$raw"
}

# Query files for dnsperf: unique names for each miss phase (no cache may have seen them), the
# 100 hit names, and a mix.
make_datafiles() {
    [[ $generator == dnsperf ]] || return 0
    command -v dnsperf >/dev/null || { echo "run.sh: dnsperf is not installed (--install)" >&2; exit 1; }
    local n=$((quick ? 600000 : 1500000))
    "$dnsload" names --names miss --count "$n" --seed 1 >"$work/miss-sat.txt"
    "$dnsload" names --names miss --count "$n" --seed 2 >"$work/miss-rate.txt"
    "$dnsload" names --names hit --count 100 --seed 0 >"$work/hit.txt"
    "$dnsload" names --names mix --count "$n" --seed 3 >"$work/mix.txt"
}

# ---------------------------------------------------------------- scenarios
pick_systems() { # pick_systems DEFAULT...: the systems to run (after --systems), skipping the unavailable
    local want=("$@") s why
    if [[ -n $systems_opt ]]; then IFS=, read -r -a want <<<"$systems_opt"; fi
    run_systems=()
    for s in "${want[@]}"; do
        why=$(available "$s")
        if [[ -n $why ]]; then note "skipping $s: $why"; else run_systems+=("$s"); fi
    done
}

scenario_throughput() {
    scen=throughput
    pick_systems "${all_systems[@]}"
    make_datafiles
    note "throughput: ${run_systems[*]}; $reps repetition(s), ${duration}s per phase after ${warmup}s warm-up"
    local rep s
    for rep in $(seq "$reps"); do
        for s in "${run_systems[@]}"; do
            note "rep $rep/$reps: $s"
            new_net 1
            if ! { start_upstream 1 "$upstream" && start_system "$s" 1; }; then note "skipping $s this time"; teardown; continue; fi
            idle_rss "$s" "$rep"
            check_forwarding "$s" "$rep" || true
            local L=("scenario=throughput" "system=$s" "rep=$rep")
            use_dnsperf=1
            datafile=$work/miss-sat.txt
            load "${L[@]}" phase=sat-miss -- --names miss --outstanding "$outstanding" --duration "$duration" --warmup "$warmup"
            if ((misses_only)); then use_dnsperf=0; teardown; continue; fi
            datafile=$work/hit.txt
            load "${L[@]}" phase=sat-hit -- --names hit --outstanding "$outstanding" --duration "$duration" --warmup "$warmup"
            datafile=$work/mix.txt
            load "${L[@]}" phase=sat-mix -- --names mix --outstanding "$outstanding" --duration "$duration" --warmup "$warmup"
            datafile=$work/miss-rate.txt
            load "${L[@]}" phase=rate-miss -- --names miss --rate "$rate" --duration "$duration" --warmup "$warmup"
            use_dnsperf=0
            teardown
        done
    done
}

scenario_tcp() {
    scen=tcp
    local s tcp_systems=()
    # The bare relay is UDP only.
    for s in "${all_systems[@]}"; do [[ $s == bare-relay ]] || tcp_systems+=("$s"); done
    pick_systems "${tcp_systems[@]}"
    make_datafiles
    note "tcp: ${run_systems[*]}; $channels connections"
    local rep
    for rep in $(seq "$reps"); do
        for s in "${run_systems[@]}"; do
            note "rep $rep/$reps: $s over TCP"
            new_net 1
            if ! { start_upstream 1 "$upstream" && start_system "$s" 1; }; then note "skipping $s this time"; teardown; continue; fi
            check_forwarding "$s" "$rep" || true
            local L=("scenario=tcp" "system=$s" "rep=$rep")
            use_dnsperf=1
            datafile=$work/miss-sat.txt
            load "${L[@]}" phase=tcp-sat -- --tcp --names miss --outstanding "$outstanding" --duration "$duration" --warmup "$warmup"
            datafile=$work/miss-rate.txt
            load "${L[@]}" phase=tcp-rate -- --tcp --names miss --rate "$tcp_rate" --duration "$duration" --warmup "$warmup"
            use_dnsperf=0
            teardown
        done
    done
}

# Two kube-dns backends; the second is lost mid-run, two ways: `kill` SIGKILLs its server (the
# address stays up, so the kernel answers ICMP port unreachable, as for a crashed process whose pod
# IP is still routed); `blackhole` makes its namespace drop every DNS packet silently (a pod gone
# without a trace).
scenario_kill() {
    scen=kill
    local reps=$event_reps
    pick_systems kernel-dnat dnsdist dnsmasq unbound localdns-fallback
    note "kill: ${run_systems[*]}; ${scenario_rate} QPS, backend 2 lost at ${kill_at}s of ${kill_secs}s"
    local rep s how event
    for rep in $(seq "$reps"); do
        for how in kill blackhole; do
            for s in "${run_systems[@]}"; do
                note "rep $rep/$reps: $s, one backend lost ($how)"
                new_net 2
                if ! { start_upstream 1 own && start_upstream 2 own && start_system "$s" 2; }; then
                    note "skipping $s this time"; teardown; continue
                fi
                check_forwarding "$s" "$rep" || true
                if [[ $how == kill ]]; then
                    event="kill -KILL ${up_pid[2]}"
                else
                    event="ip netns exec ${ups[2]} iptables -w -I INPUT -p udp --dport 53 -j DROP &&
                           ip netns exec ${ups[2]} iptables -w -I INPUT -p tcp --dport 53 -j DROP"
                fi
                load "scenario=kill" "system=$s" "rep=$rep" "phase=$how" -- --names miss --rate "$scenario_rate" \
                    --duration "$kill_secs" --warmup 0 --timeout 5 --timeline \
                    --event-at "$kill_at" --event-cmd "$event"
                # Reap the killed server quietly: its death was the point.
                if [[ $how == kill ]]; then wait "${up_pid[2]}" 2>/dev/null || true; fi
                teardown
            done
        done
    done
}

# Two kube-dns backends, open loop; at fault_at s one of them goes wrong, one way per phase:
#   refuse       it answers every query REFUSED (CoreDNS does when max_concurrent overflows)
#   servfail     it answers every query SERVFAIL
#   closed-port  its server is SIGKILLed: nothing listens on 53 in its namespace, so the kernel
#                answers ICMP port unreachable (rate-limited: a burst, then about one a second)
#   blackhole    its namespace drops every DNS packet, no ICMP (a pod gone), at 100 QPS
# Reported per system: errors and timeouts after the fault, latency of the queries sent during
# it (p50/p99/max), recovery time.
all_faults=(refuse servfail closed-port blackhole)
scenario_faults() {
    scen=faults
    local reps=$event_reps faults=("${all_faults[@]}")
    if [[ -n $faults_opt ]]; then IFS=, read -r -a faults <<<"$faults_opt"; fi
    pick_systems kernel-dnat dnsdist dnsmasq unbound localdns-fallback
    note "faults: ${faults[*]}; ${run_systems[*]}; backend 2 goes wrong at ${kill_at}s of ${kill_secs}s"
    local rep s fault event qps flags
    for rep in $(seq "$reps"); do
        for fault in "${faults[@]}"; do
            flags=() qps=$fault_rate
            case $fault in
                refuse) flags=(--fault-rcode REFUSED) ;;
                servfail) flags=(--fault-rcode SERVFAIL) ;;
                closed-port) ;;
                blackhole) qps=$blackhole_rate ;;
                *) echo "run.sh: unknown fault $fault (${all_faults[*]})" >&2; exit 2 ;;
            esac
            for s in "${run_systems[@]}"; do
                note "rep $rep/$reps: $s, backend 2: $fault at $qps QPS"
                new_net 2
                if ! { start_upstream 1 own && start_upstream 2 own "${flags[@]}" && start_system "$s" 2; }; then
                    note "skipping $s this time"; teardown; continue
                fi
                check_forwarding "$s" "$rep" || true
                case $fault in
                    refuse|servfail) event="kill -USR1 ${up_pid[2]}" ;;
                    closed-port) event="kill -KILL ${up_pid[2]}" ;;
                    blackhole) event="ip netns exec ${ups[2]} iptables -w -I INPUT -p udp --dport 53 -j DROP &&
                                      ip netns exec ${ups[2]} iptables -w -I INPUT -p tcp --dport 53 -j DROP" ;;
                esac
                load "scenario=faults" "system=$s" "rep=$rep" "phase=$fault" "rate=$qps" -- --names miss --rate "$qps" \
                    --duration "$kill_secs" --warmup 0 --timeout 5 --slow-ms 100 --timeline \
                    --event-at "$kill_at" --event-cmd "$event"
                if [[ $fault == closed-port ]]; then wait "${up_pid[2]}" 2>/dev/null || true; fi
                teardown
            done
        done
    done
}

# Every upstream down while the cache holds expired entries: 20 fresh names are asked once
# (cached with the responder's TTL of 2 s; localdns-fallback keeps them its minimum of 5 s), the
# harness waits 6 s (expired everywhere), then drops every DNS packet in both upstream namespaces
# and asks all 20 names again in 6 rounds, one every 0.5 s (or when the last is done): the first
# lookup of each name during the outage, and the following ones. The peers get their serve-stale
# options (dnsdist setStaleCacheEntriesTTL, unbound serve-expired with RFC 8767's client timeout
# of 1.8 s, dnsmasq --use-stale-cache).
scenario_outage_stale() {
    scen=outage-stale
    local reps=$event_reps
    serve_stale=1
    pick_systems dnsdist-cache dnsmasq unbound localdns-fallback-cache
    note "outage-stale: ${run_systems[*]}"
    local rep s down
    for rep in $(seq "$reps"); do
        for s in "${run_systems[@]}"; do
            note "rep $rep/$reps: $s, every upstream down with expired entries cached"
            new_net 2
            if ! { start_upstream 1 own --ttl 2 && start_upstream 2 own --ttl 2 && start_system "$s" 2; }; then
                note "skipping $s this time"; teardown; continue
            fi
            check_forwarding "$s" "$rep" || true
            down="ip netns exec ${ups[1]} iptables -w -I INPUT -p udp --dport 53 -j DROP &&
                  ip netns exec ${ups[1]} iptables -w -I INPUT -p tcp --dport 53 -j DROP &&
                  ip netns exec ${ups[2]} iptables -w -I INPUT -p udp --dport 53 -j DROP &&
                  ip netns exec ${ups[2]} iptables -w -I INPUT -p tcp --dport 53 -j DROP"
            local line
            if line=$(ip netns exec "$node" "$dnsload" stale --server "$target" --count 20 --expire-wait 6 \
                --rounds 6 --interval 0.5 --timeout 5 --event-cmd "$down" --expect "$expect" \
                --label scenario=outage-stale --label "system=$s" --label "rep=$rep" --label phase=outage-stale); then
                echo "$line" >>"$raw"
            else
                echo "run.sh: the stale measurement failed ($s)" >&2
            fi
            teardown
        done
    done
    serve_stale=0
}

# Two backends; the second answers every query 200 ms late.
scenario_slow() {
    scen=slow
    local reps=$event_reps
    pick_systems kernel-dnat dnsdist dnsmasq unbound localdns-fallback
    note "slow: ${run_systems[*]}; backend 2 adds ${slow_delay_ms} ms, ${scenario_rate} QPS"
    local rep s
    for rep in $(seq "$reps"); do
        for s in "${run_systems[@]}"; do
            note "rep $rep/$reps: $s, one slow backend"
            new_net 2
            if ! { start_upstream 1 own && start_upstream 2 own --delay-ms "$slow_delay_ms" && start_system "$s" 2; }; then
                note "skipping $s this time"; teardown; continue
            fi
            check_forwarding "$s" "$rep" || true
            load "scenario=slow" "system=$s" "rep=$rep" phase=slow -- --names miss --rate "$scenario_rate" \
                --duration "$duration" --warmup "$warmup" --timeout 5 --slow-ms 100
            teardown
        done
    done
}

# Twice the system's own saturation rate for a while, then a light load: memory, shed rate
# (REFUSED), and the time until every query is answered well (< 50 ms) again.
scenario_overload() {
    scen=overload
    local reps=$event_reps
    pick_systems kernel-dnat dnsdist dnsmasq unbound localdns-fallback
    note "overload: ${run_systems[*]}; 2x saturation for ${overload_secs}s, then 1000 QPS for ${recover_secs}s"
    local rep s sat line
    for rep in $(seq "$reps"); do
        for s in "${run_systems[@]}"; do
            note "rep $rep/$reps: $s overloaded"
            new_net 1
            if ! { start_upstream 1 own && start_system "$s" 1; }; then note "skipping $s this time"; teardown; continue; fi
            check_forwarding "$s" "$rep" || true
            line=$(ip netns exec "$node" "$dnsload" run --server "$target" --channels "$channels" --names miss \
                --outstanding "$outstanding" --duration 2 --warmup 0.5)
            sat=$(grep -o '"qps":[0-9]*' <<<"$line" | cut -d: -f2)
            load "scenario=overload" "system=$s" "rep=$rep" phase=overload "sat_qps=$sat" -- --names miss \
                --rate "$((2 * sat)):$overload_secs,1000:$recover_secs" --warmup 0 --timeout 1 --slow-ms 50 \
                --timeline --event-at "$overload_secs" --event-cmd true
            teardown
        done
    done
}

# Which upstream and which generator are fastest against `direct` (the ceiling)? dnsload with one
# thread (the harness's default), with two threads, and dnsperf (a sender and a receiver thread).
scenario_calibrate() {
    scen=calibrate
    local rep kind gen extra
    local saved_gen=$generator
    generator=dnsperf make_datafiles_if_possible
    for rep in $(seq "$reps"); do
        for kind in own knot; do
            if [[ $kind == knot ]] && ! command -v knotd >/dev/null; then note "skipping knot: not installed (--install)"; continue; fi
            for gen in dnsload dnsload-2threads dnsperf; do
                if [[ $gen == dnsperf ]] && ! command -v dnsperf >/dev/null; then continue; fi
                note "rep $rep/$reps: upstream $kind, generator $gen"
                new_net 1
                if ! { start_upstream 1 "$kind" && start_system direct 1; }; then teardown; continue; fi
                extra=()
                [[ $gen == dnsload-2threads ]] && extra=(--threads 2)
                generator=own
                [[ $gen == dnsperf ]] && generator=dnsperf
                use_dnsperf=1 datafile=$work/miss-sat.txt
                load "scenario=calibrate" "system=direct" "rep=$rep" "phase=$kind+$gen" -- --names miss \
                    --outstanding "$outstanding" --duration "$duration" --warmup "$warmup" "${extra[@]}"
                use_dnsperf=0 generator=$saved_gen
                teardown
            done
        done
    done
}
make_datafiles_if_possible() { command -v dnsperf >/dev/null && make_datafiles || true; }

# ---------------------------------------------------------------- main
# How busy the machine is before we start (other work on the 2 cores moves every figure).
busy_now() {
    local a b
    a=($(head -1 /proc/stat)); sleep 2; b=($(head -1 /proc/stat))
    local idle=$(( (b[4] + b[5]) - (a[4] + a[5]) )) total=0 i
    for i in 1 2 3 4 5 6 7 8; do total=$((total + b[i] - a[i])); done
    echo $(( total > 0 ? 100 * (total - idle) / total : 0 ))
}
commit=$(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)
[[ -n $lf_bin ]] && commit="$commit (harness; the forwarder is --lf-bin)"
dirty=$(git -C "$repo" status --porcelain -- src Cargo.toml 2>/dev/null | head -1)
{
    echo "localdns-fallback load test, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "commit $commit${dirty:+ (src/ has uncommitted changes)}; $(nproc) cores; kernel $(uname -r)"
    [[ -n $build_note ]] && echo "NOTE: $build_note"
    [[ -n $lf_args ]] && echo "localdns-fallback extra flags: $lf_args"
    echo "localdns-fallback binary: $lf ($("$lf" --version 2>&1 | head -1), sha256 $(sha256sum "$lf" | cut -c1-12), built $(date -r "$lf" '+%F %T'))"
    [[ -n $lf_base ]] && echo "localdns-fallback-base binary: $lf_base ($("$lf_base" --version 2>&1 | head -1), sha256 $(sha256sum "$lf_base" | cut -c1-12), built $(date -r "$lf_base" '+%F %T'))"
    echo "scenario $scenario; generator $generator; upstream $upstream; repetitions $reps (kill, slow, faults, outage-stale, overload: $event_reps); quick=$quick"
    echo "machine before the run: $(busy_now)% busy over 2 s, load average $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "load: saturation = $outstanding queries outstanding over $channels sockets; latency at $rate QPS open loop; generator threads $gen_threads"
} >"$out/header.txt"
cat "$out/header.txt" >&2
started=$(date +%s)

case $scenario in
    all) scenario_throughput; scenario_tcp; scenario_kill; scenario_slow; scenario_faults; scenario_outage_stale; scenario_overload ;;
    *) "scenario_${scenario//-/_}" ;;
esac

note "done in $(( $(date +%s) - started ))s"
"$dnsreport" --raw "$raw" --out "$out" --header "$out/header.txt"
echo
echo "results: $out/results.jsonl (one JSON line per system and metric set), raw runs: $raw"
if [[ -f $out/chart.png ]]; then echo "chart: $out/chart.png"; fi
