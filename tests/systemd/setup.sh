#!/bin/bash
# Run inside a freshly booted test container: installs the stand-ins and our units the way a node
# gets them, then starts the stand-in node (upstreams, then LocalDNS) and waits until it serves.
set -euo pipefail
install -m 0644 /opt/test/localdns.service /opt/test/localdns.slice /opt/test/test-upstreams.service \
    /etc/systemd/system/
# Where AKS keeps LocalDNS's script: the stand-in's ExecStart= and ExecStopPost= name this path.
install -D -m 0755 /opt/test/localdns.sh /opt/azure/containers/localdns/localdns.sh
# Our binary, script and units, installed by our own script (it runs daemon-reload: systemd is PID 1
# here).
/opt/units/install.sh --binary /opt/bin/localdns-fallback
systemctl start test-upstreams.service localdns.service
