#!/bin/bash
# Run inside a freshly booted test container: installs the stand-ins and our units the way a node
# gets them, then starts the stand-in node (upstreams, then LocalDNS) and waits until it serves.
#   setup.sh [lines|no-lines] [standby|no-standby]
# lines: LocalDNS's unit already carries the node image's two lines (node-image-wiring.conf);
# no-lines: it does not, and install.sh adds them. no-standby: after install, an administrator's
# `systemctl disable --now localdns-fallback-standby.service`.
set -euo pipefail
lines=${1:-no-lines}
standby=${2:-standby}
install -m 0644 /opt/test/localdns.service /opt/test/localdns.slice /opt/test/test-upstreams.service \
    /etc/systemd/system/
if [[ $lines == lines ]]; then
    install -D -m 0644 /opt/test/node-image-wiring.conf /etc/systemd/system/localdns.service.d/10-node-image.conf
fi
# Where AKS keeps LocalDNS's script: the stand-in's ExecStart= and ExecStopPost= name this path.
install -D -m 0755 /opt/test/localdns.sh /opt/azure/containers/localdns/localdns.sh
# The VNet DNS and kube-dns first: on a node they are there long before any of ours starts.
systemctl start test-upstreams.service
# Our binary and units, installed by our own script (it runs daemon-reload: systemd is PID 1 here,
# and starts the standby, which serves until LocalDNS, started next, answers, then hands the flows
# to it).
/opt/units/install.sh --binary /opt/bin/localdns-fallback
if [[ $standby == no-standby ]]; then
    systemctl disable --now localdns-fallback-standby.service
fi
systemctl start localdns.service
