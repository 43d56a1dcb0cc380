#!/bin/bash
# Stand-in for AKS's /opt/azure/containers/localdns/localdns.sh, run by the stand-in
# localdns.service. It behaves the way the fallback must cope with:
#   start    (ExecStart) deletes and recreates link `localdns` with 169.254.10.10/32 and .11/32,
#            runs the "CoreDNS" (tests/systemd/standin.rs `serve`), which binds both at once with
#            SO_REUSEPORT like CoreDNS (without it when /run/localdns-test/variant says `plain`),
#            serves about a second later ($COREDNS_DELAY_MS) and then sends READY=1; points the
#            node's DNS at .10 (the networkd drop-in) and sends WATCHDOG=1 pings. A clean stop or a
#            failure its EXIT trap sees deletes the link; a SIGKILL leaves link and addresses behind.
#   cleanup  (ExecStopPost) removes the DNS drop-in and "reloads networkd" asynchronously, so
#            resolv.conf lists the VNet DNS again only $RESOLVED_DELAY later (the start-up race the fallback must survive).
#            While /run/localdns-test/resolved-hold exists there is no reload at all: the test runs
#            `localdns.sh resolved-reload` itself when it wants resolv.conf to change.
#            It never touches the link.
#   resolved-reload  rewrites /run/systemd/resolve/resolv.conf from the drop-in's presence, as
#            systemd-resolved would.
# The test steers failures with /run/localdns-test/fail:
#   crash     each start SIGKILLs itself before touching the link (link and addresses survive);
#   graceful  each start fails with exit 1 and its EXIT trap deletes the link;
#   MODE:N    the next N starts fail that way, then starts work again (the file is removed).
set -euo pipefail
. /opt/test/markers.env
state=/run/localdns-test
dropin=$state/70-localdns.conf   # stands for /run/systemd/network/*.network.d/70-localdns.conf
mkdir -p "$state"

resolved_reload() {
    local tmp=/run/systemd/resolve/.resolv.conf.tmp
    mkdir -p /run/systemd/resolve
    {
        echo "# This is /run/systemd/resolve/resolv.conf managed by man:systemd-resolved(8)."
        if [[ -e $dropin ]]; then echo "nameserver 169.254.10.10"; else echo "nameserver $VNETDNS"; fi
        echo "search abc123.bx.internal.cloudapp.net"
    } >"$tmp"
    mv -f "$tmp" /run/systemd/resolve/resolv.conf
}

start() {
    local fail mode
    fail=$(cat "$state/fail" 2>/dev/null || true)
    mode=${fail%%:*}
    if [[ $fail == *:* ]]; then
        local left=${fail#*:}
        if ((left > 1)); then echo "$mode:$((left - 1))" >"$state/fail"; else rm -f "$state/fail"; fi
    fi
    case $mode in
        crash)
            echo "stand-in LocalDNS: crashing at start (SIGKILL), link left as it is"
            kill -KILL $$
            ;;
        graceful)
            echo "stand-in LocalDNS: failing at start; the EXIT trap deletes the link"
            trap 'ip link del localdns 2>/dev/null || true' EXIT
            exit 1
            ;;
    esac

    local coredns="" pinger=""
    # A clean stop (SIGTERM from systemctl stop) exits 0 through the EXIT trap, like LocalDNS.
    trap 'exit 0' TERM INT
    trap 'kill $pinger $coredns 2>/dev/null || true; rm -f "$dropin"; ip link del localdns 2>/dev/null || true' EXIT

    ip link del localdns 2>/dev/null || true
    # LocalDNS makes a dummy link; this kernel may have no dummy type, so a veth stands in.
    ip link add localdns type dummy 2>/dev/null || ip link add localdns type veth peer name localdns-peer
    ip link set localdns up
    ip link set localdns-peer up 2>/dev/null || true
    ip addr add 169.254.10.10/32 dev localdns
    ip addr add 169.254.10.11/32 dev localdns

    # The "CoreDNS": binds both listeners at once (SO_REUSEPORT unless the test asked for the
    # variant without), serves $COREDNS_DELAY_MS later and then sends READY=1 itself.
    local reuseport=""
    [[ $(cat "$state/variant" 2>/dev/null || true) == plain ]] && reuseport=--no-reuseport
    /opt/bin/standin serve $reuseport --delay-ms "${COREDNS_DELAY_MS:-1000}" \
        "$CLUSTER_NAME=$LOCALDNS_CLUSTER_IP" "$EXTERNAL_NAME=$LOCALDNS_EXTERNAL_IP" "$HEALTH_NAME=127.0.0.1" &
    coredns=$!
    echo "$coredns" >"$state/coredns.pid"
    touch "$dropin"
    resolved_reload
    (while sleep 10; do systemd-notify WATCHDOG=1; done) &
    pinger=$!
    # Like localdns.sh's watchdog loop: when CoreDNS goes away (or never binds), the service fails.
    wait "$coredns" || true
    echo "stand-in LocalDNS: CoreDNS exited"
    exit 1
}

cleanup() {
    rm -f "$dropin"
    # networkctl reload returns before resolved rewrites resolv.conf: do it later, from outside
    # this unit (its processes are killed once ExecStopPost returns).
    if [[ -e $state/resolved-hold ]]; then
        echo "stand-in LocalDNS: resolv.conf reload held by the test"
        return 0
    fi
    systemd-run --quiet --no-block --collect --on-active="${RESOLVED_DELAY:-500ms}" \
        /opt/test/localdns.sh resolved-reload
}

case ${1:-start} in
    start) start ;;
    cleanup) cleanup ;;
    resolved-reload) resolved_reload ;;
    *) echo "usage: localdns.sh start|cleanup|resolved-reload" >&2; exit 2 ;;
esac
