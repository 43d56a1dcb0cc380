#!/usr/bin/env bash
# Runs the cargo-fuzz targets of fuzz/ one after another, each for a given time, starting from the
# seed corpus in fuzz/corpus/<target>/. New inputs go to a working corpus (fuzz/work/<target>/ by
# default, not tracked), so the seed corpus in the repository only changes when someone copies a
# finding into it on purpose. Crashing inputs land in fuzz/artifacts/<target>/; each one becomes a
# regression test (tests/fuzz_regressions.rs) or a corpus file, then is deleted.
#
#   fuzz/run-long.sh                      every target, 10 minutes each
#   fuzz/run-long.sh --seconds 3600 udp_relay client_query
#   fuzz/run-long.sh --seconds 6 --work /tmp/x   what CI runs (tests/run.sh)
#
# Needs cargo-fuzz (`cargo install cargo-fuzz --locked`). There is no nightly toolchain here:
# RUSTC_BOOTSTRAP=1 lets stable rustc take the -Z flags cargo-fuzz passes (AddressSanitizer and
# libFuzzer's coverage instrumentation both work that way).
set -euo pipefail
cd "$(dirname "$0")"

usage() {
    sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'
}

seconds=600
work=work
targets=()
while (($#)); do
    case $1 in
        --seconds) seconds=${2:?--seconds needs a number}; shift 2 ;;
        --work) work=${2:?--work needs a directory}; shift 2 ;;
        -h | --help) usage; exit 0 ;;
        -*) echo "run-long.sh: unknown option $1" >&2; usage >&2; exit 2 ;;
        *) targets+=("$1"); shift ;;
    esac
done
[[ $seconds =~ ^[0-9]+$ ]] || { echo "run-long.sh: --seconds takes whole seconds, not $seconds" >&2; exit 2; }
command -v cargo-fuzz >/dev/null || {
    echo "run-long.sh: cargo-fuzz is not installed (cargo install cargo-fuzz --locked)" >&2
    exit 1
}
export RUSTC_BOOTSTRAP=1

mapfile -t all < <(cargo fuzz list)
if ((${#targets[@]} == 0)); then
    targets=("${all[@]}")
fi
for t in "${targets[@]}"; do
    printf '%s\n' "${all[@]}" | grep -qx "$t" || { echo "run-long.sh: no fuzz target $t (have: ${all[*]})" >&2; exit 2; }
done

started=$(date +%s)
cargo fuzz build --release
echo "fuzz: built ${#all[@]} targets in $(($(date +%s) - started)) s; running ${#targets[@]} for ${seconds} s each"

failed=()
for t in "${targets[@]}"; do
    mkdir -p "$work/$t"
    log="$work/$t.log"
    # -timeout: one input taking over 10 s is a hang; -rss_limit_mb: over 2 GiB is unbounded
    # growth (the daemon lives in a 128 MiB slice). The seed corpus is read, never written.
    if cargo fuzz run --release "$t" "$work/$t" "corpus/$t" -- \
        -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
        >"$log" 2>&1; then
        runs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" | grep -o '[0-9]*$' || echo '?')
        cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*$' || echo '?')
        echo "fuzz: $t: ok, $runs runs, coverage $cov"
    else
        failed+=("$t")
        [[ $log = /* ]] || log=$PWD/$log
        echo "fuzz: $t: FAILED (log: $log)"
        grep -E 'panicked at|ERROR: libFuzzer|ERROR: AddressSanitizer|SUMMARY|Test unit written to' "$log" | head -8 | sed 's/^/    /'
    fi
done
echo "fuzz: done in $(($(date +%s) - started)) s"
if ((${#failed[@]})); then
    echo "fuzz: crashes in ${failed[*]}; reproduce with: RUSTC_BOOTSTRAP=1 cargo fuzz run <target> fuzz/artifacts/<target>/<file>" >&2
    exit 1
fi
