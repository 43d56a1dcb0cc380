#!/usr/bin/env bash
# A self-contained demo of the main job, as root on a fresh machine: builds the forwarder, makes a
# private "node" network namespace with the two LocalDNS listener addresses on a link named
# `localdns`, a "VNet DNS" namespace (168.63.129.16, answering external names) and a "kube-dns"
# namespace (a pod IP, answering cluster.local). The node namespace gets a resolv.conf naming the
# VNet DNS and kube-proxy-shaped iptables rules naming the kube-dns pod, so the forwarder finds its
# upstreams itself, as on a real node. Then both listeners are asked with dig; the last line says
# "demo OK" when every answer was the expected one (exit 0), "demo FAILED" otherwise (exit 1).
# Everything it makes is removed on exit, also on Ctrl-C or failure.
# Nothing leaves the namespaces: the host's network is never touched.
set -euo pipefail
cd "$(dirname "$0")/.."

[[ $(id -u) -eq 0 ]] || { echo "demo: run as root (it creates network namespaces)" >&2; exit 1; }
for tool in dig dnsmasq ip iptables-restore; do
    command -v "$tool" >/dev/null || missing+=("$tool")
done
if [[ -n "${missing[*]:-}" ]]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends bind9-dnsutils dnsmasq-base iproute2 iptables >/dev/null
fi

cargo build --release --locked --quiet
bin=$PWD/target/release/localdns-fallback

tag=lfdemo$$
node=$tag-node vnet=$tag-vnet kube=$tag-kube
work=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    for ns in "$node" "$vnet" "$kube"; do ip netns del "$ns" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT INT TERM

for ns in "$node" "$vnet" "$kube"; do ip netns add "$ns"; ip -n "$ns" link set lo up; done

# The node: LocalDNS's link and addresses (a veth here: this kernel may lack the dummy type).
ip -n "$node" link add localdns type veth peer name localdns-p
ip -n "$node" addr add 169.254.10.10/32 dev localdns
ip -n "$node" addr add 169.254.10.11/32 dev localdns
ip -n "$node" link set localdns up
ip -n "$node" link set localdns-p up

# The VNet DNS and a kube-dns pod, each one hop away from the node.
link() { # link NS INDEX ADDRESS
    ip -n "$node" link add "up$2" type veth peer name eth0 netns "$1"
    ip -n "$node" addr add "198.18.$2.1/24" dev "up$2"
    ip -n "$node" link set "up$2" up
    ip -n "$1" addr add "198.18.$2.2/24" dev eth0
    ip -n "$1" addr add "$3/32" dev eth0
    ip -n "$1" link set eth0 up
    ip -n "$node" route add "$3/32" via "198.18.$2.2"
}
link "$vnet" 1 168.63.129.16
link "$kube" 2 10.244.0.5

serve() { # serve NS ADDRESS DNSMASQ-ARGS...
    local ns=$1 addr=$2; shift 2
    ip netns exec "$ns" dnsmasq --keep-in-foreground --conf-file=/dev/null --no-resolv --no-hosts \
        --bind-interfaces --listen-address="$addr" --user=root --group=root --pid-file= \
        --local-ttl=30 "$@" 2>"$work/$ns.log" &
    pids+=($!)
}
serve "$vnet" 168.63.129.16 --address=/example.com/93.184.216.34
serve "$kube" 10.244.0.5 --host-record=kubernetes.default.svc.cluster.local,10.0.0.1 \
    --host-record=kube-dns.kube-system.svc.cluster.local,10.0.0.10 --address=/example.com/93.184.216.34

# What the forwarder discovers: systemd-resolved's upstream file, still listing LocalDNS's own
# address first, and kube-proxy's rules for kube-dns (not hooked into OUTPUT: they only inform).
printf 'nameserver 169.254.10.10\nnameserver 168.63.129.16\nsearch node.internal.cloudapp.net\n' >"$work/resolv.conf"
ip netns exec "$node" iptables-restore <<'RULES'
*nat
:KUBE-SERVICES - [0:0]
:KUBE-SVC-TCOU7JCQXEZGVUNU - [0:0]
:KUBE-SEP-IT2ZTR26TO4XFPTO - [0:0]
-A KUBE-SERVICES -d 10.0.0.10/32 -p udp -m comment --comment "kube-system/kube-dns:dns cluster IP" -m udp --dport 53 -j KUBE-SVC-TCOU7JCQXEZGVUNU
-A KUBE-SVC-TCOU7JCQXEZGVUNU -m comment --comment "kube-system/kube-dns:dns -> 10.244.0.5:53" -j KUBE-SEP-IT2ZTR26TO4XFPTO
-A KUBE-SEP-IT2ZTR26TO4XFPTO -p udp -m comment --comment "kube-system/kube-dns:dns" -m udp -j DNAT --to-destination 10.244.0.5:53
COMMIT
RULES
flags=(--resolv-conf "$work/resolv.conf" --dhcp-leases none --discovery iptables)
echo "== what it finds on the node"
echo "\$ localdns-fallback discover"
ip netns exec "$node" "$bin" discover "${flags[@]}"
echo

ip netns exec "$node" "$bin" "${flags[@]}" 2>"$work/fwd.log" &
pids+=($!)
for _ in $(seq 50); do
    ip netns exec "$node" dig +short +time=1 +tries=1 @169.254.10.11 health-check.localdns.local >/dev/null 2>&1 && break
    sleep 0.1
done

failed=()
ask() { # ask DESCRIPTION EXPECTED DIG-ARGS...   (EXPECTED: text the reply must hold)
    local what=$1 expected=$2 reply; shift 2
    printf '\n$ dig %s        # %s\n' "$*" "$what"
    reply=$(ip netns exec "$node" dig +time=3 +tries=1 +noall +comments +answer "$@" | grep -E 'status|\sIN\s' || true)
    echo "$reply"
    grep -qF -- "$expected" <<<"$reply" || failed+=("$what: expected \"$expected\"")
}
echo "== localdns-fallback serving 169.254.10.10 (node) and 169.254.10.11 (cluster)"
ask "ClusterFirst pod, cluster name -> kube-dns" 10.0.0.1 @169.254.10.11 kubernetes.default.svc.cluster.local
ask "ClusterFirst pod, external name -> kube-dns" 93.184.216.34 @169.254.10.11 www.example.com
ask "host, cluster name -> kube-dns" 10.0.0.10 @169.254.10.10 kube-dns.kube-system.svc.cluster.local
ask "host, external name -> VNet DNS" 93.184.216.34 @169.254.10.10 www.example.com +tcp
ask "LocalDNS health probe, answered locally" "status: NOERROR" @169.254.10.10 health-check.localdns.local

echo; echo "== the forwarder's log"
kill -TERM "${pids[-1]}"
status=0; wait "${pids[-1]}" || status=$?
cat "$work/fwd.log"
((status == 0)) || failed+=("the forwarder exited with status $status on SIGTERM")
echo
if ((${#failed[@]})); then
    printf 'demo FAILED: %s\n' "${failed[@]}" >&2
    exit 1
fi
echo "demo OK: both listeners answered all 5 questions the way LocalDNS routes them, then stopped cleanly"
