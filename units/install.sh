#!/usr/bin/env bash
# Installs localdns-fallback where AKS nodes keep LocalDNS's pieces, removes exactly what it
# installed, or checks an installed tree (for an image pipeline, after `dpkg -i` or this script):
#   units/install.sh [--binary PATH] [--root DIR] [WIRING]   install (binary defaults to the release build)
#   units/install.sh --uninstall [--root DIR]                remove
#   units/install.sh --check [--root DIR] [WIRING]           verify; exit 1 naming every problem
# WIRING says what starts the fallback (README, "Wiring"):
#   --wiring auto        (the default) the node as it is: where LocalDNS's unit carries the node
#                        image's two lines, on-failure with --standby; elsewhere drop-in;
#   --wiring on-failure  the node image's own two lines in localdns.service
#                        (OnFailure=localdns-fallback.service and an ExecStartPre= that stops it):
#                        only our binary and units are installed, and LocalDNS's unit must have both;
#   --wiring drop-in     our drop-in on localdns.service and the trigger path unit;
#   --standby            also enable localdns-fallback-standby.service, which runs beside LocalDNS
#                        and takes over within 0.5 s of it going silent (with on-failure).
# --root works on another root file system (an image being built, a test container). --no-start
# enables the standby unit without starting it (the package's postinst: nothing starts at install).
# --upgrade (the postinst on an upgrade) keeps what was chosen since: a drop-in in place stays the
# wiring, and a standby whose enablement is gone (`systemctl disable`) stays disabled.
#
# The Debian package ships this script as /usr/share/localdns-fallback/install.sh, beside the
# drop-in (localdns.service.d/, inactive there), and runs it from its maintainer scripts
# (units/debian/). dpkg itself puts the binary, the handoff script and the units in place: files
# whose source is not beside the script are the package's, left as they are (never copied, never
# removed; --uninstall there removes only what the script added: the drop-in and the standby's
# enablement).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

# ---- What is installed: one line per file, SOURCE DESTINATION MODE. ---------------------------
# SOURCE is relative to units/ ("binary" is the --binary file); DESTINATION is relative to the root.
# Install, uninstall and --check all read this list, and the .deb (Cargo.toml,
# [package.metadata.deb] assets) must hold the same files: tests/shipping.rs compares them.
# Every wiring needs the first three; the drop-in wiring also the last three (the .deb holds all).
files=(
    "binary                                        opt/azure/containers/localdns/localdns-fallback                  0755"
    "localdns-fallback.service                     etc/systemd/system/localdns-fallback.service                     0644"
    "localdns-fallback-standby.service             etc/systemd/system/localdns-fallback-standby.service             0644"
)
dropin_files=(
    "localdns-fallback-handoff                     opt/azure/containers/localdns/localdns-fallback-handoff          0755"
    "localdns-fallback.path                        etc/systemd/system/localdns-fallback.path                        0644"
    "localdns.service.d/50-localdns-fallback.conf  etc/systemd/system/localdns.service.d/50-localdns-fallback.conf  0644"
)
# What enables the standby unit (as `systemctl enable` makes it).
standby_link=etc/systemd/system/multi-user.target.wants/localdns-fallback-standby.service
# ---- What wires the fallback to LocalDNS: lines --check requires in the installed drop-in. --------
# One entry per directive, "[Section] Key=value", exactly as in
# units/localdns.service.d/50-localdns-fallback.conf: the trigger, the starts on failure, restart
# and start, and the handoff back.
# Update this list when the drop-in changes (tests/shipping.rs fails on any directive it misses).
dropin=etc/systemd/system/localdns.service.d/50-localdns-fallback.conf
dropin_directives=(
    "[Unit] Wants=localdns-fallback.path"
    "[Service] ExecStartPre=-/opt/azure/containers/localdns/localdns-fallback-handoff starting"
    "[Service] ExecStartPost=-/opt/azure/containers/localdns/localdns-fallback-handoff ready"
    "[Service] ExecStop=-/opt/azure/containers/localdns/localdns-fallback-handoff stopping"
    "[Service] ExecStopPost="
    "[Service] ExecStopPost=-/opt/azure/containers/localdns/localdns-fallback-handoff stopped"
)
# The drop-in resets LocalDNS's ExecStopPost= list so that the fallback's start runs first, and
# restates LocalDNS's own commands after it: these, which must be exactly what LocalDNS's unit
# (with its other drop-ins) has, or install refuses and --check fails.
localdns_stop_post=("/opt/azure/containers/localdns/localdns.sh cleanup")
for command in "${localdns_stop_post[@]}"; do dropin_directives+=("[Service] ExecStopPost=$command"); done
# Where systemd looks for units, first to last.
unit_dirs=(etc/systemd/system run/systemd/system lib/systemd/system usr/lib/systemd/system)
# ---- Another fallback of the same name. ------------------------------------------------------------
# Some AKS images ship a localdns-fallback.service of their own: NAT redirects of the listener
# addresses, applied by /opt/azure/containers/localdns/localdns-fallback.sh. Ours is the unit whose
# ExecStart= runs this binary; any other unit at our path is neither overwritten by install nor
# removed by --uninstall, and --check names it.
unit=etc/systemd/system/localdns-fallback.service
# ------------------------------------------------------------------------------------------------

