#!/usr/bin/env bash
# Benchmark (not a test) of kube-dns discovery on a big kube-proxy nat table: loads a table of
# SERVICES services (default 10000) shaped as kube-proxy's iptables mode writes it into a private
# network namespace, then times `localdns-fallback discover --discovery iptables` there RUNS times
# and prints the median and the table size. Run as root. Nothing is hooked into a base chain and
# the namespace is removed on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
services=${SERVICES:-10000}
runs=${RUNS:-15}
[[ $(id -u) -eq 0 ]] || { echo "run as root" >&2; exit 1; }
cargo build --release --locked --quiet
bin=$PWD/target/release/localdns-fallback
ns=lfbench$$
work=$(mktemp -d)
trap 'ip netns del "$ns" 2>/dev/null || true; rm -rf "$work"' EXIT
ip netns add "$ns"

awk -v n="$services" 'BEGIN {
    print "*nat"; print ":KUBE-SERVICES - [0:0]"; print ":KUBE-MARK-MASQ - [0:0]"
    for (i = 0; i < n; i++) printf ":KUBE-SVC-U%015d - [0:0]\n:KUBE-SEP-U%015d - [0:0]\n", i, i
    print ":KUBE-SVC-TCOU7JCQXEZGVUNU - [0:0]"
    for (k = 0; k < 3; k++) printf ":KUBE-SEP-DNS%011d - [0:0]\n", k
    for (i = 0; i < n; i++) {
        ip = sprintf("10.%d.%d.%d", 16 + int(i / 65536), int(i / 256) % 256, i % 256)
        printf "-A KUBE-SERVICES -d %s/32 -p tcp -m comment --comment \"ns%d/web%d:http cluster IP\" -m tcp --dport 80 -j KUBE-SVC-U%015d\n", ip, i, i, i
        printf "-A KUBE-SVC-U%015d -m comment --comment \"ns%d/web%d:http -> 10.244.%d.%d:8080\" -j KUBE-SEP-U%015d\n", i, i, i, int(i / 256) % 256, i % 256, i
        printf "-A KUBE-SEP-U%015d -p tcp -m comment --comment \"ns%d/web%d:http\" -m tcp -j DNAT --to-destination 10.244.%d.%d:8080\n", i, i, i, int(i / 256) % 256, i % 256
        if (i == int(n / 2)) {
            print "-A KUBE-SERVICES -d 10.0.0.10/32 -p udp -m comment --comment \"kube-system/kube-dns:dns cluster IP\" -m udp --dport 53 -j KUBE-SVC-TCOU7JCQXEZGVUNU"
            for (k = 0; k < 3; k++) {
                prob = (k < 2) ? sprintf("-m statistic --mode random --probability %.11f ", 1 / (3 - k)) : ""
                printf "-A KUBE-SVC-TCOU7JCQXEZGVUNU -m comment --comment \"kube-system/kube-dns:dns -> 10.244.9.%d:53\" %s-j KUBE-SEP-DNS%011d\n", k + 1, prob, k
                printf "-A KUBE-SEP-DNS%011d -p udp -m comment --comment \"kube-system/kube-dns:dns\" -m udp -j DNAT --to-destination 10.244.9.%d:53\n", k, k + 1
            }
        }
    }
    print "COMMIT"
}' >"$work/nat.rules"
ip netns exec "$ns" iptables-restore "$work/nat.rules"
rules=$(ip netns exec "$ns" iptables -t nat -S | wc -l)
echo "nat table: $services services, $rules rules ($(iptables --version))"

printf 'nameserver 198.18.0.1\n' >"$work/resolv.conf"
ip netns exec "$ns" "$bin" discover --discovery iptables --resolv-conf "$work/resolv.conf" | sed -n 3,3p
times=()
for _ in $(seq "$runs"); do
    start=$(date +%s%N)
    ip netns exec "$ns" "$bin" discover --discovery iptables --resolv-conf "$work/resolv.conf" >/dev/null
    times+=($(( ($(date +%s%N) - start) / 1000000 )))
done
sorted=($(printf '%s\n' "${times[@]}" | sort -n))
echo "discover (iptables source, $runs runs): median ${sorted[$((runs / 2))]} ms, min ${sorted[0]} ms, max ${sorted[-1]} ms"
