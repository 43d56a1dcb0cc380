#!/bin/bash
# The node around LocalDNS, inside the container's own network namespace (nspawn --private-network:
# nothing here can reach the host or beyond):
# - "VNet DNS": dnsmasq on 168.63.129.16, on a veth of its own;
# - "kube-dns pod": dnsmasq on 10.244.0.5, on another veth;
# - kube-proxy's iptables-mode nat rules for kube-system/kube-dns pointing at the pod. Not hooked
#   into OUTPUT or PREROUTING: they are only read (by the fallback's discovery), never applied;
# - /run/systemd/resolve/resolv.conf as systemd-resolved writes it when LocalDNS is not running;
# - systemd-networkd's DHCP lease of the node's link to the VNet, naming the VNet DNS (networkd
#   keeps it so whatever LocalDNS's drop-in makes of resolv.conf).
# Each stand-in answers the test names with its own marker addresses (markers.env).
# Runs as test-upstreams.service (Type=notify): ready once both servers answer.
set -euo pipefail
. /opt/test/markers.env

veth() { # NAME ADDRESS: a veth pair, both ends up, ADDRESS/32 on NAME
    ip link del "$1" 2>/dev/null || true
    ip link add "$1" type veth peer name "$1-peer"
    ip link set "$1-peer" up
    ip link set "$1" up
    ip addr add "$2/32" dev "$1"
}
veth vnetdns "$VNETDNS"
veth kubedns "$KUBEDNS_POD"
ip link set lo up

iptables-restore <<RULES
*nat
:KUBE-SERVICES - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-SVC-TCOU7JCQXEZGVUNU - [0:0]
:KUBE-SVC-ERIFXISQEP7F7OF4 - [0:0]
:KUBE-SEP-IT2ZTR26TO4XFPTO - [0:0]
:KUBE-SEP-YIL6JZP7A3QYXJU2 - [0:0]
-A KUBE-SERVICES -d 10.0.0.10/32 -p udp -m comment --comment "kube-system/kube-dns:dns cluster IP" -m udp --dport 53 -j KUBE-SVC-TCOU7JCQXEZGVUNU
-A KUBE-SERVICES -d 10.0.0.10/32 -p tcp -m comment --comment "kube-system/kube-dns:dns-tcp cluster IP" -m tcp --dport 53 -j KUBE-SVC-ERIFXISQEP7F7OF4
-A KUBE-SVC-TCOU7JCQXEZGVUNU ! -s 10.244.0.0/16 -d 10.0.0.10/32 -p udp -m comment --comment "kube-system/kube-dns:dns cluster IP" -m udp --dport 53 -j KUBE-MARK-MASQ
-A KUBE-SVC-TCOU7JCQXEZGVUNU -m comment --comment "kube-system/kube-dns:dns -> $KUBEDNS_POD:53" -j KUBE-SEP-IT2ZTR26TO4XFPTO
-A KUBE-SEP-IT2ZTR26TO4XFPTO -s $KUBEDNS_POD/32 -m comment --comment "kube-system/kube-dns:dns" -j KUBE-MARK-MASQ
-A KUBE-SEP-IT2ZTR26TO4XFPTO -p udp -m comment --comment "kube-system/kube-dns:dns" -m udp -j DNAT --to-destination $KUBEDNS_POD:53
-A KUBE-SVC-ERIFXISQEP7F7OF4 ! -s 10.244.0.0/16 -d 10.0.0.10/32 -p tcp -m comment --comment "kube-system/kube-dns:dns-tcp cluster IP" -m tcp --dport 53 -j KUBE-MARK-MASQ
-A KUBE-SVC-ERIFXISQEP7F7OF4 -m comment --comment "kube-system/kube-dns:dns-tcp -> $KUBEDNS_POD:53" -j KUBE-SEP-YIL6JZP7A3QYXJU2
-A KUBE-SEP-YIL6JZP7A3QYXJU2 -s $KUBEDNS_POD/32 -m comment --comment "kube-system/kube-dns:dns-tcp" -j KUBE-MARK-MASQ
-A KUBE-SEP-YIL6JZP7A3QYXJU2 -p tcp -m comment --comment "kube-system/kube-dns:dns-tcp" -m tcp -j DNAT --to-destination $KUBEDNS_POD:53
-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
COMMIT
RULES

mkdir -p /run/systemd/resolve /run/localdns-test
/opt/test/localdns.sh resolved-reload

# The lease as systemd-networkd writes it (sd-dhcp-lease.c dhcp_lease_save: its key=value state,
# written to a temporary file renamed over /run/systemd/netif/leases/<ifindex>), for the link
# that leads to the VNet DNS. Azure's DHCP offers the VNet DNS as DNS= and the wire server in
# its private option 245.
leases=/run/systemd/netif/leases
ifindex=$(cat /sys/class/net/vnetdns/ifindex)
mkdir -p "$leases"
cat >"$leases/.#$ifindex.lease" <<LEASE
# This is private data. Do not parse.
ADDRESS=10.224.0.4
NETMASK=255.255.0.0
ROUTER=10.224.0.1
SERVER_ADDRESS=$VNETDNS
NEXT_SERVER=$VNETDNS
BROADCAST=10.224.255.255
T1=2h 15min
T2=3h 56min 15s
LIFETIME=4h 30min
DNS=$VNETDNS
DOMAINNAME=abc123.bx.internal.cloudapp.net
CLIENTID=ff0d2f3b5a000200001a2b3c4d5e6f7a8b9c
OPTION_245=a83f8110
LEASE
mv -f "$leases/.#$ifindex.lease" "$leases/$ifindex"

serve() { # ADDRESS CLUSTER_ANSWER EXTERNAL_ANSWER: an authoritative-only dnsmasq, logging to the journal
    dnsmasq --keep-in-foreground --conf-file=/dev/null --no-resolv --no-hosts --no-poll \
        --bind-interfaces --listen-address="$1" --pid-file= --user=root --log-facility=- \
        --host-record="$CLUSTER_NAME,$2" --host-record="$EXTERNAL_NAME,$3" &
}
serve "$VNETDNS" "$VNETDNS_CLUSTER_IP" "$VNETDNS_EXTERNAL_IP"
serve "$KUBEDNS_POD" "$KUBEDNS_CLUSTER_IP" "$KUBEDNS_EXTERNAL_IP"
for _ in $(seq 100); do
    if [[ $(dig +short +time=1 +tries=1 @"$VNETDNS" "$EXTERNAL_NAME") == "$VNETDNS_EXTERNAL_IP" &&
        $(dig +short +time=1 +tries=1 @"$KUBEDNS_POD" "$CLUSTER_NAME") == "$KUBEDNS_CLUSTER_IP" ]]; then
        systemd-notify --ready --status="VNet DNS on $VNETDNS, kube-dns pod on $KUBEDNS_POD"
        wait -n
        exit 1
    fi
    sleep 0.05
done
echo "upstream stand-ins did not answer" >&2
exit 1