root=""
binary=""
action=install
wiring=auto
standby=""
no_start=""
upgrade=""
# Run from the package (no units beside the script): see the top.
packaged=""
[[ -f $here/localdns-fallback.service ]] || packaged=1
while (($#)); do
    case $1 in
        --uninstall) action=uninstall ;;
        --check) action=check ;;
        --binary) binary=$2; shift ;;
        --root) root=$2; shift ;;
        --wiring)
            wiring=${2:-}; shift
            [[ $wiring == auto || $wiring == drop-in || $wiring == on-failure ]] ||
                { echo "install.sh: --wiring auto, drop-in or on-failure, not \"$wiring\"" >&2; exit 2; }
            ;;
        --standby) standby=1 ;;
        --no-start) no_start=1 ;;
        --upgrade) upgrade=1 ;;
        *) echo "install.sh: unknown argument $1" >&2; exit 2 ;;
    esac
    shift
done
root=${root%/}
# The binary: the release build beside the sources, or the package's, already in place.
if [[ -z $binary ]]; then
    if [[ -n $packaged ]]; then binary=$root/opt/azure/containers/localdns/localdns-fallback; else binary=$here/../target/release/localdns-fallback; fi
fi

reload() {
    # Only the running systemd of this root; an image being built has none.
    if [[ -z $root && -d /run/systemd/system ]]; then systemctl daemon-reload; fi
}

# The installed paths, for messages.
installed() {
    local entry src dest mode out=""
    for entry in "${files[@]}"; do
        read -r src dest mode <<<"$entry"
        out+="${out:+, }$root/$dest"
    done
    echo "$out"
}

# LocalDNS's unit file in this root, in systemd's order of precedence; nothing if there is none.
localdns_unit() {
    local dir
    for dir in "${unit_dirs[@]}"; do
        if [[ -f $root/$dir/localdns.service ]]; then echo "$root/$dir/localdns.service"; return; fi
    done
}

# LocalDNS's own ExecStopPost= commands, one per line, as systemd assembles them from its unit
# file and its drop-ins other than ours (in file-name order; an empty assignment empties the list).
localdns_own_stop_post() {
    local localdns dropins=() name dir
    localdns=$(localdns_unit)
    [[ -n $localdns ]] || return 0
    for name in $(for dir in "${unit_dirs[@]}"; do
        [[ -d $root/$dir/localdns.service.d ]] && ls "$root/$dir/localdns.service.d"; done | grep '\.conf$' | sort -u); do
        [[ $name == "${dropin##*/}" ]] && continue
        for dir in "${unit_dirs[@]}"; do
            if [[ -f $root/$dir/localdns.service.d/$name ]]; then
                dropins+=("$root/$dir/localdns.service.d/$name"); break
            fi
        done
    done
    service_list ExecStopPost "$localdns" "${dropins[@]}"
}

