#!/bin/bash
# Run inside a freshly booted test container: installs the stand-ins and our units the way a node
# gets them, then starts the stand-in node (upstreams, then LocalDNS) and waits until it serves.
#   setup.sh [--fallback-watchdog DUR]    DUR: a test drop-in shortening the fallback's WatchdogSec
set -euo pipefail
watchdog=""
while (($#)); do
    case $1 in
        --fallback-watchdog) watchdog=$2; shift ;;
        *) echo "setup.sh: unknown argument $1" >&2; exit 2 ;;
    esac
    shift
done

install -m 0644 /opt/test/localdns.service /opt/test/localdns.slice /opt/test/test-upstreams.service \
    /etc/systemd/system/
# Our binary and units, installed by our own script (it runs daemon-reload: systemd is PID 1 here).
/opt/units/install.sh --binary /opt/bin/localdns-fallback
if [[ -n $watchdog ]]; then
    mkdir -p /etc/systemd/system/localdns-fallback.service.d
    printf '[Service]\nWatchdogSec=%s\n' "$watchdog" >/etc/systemd/system/localdns-fallback.service.d/90-test-watchdog.conf
    systemctl daemon-reload
fi
systemctl start test-upstreams.service localdns.service
