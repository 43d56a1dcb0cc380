#!/bin/bash
# Run inside a freshly booted test container: installs the stand-ins and our units the way a node
# gets them, then starts the stand-in node (upstreams, then LocalDNS) and waits until it serves.
#   setup.sh [drop-in|on-failure] [standby]
# on-failure: LocalDNS's unit carries the node image's two lines (node-image-wiring.conf) and only
# our binary and units are installed; standby: localdns-fallback-standby.service is enabled and
# started after LocalDNS.
set -euo pipefail
wiring=${1:-drop-in}
standby=${2:-}
install -m 0644 /opt/test/localdns.service /opt/test/localdns.slice /opt/test/test-upstreams.service \
    /etc/systemd/system/
if [[ $wiring == on-failure ]]; then
    install -D -m 0644 /opt/test/node-image-wiring.conf /etc/systemd/system/localdns.service.d/10-node-image.conf
fi
# Where AKS keeps LocalDNS's script: the stand-in's ExecStart= and ExecStopPost= name this path.
install -D -m 0755 /opt/test/localdns.sh /opt/azure/containers/localdns/localdns.sh
# The VNet DNS and kube-dns first: on a node they are there long before any of ours starts.
systemctl start test-upstreams.service
# Our binary, script and units, installed by our own script (it runs daemon-reload: systemd is PID 1
# here). With --standby it also starts the standby unit, which serves until LocalDNS, started
# next, answers, and then hands the flows to it.
/opt/units/install.sh --binary /opt/bin/localdns-fallback --wiring "$wiring" ${standby:+--standby}
systemctl start localdns.service
