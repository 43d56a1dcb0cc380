#!/usr/bin/env bash
# The standby beside knot (as LocalDNS) under 2,000 + 500 queries a second while a seeded schedule
# hits knot every 10-40 s, every query attributed; a verdict line, CSVs and a timeline picture.
#   loadtest/chaos.sh [--seed N] [--minutes M] [--out DIR] [--lf-bin PATH] [--lf-args 'FLAGS']
#                     [--no-build] [--install]
# Defaults: seed 1, 15 minutes, loadtest/results/chaos-<date-time>/. Root. See loadtest/README.md.
# Exit status 0 when the verdict is PASS, 1 when FAIL, 2 on a usage or set-up error.
set -euo pipefail
cd "$(dirname "$0")/.."
seed=1 minutes=15 out="" lf_bin="" lf_args="" build=1 install=""
while (($#)); do
    case $1 in
        --seed) seed=$2; shift 2 ;;
        --minutes) minutes=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        --lf-bin) lf_bin=$2; shift 2 ;;
        --lf-args) lf_args=$2; shift 2 ;;
        --no-build) build=""; shift ;;
        --install) install=1; shift ;;
        *) sed -n '2,7p' "$0" >&2; exit 2 ;;
    esac
done
[[ $(id -u) -eq 0 ]] || { echo "chaos.sh: needs root (network namespaces, cgroups)" >&2; exit 2; }
packages=(knot fonts-dejavu-core iproute2 util-linux)
if [[ -n $install ]]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null
fi
for tool in knotd nsenter ip; do
    command -v "$tool" >/dev/null || { echo "chaos.sh: no $tool (--install: ${packages[*]})" >&2; exit 2; }
done
[[ -d /sys/fs/cgroup/cpu || -f /sys/fs/cgroup/cgroup.controllers ]] || { echo "chaos.sh: no cgroup cpu controller" >&2; exit 2; }
if [[ -n $build ]]; then
    [[ -n $lf_bin ]] || nice -n 10 cargo build --release --quiet --bin localdns-fallback
    (cd loadtest && nice -n 10 cargo build --release --quiet --bin chaos --bin responder)
fi
lf_bin=${lf_bin:-target/release/localdns-fallback}
out=${out:-loadtest/results/chaos-$(date -u +%Y%m%d-%H%M%S)}
mkdir -p "$out"

# What the run makes is named after this shell; the binary removes it, and so does this trap if
# the binary could not (SIGKILLed). A run SIGKILLed with its shell leaves names whose pid is gone:
# removed here at the next start.
name=lchaos$$
cleanup() {
    for ns in "$name-node" "$name-up"; do
        [[ -e /run/netns/$ns ]] || continue
        for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
        ip netns del "$ns" 2>/dev/null || true
    done
    for cg in /sys/fs/cgroup/unified/$name-knot /sys/fs/cgroup/cpu/$name-knot /sys/fs/cgroup/$name-knot; do
        [[ -d $cg ]] && rmdir "$cg" 2>/dev/null || true
    done
}
trap cleanup EXIT
for ns in $(ip netns list | awk '{print $1}' | grep -E '^lchaos[0-9]+-(node|up)$' || true); do
    pid=${ns#lchaos}; pid=${pid%%-*}
    [[ -d /proc/$pid ]] && continue
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$p" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
    rmdir /sys/fs/cgroup/unified/lchaos"$pid"-knot /sys/fs/cgroup/cpu/lchaos"$pid"-knot 2>/dev/null || true
done

echo "chaos.sh: $($lf_bin --version 2>/dev/null | head -1) ($lf_bin), seed $seed, $minutes min, into $out"
status=0
# Above the builds and tests a shared machine runs beside it (nice 10 or 0): knot waiting hundreds
# of milliseconds for a CPU is a starved LocalDNS to the standby, and the run would measure the
# neighbours. Its own load is small (knot, the standby and the pods' client: a few % of a core).
nice -n -5 loadtest/target/release/chaos --standby "$lf_bin" --responder loadtest/target/release/responder \
    --out "$out" --name "$name" --seed "$seed" --minutes "$minutes" --lf-args "$lf_args" || status=$?
echo "chaos.sh: picture $out/timeline.png, timeline $out/timeline.csv, events $out/events.csv"
exit "$status"