# The values of the [Service] list KEY in these unit files, one per line, as systemd assembles
# the list: in order, an empty assignment emptying it.
service_list() { section_list Service "$@"; }

# The same for the list KEY of [SECTION].
section_list() {
    local want="[$1]" key=$2; shift 2
    awk -v key="$key" -v want="$want" '
        /^[ \t]*\[/ { section = $0; gsub(/[ \t]/, "", section); next }
        section == want && $0 ~ "^[ \t]*" key "[ \t]*=" {
            v = $0; sub(/^[^=]*=[ \t]*/, "", v); sub(/[ \t]+$/, "", v)
            if (v == "") n = 0; else list[++n] = v
        }
        END { for (i = 1; i <= n; i++) print list[i] }' "$@"
}

# LocalDNS's unit file followed by its drop-ins (ours included), in systemd's order.
localdns_files() {
    local localdns name dir
    localdns=$(localdns_unit)
    [[ -n $localdns ]] || return 0
    echo "$localdns"
    for name in $(for dir in "${unit_dirs[@]}"; do
        [[ -d $root/$dir/localdns.service.d ]] && ls "$root/$dir/localdns.service.d"; done | grep '\.conf$' | sort -u); do
        for dir in "${unit_dirs[@]}"; do
            if [[ -f $root/$dir/localdns.service.d/$name ]]; then
                echo "$root/$dir/localdns.service.d/$name"; break
            fi
        done
    done
}

# One line per line of the node image's wiring that LocalDNS's unit lacks; nothing when it has
# both (or when this root has no LocalDNS unit: an image being built may install it later).
on_failure_mismatch() {
    local localdns unit_files=()
    localdns=$(localdns_unit)
    [[ -n $localdns ]] || return 0
    # (A here-string, not < <(...): a root being built may have no /dev/fd.)
    mapfile -t unit_files <<<"$(localdns_files)"
    # OnFailure= takes a space-separated list.
    section_list Unit OnFailure "${unit_files[@]}" | tr ' ' '\n' | grep -qx localdns-fallback.service ||
        echo "LocalDNS's unit $localdns has no OnFailure=localdns-fallback.service: the on-failure wiring needs it"
    service_list ExecStartPre "${unit_files[@]}" | grep -Eq 'systemctl +stop +localdns-fallback(\.service)?$' ||
        echo "LocalDNS's unit $localdns has no ExecStartPre= that stops localdns-fallback.service (e.g. ExecStartPre=-/usr/bin/systemctl stop localdns-fallback.service): without it the fallback stays beside a LocalDNS that starts again"
}

# One line naming the difference when LocalDNS's own ExecStopPost= is not what the drop-in
# restates; nothing when it is (or when this root has no LocalDNS unit).
stop_post_mismatch() {
    [[ $wiring == drop-in ]] || return 0
    local own restated localdns
    localdns=$(localdns_unit)
    [[ -n $localdns ]] || return 0
    own=$(localdns_own_stop_post)
    restated=$(printf '%s\n' "${localdns_stop_post[@]}")
    if [[ $own != "$restated" ]]; then
        echo "LocalDNS's own ExecStopPost= in $localdns is [${own//$'\n'/; }], but $dropin restates [${restated//$'\n'/; }] after the fallback's (it replaces LocalDNS's list): update the drop-in and localdns_stop_post in units/install.sh"
    fi
}

# One line naming it when the unit at our path is another fallback's; nothing when it is ours or
# absent.
foreign_unit() {
    [[ -f $root/$unit ]] || return 0
    local start our_exec
    our_exec=/$(binary_dest)
    start=$(service_list ExecStart "$root/$unit")
    # The command without systemd's prefixes (-, @, :, +, !) and without its arguments.
    while [[ $start == [-@:+!]* ]]; do start=${start:1}; done
    start=${start%%[[:space:]]*}
    [[ $start == "$our_exec" ]] ||
        echo "$root/$unit is another fallback's unit (its ExecStart= does not run $our_exec): remove that fallback, and its wiring in localdns.service, first"
}

# The destination of the binary, from the list.
binary_dest() {
    local entry src dest mode
    for entry in "${files[@]}"; do
        read -r src dest mode <<<"$entry"
        if [[ $src == binary ]]; then echo "$dest"; fi
    done
}

# Prints one line per problem found in the installed tree; prints nothing when all is well.
check() {
    local entry src dest mode path actual
    for entry in "${files[@]}"; do
        read -r src dest mode <<<"$entry"
        path=$root/$dest
        if [[ ! -e $path ]]; then
            echo "missing: $path"
        elif [[ ! -f $path ]]; then
            echo "not a regular file: $path"
        elif actual=$(stat -c '%04a' "$path") && [[ $actual != "$mode" ]]; then
            echo "wrong mode: $path is $actual, must be $mode"
        fi
    done

    # The binary answers --version. In a root with an OS of its own it runs there (chroot), so the
    # C library it is checked against is the image's, not this machine's.
    dest=$(binary_dest)
    if [[ -f $root/$dest && -x $root/$dest ]]; then
        local out
        if [[ -n $root && -x $root/bin/sh ]]; then
            out=$(chroot "$root" "/$dest" --version 2>&1) || out="FAILED: $out"
        else
            out=$("$root/$dest" --version 2>&1) || out="FAILED: $out"
        fi
        [[ $out == "localdns-fallback "* ]] || echo "binary does not answer --version: $root/$dest: ${out%%$'\n'*}"
    elif [[ -f $root/$dest ]]; then
        echo "not executable: $root/$dest"
    fi

    # The drop-in carries every directive, each in its section.
    if [[ -f $root/$dropin ]]; then
        local want section line
        for want in "${dropin_directives[@]}"; do
            section=${want%%] *}]
            line=${want#*] }
            awk -v section="$section" -v line="$line" '
                /^[ \t]*\[/ { current = $0; gsub(/[ \t]/, "", current) }
                { sub(/^[ \t]+/, ""); sub(/[ \t]+$/, "") }
                current == section && $0 == line { found = 1 }
                END { exit !found }' "$root/$dropin" ||
                echo "drop-in not wired: $root/$dropin lacks \"$line\" in $section"
        done
    fi

    stop_post_mismatch
    foreign_unit
    if [[ $wiring == on-failure ]]; then
        on_failure_mismatch
        [[ ! -e $root/$dropin ]] || echo "the drop-in wiring's $root/$dropin is installed beside the on-failure wiring"
    fi
    if [[ -n $standby && ! -L $root/$standby_link ]]; then
        echo "standby not enabled: $root/$standby_link is missing"
    fi

    # systemd's own reading of the units: clean means no complaint at all (an unknown key or a
    # directive in the wrong section is only a warning, with exit status 0). LocalDNS's unit comes
    # from LocalDNS, not from us: it is verified with our drop-in when the tree has it.
    local units=(localdns-fallback.service localdns-fallback-standby.service) root_flag=()
    [[ -n $root ]] && root_flag=(--root="$root")
    [[ -n $(localdns_unit) ]] && units+=(localdns.service)
    if ((${#units[@]} == 2)); then
        echo "note: no localdns.service in $root/: the drop-in was checked by its text only" >&2
    fi
    if [[ -f $root/$unit ]]; then
        local verify
        if ! verify=$(systemd-analyze verify "${root_flag[@]}" "${units[@]}" 2>&1) || [[ -n $verify ]]; then
            echo "systemd-analyze verify ${root_flag[*]} ${units[*]} is not clean:"
            sed 's/^/    /' <<<"$verify"
        fi
    fi
}

# The node as it is: a LocalDNS unit with the node image's two lines gets the on-failure wiring
# and the standby unit beside it (the shortest dark time in every phase measured, and the only
# wiring that covers a hung LocalDNS); any other gets our drop-in.
if [[ $wiring == auto ]]; then
    if [[ -n $upgrade && -e $root/$dropin ]]; then
        wiring=drop-in
    elif [[ -n $(localdns_unit) && -z $(wiring=on-failure; on_failure_mismatch) ]]; then
        wiring=on-failure
        # An administrator's `systemctl disable` outlives an upgrade (as deb-systemd-helper keeps it).
        [[ -n $upgrade && ! -L $root/$standby_link ]] || standby=1
    else
        wiring=drop-in
    fi
fi
# Uninstall removes whatever either wiring installed.
if [[ $wiring == drop-in || $action == uninstall ]]; then files+=("${dropin_files[@]}"); fi

case $action in
    install)
        [[ -x $binary ]] || { echo "install.sh: no binary at $binary (cargo build --release first)" >&2; exit 1; }
        mismatch=$(stop_post_mismatch; foreign_unit; [[ $wiring == drop-in ]] || on_failure_mismatch)
        [[ -z $mismatch ]] || { echo "install.sh: not installed: $mismatch" >&2; exit 1; }
        for entry in "${files[@]}"; do
            read -r src dest mode <<<"$entry"
            [[ $src == binary ]] && src=$binary || src=$here/$src
            # The package's own file (or the binary in place): dpkg installed it.
            if [[ -n $packaged && ( ! -e $src || $src -ef $root/$dest ) ]]; then
                [[ -e $root/$dest ]] || { echo "install.sh: missing $root/$dest (reinstall the package)" >&2; exit 1; }
                continue
            fi
            install -D -m "$mode" "$src" "$root/$dest"
        done
        if [[ $wiring == on-failure ]]; then
            # One wiring at a time: the drop-in's starts and the node image's stop would interleave.
            # (The package's handoff script and path unit stay: without the drop-in nothing runs them.)
            for entry in "${dropin_files[@]}"; do
                read -r src dest mode <<<"$entry"
                [[ -n $packaged && $dest != "$dropin" ]] && continue
                rm -f "$root/$dest"
            done
            rmdir --ignore-fail-on-non-empty "$root/etc/systemd/system/localdns.service.d" 2>/dev/null || true
        fi
        if [[ -n $standby ]]; then
            mkdir -p "$(dirname "$root/$standby_link")"
            ln -sfn /etc/systemd/system/localdns-fallback-standby.service "$root/$standby_link"
        fi
        reload
        if [[ -n $standby && -z $no_start && -z $root && -d /run/systemd/system ]]; then
            systemctl start --no-block localdns-fallback-standby.service
        fi
        echo "installed $(installed) (wiring: $wiring${standby:+, standby enabled${no_start:+ for the next boot, not started}})"
        ;;
    uninstall)
        if [[ -z $root && -d /run/systemd/system ]]; then
            systemctl stop localdns-fallback-standby.service 2>/dev/null || true
        fi
        rm -f "$root/$standby_link"
        foreign=$(foreign_unit) removed=""
        for entry in "${files[@]}"; do
            read -r src dest mode <<<"$entry"
            # The package's files are dpkg's to remove.
            [[ -n $packaged && $dest != "$dropin" ]] && continue
            if [[ $dest == "$unit" && -n $foreign ]]; then
                echo "install.sh: left in place: $foreign" >&2
                continue
            fi
            rm -f "$root/$dest"
            removed+="${removed:+, }$root/$dest"
            # A directory left empty goes too (the drop-in's; LocalDNS's own keeps its scripts).
            if [[ $(dirname "$dest") != etc/systemd/system ]]; then
                rmdir --ignore-fail-on-non-empty "$(dirname "$root/$dest")" 2>/dev/null || true
            fi
        done
        reload
        echo "removed ${removed:-nothing: the rest is the package, for dpkg to remove}"
        ;;
    check)
        problems=$(check)
        if [[ -n $problems ]]; then
            echo "install.sh --check: ${root:-/} is NOT a complete localdns-fallback install:" >&2
            echo "$problems" | sed 's/^/  /' >&2
            exit 1
        fi
        if [[ $wiring == drop-in ]]; then wired="drop-in wired (${#dropin_directives[@]} directives)"; else wired="on-failure wiring in LocalDNS's unit"; fi
        echo "check OK: ${root:-/}: $(installed); $wired${standby:+, standby enabled}; systemd-analyze verify clean"
        ;;
esac
