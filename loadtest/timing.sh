#!/usr/bin/env bash
# The standby's timing goals as figures: runs the suite's real-process timing tests REPS times
# each, alone (one test at a time), and reports every `figure` line they print (tests/common/
# figure.rs) as min / median / max over the repetitions against its goal. Run as root on a quiet
# machine: these are the goals the suite itself asserts only with margins.
#
#   loadtest/timing.sh [REPS]            default 5; exit 1 if a median misses its goal
set -euo pipefail
cd "$(dirname "$0")/.."
reps=${1:-5}
[[ $reps =~ ^[1-9][0-9]*$ ]] || { echo "timing.sh: REPS is a count, not $reps" >&2; exit 2; }
filter='group(real-time) | binary(flapping) | (binary(standby) & test(hung)) | (binary(systemd) & test(s9_))'
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for ((i = 1; i <= reps; i++)); do
    echo "timing.sh: repetition $i of $reps" >&2
    cargo nextest run --locked --no-fail-fast --test-threads 1 --no-capture -E "$filter" 2>&1 \
        | grep -E '^figure ' >>"$out" || true
done
# name value goal -> name min median max goal met
sort -k2,2 -k3,3n "$out" | awk '
    { v[$2] = v[$2] " " $3; goal[$2] = $5 }
    END {
        bad = 0
        printf "%-66s %8s %8s %8s %8s  %s\n", "figure (ms)", "min", "median", "max", "goal", "n"
        for (k in v) {
            n = split(substr(v[k], 2), a, " ")
            med = a[int((n + 1) / 2)]
            met = (med <= goal[k]) ? "" : "  MISSED"
            if (met != "") bad = 1
            printf "%-66s %8.1f %8.1f %8.1f %8.1f  %d%s\n", k, a[1], med, a[n], goal[k], n, met
        }
        exit bad
    }'
