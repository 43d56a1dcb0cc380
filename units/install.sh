#!/usr/bin/env bash
# Installs localdns-fallback where AKS nodes keep LocalDNS's pieces, or removes exactly what it
# installed:
#   units/install.sh [--binary PATH] [--root DIR]        install (binary defaults to the release build)
#   units/install.sh --uninstall [--root DIR]             remove
# --root installs into another root file system (an image being built, a test container).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=""
binary="$here/../target/release/localdns-fallback"
action=install
while (($#)); do
    case $1 in
        --uninstall) action=uninstall ;;
        --binary) binary=$2; shift ;;
        --root) root=$2; shift ;;
        *) echo "install.sh: unknown argument $1" >&2; exit 2 ;;
    esac
    shift
done

bin_path=$root/opt/azure/containers/localdns/localdns-fallback
unit_path=$root/etc/systemd/system/localdns-fallback.service
dropin_dir=$root/etc/systemd/system/localdns.service.d
dropin_path=$dropin_dir/50-localdns-fallback.conf

reload() {
    # Only the running systemd of this root; an image being built has none.
    if [[ -z $root && -d /run/systemd/system ]]; then systemctl daemon-reload; fi
}

case $action in
    install)
        [[ -x $binary ]] || { echo "install.sh: no binary at $binary (cargo build --release first)" >&2; exit 1; }
        install -D -m 0755 "$binary" "$bin_path"
        install -D -m 0644 "$here/localdns-fallback.service" "$unit_path"
        install -D -m 0644 "$here/localdns.service.d/50-localdns-fallback.conf" "$dropin_path"
        reload
        echo "installed $bin_path, $unit_path, $dropin_path"
        ;;
    uninstall)
        rm -f "$bin_path" "$unit_path" "$dropin_path"
        rmdir --ignore-fail-on-non-empty "$dropin_dir" "$(dirname "$bin_path")" 2>/dev/null || true
        reload
        echo "removed $bin_path, $unit_path, $dropin_path"
        ;;
esac
