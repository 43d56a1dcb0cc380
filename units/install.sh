#!/usr/bin/env bash
# Installs localdns-fallback where AKS nodes keep LocalDNS's pieces, removes exactly what it
# installed, or checks an installed tree (for an image pipeline, after `dpkg -i` or this script):
#   units/install.sh [--binary PATH] [--root DIR] [--no-start] [--upgrade]   install
#   units/install.sh --uninstall [--root DIR]                                remove
#   units/install.sh --check [--root DIR]                                    verify; exit 1 naming every problem
#
# One wiring on every node (README, "Install"):
# - localdns-fallback-standby.service, enabled (and started, unless --no-start or --root): it runs
#   beside LocalDNS from boot and takes its flows whenever LocalDNS does not serve;
# - the node image's two lines on localdns.service, `OnFailure=localdns-fallback.service` and an
#   `ExecStartPre=` that stops localdns-fallback.service: the second line, for when the standby is
#   down or disabled. Where LocalDNS's unit (with its drop-ins) lacks one, exactly the missing ones
#   go into our drop-in; LocalDNS's own lines are never read for anything else, never rewritten.
# --root works on another root file system (an image being built, a test container).
# --upgrade (the package's postinst on an upgrade) keeps a standby that an administrator disabled
# (`systemctl disable`) disabled, and removes what is left of the wiring of 0.1 (a drop-in that
# ran localdns-fallback-handoff, that script, localdns-fallback.path).
#
# The Debian package ships this script as /usr/share/localdns-fallback/install.sh and runs it from
# its maintainer scripts (units/debian/). dpkg itself puts the binary and the units in place: files
# whose source is not beside the script are the package's, left as they are (never copied, never
# removed; --uninstall there removes only what the script added: the drop-in and the enablement).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

# ---- What is installed: one line per file, SOURCE DESTINATION MODE. ---------------------------
# SOURCE is relative to units/ ("binary" is the --binary file); DESTINATION is relative to the root.
# The .deb (units/deb.sh) holds the same files: tests/shipping.rs
# compares them.
binary_dest=opt/azure/containers/localdns/localdns-fallback
files=(
    "binary                                        $binary_dest                  0755"
    "localdns-fallback.service                     etc/systemd/system/localdns-fallback.service                     0644"
    "localdns-fallback-standby.service             etc/systemd/system/localdns-fallback-standby.service             0644"
)
# What enables the standby unit (as `systemctl enable` makes it).
standby_link=etc/systemd/system/multi-user.target.wants/localdns-fallback-standby.service
# Our drop-in on localdns.service: only the node image's lines that LocalDNS's unit lacks.
dropin=etc/systemd/system/localdns.service.d/50-localdns-fallback.conf
on_failure_line="OnFailure=localdns-fallback.service"
# Bounded: a `systemctl stop` from inside another unit's Exec*= can wait on a job queued behind
# LocalDNS's own start.
start_pre_line="ExecStartPre=-/usr/bin/timeout 10 /usr/bin/systemctl stop localdns-fallback.service"
# The wiring of 0.1, retired: its drop-in (at $dropin, running this script) and these.
old_wiring=(opt/azure/containers/localdns/localdns-fallback-handoff etc/systemd/system/localdns-fallback.path)
# Where systemd looks for units, first to last.
unit_dirs=(etc/systemd/system run/systemd/system lib/systemd/system usr/lib/systemd/system)
# Some AKS images ship a localdns-fallback.service of their own (NAT redirects applied by
# localdns-fallback.sh). Ours is the unit whose ExecStart= runs this binary; any other unit at our
# path is neither overwritten by install nor removed by --uninstall, and --check names it.
unit=etc/systemd/system/localdns-fallback.service
# ------------------------------------------------------------------------------------------------

root=""
binary=""
action=install
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
        --no-start) no_start=1 ;;
        --upgrade) upgrade=1 ;;
        *) echo "install.sh: unknown argument $1" >&2; exit 2 ;;
    esac
    shift
done
root=${root%/}
if [[ -z $binary ]]; then
    if [[ -n $packaged ]]; then binary=$root/$binary_dest; else binary=$here/../target/release/localdns-fallback; fi
fi
# Only the running systemd of this root is told anything; an image being built has none.
live=""
[[ -z $root && -d /run/systemd/system ]] && live=1

# LocalDNS's unit file in this root, in systemd's order of precedence; nothing if there is none.
localdns_unit() {
    local dir
    for dir in "${unit_dirs[@]}"; do
        if [[ -f $root/$dir/localdns.service ]]; then echo "$root/$dir/localdns.service"; return; fi
    done
}

# LocalDNS's unit file followed by its drop-ins in systemd's order, ours left out with "mine".
localdns_files() {
    local localdns name dir
    localdns=$(localdns_unit)
    [[ -n $localdns ]] || return 0
    echo "$localdns"
    for name in $(for dir in "${unit_dirs[@]}"; do
        [[ -d $root/$dir/localdns.service.d ]] && ls "$root/$dir/localdns.service.d"; done | grep '\.conf$' | sort -u); do
        [[ $1 == mine || $name != "${dropin##*/}" ]] || continue
        for dir in "${unit_dirs[@]}"; do
            if [[ -f $root/$dir/localdns.service.d/$name ]]; then
                echo "$root/$dir/localdns.service.d/$name"; break
            fi
        done
    done
}

# The values of the list KEY of [SECTION] in these unit files, one per line, as systemd assembles
# it: in order, an empty assignment emptying it.
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

# The node image's lines that LocalDNS's unit lacks, as "[Section] line", one per line; with
# "mine", counting our drop-in too. Both when this root has no LocalDNS unit yet (an image being
# built may install it later; a drop-in of a missing unit does nothing).
missing_lines() {
    local unit_files=()
    # (A here-string, not < <(...): a root being built may have no /dev/fd.)
    mapfile -t unit_files <<<"$(localdns_files "${1:-}")"
    if [[ -z ${unit_files[0]} ]]; then
        printf '%s\n' "[Unit] $on_failure_line" "[Service] $start_pre_line"
        return
    fi
    # OnFailure= takes a space-separated list.
    section_list Unit OnFailure "${unit_files[@]}" | tr ' ' '\n' | grep -qx localdns-fallback.service ||
        echo "[Unit] $on_failure_line"
    section_list Service ExecStartPre "${unit_files[@]}" | grep -Eq 'systemctl +stop +localdns-fallback(\.service)?$' ||
        echo "[Service] $start_pre_line"
}

# One line naming it when the unit at our path is another fallback's.
foreign_unit() {
    [[ -f $root/$unit ]] || return 0
    local start
    start=$(section_list Service ExecStart "$root/$unit")
    # The command without systemd's prefixes (-, @, :, +, !) and without its arguments.
    while [[ $start == [-@:+!]* ]]; do start=${start:1}; done
    start=${start%%[[:space:]]*}
    [[ $start == "/$binary_dest" ]] ||
        echo "$root/$unit is another fallback's unit (its ExecStart= does not run /$binary_dest): remove that fallback, and its wiring in localdns.service, first"
}

# One line per piece of the retired 0.1 wiring still in this root.
old_wiring_left() {
    local path
    for path in "${old_wiring[@]}"; do
        [[ ! -e $root/$path ]] || echo "left of the retired drop-in wiring: $root/$path"
    done
    if [[ -f $root/$dropin ]] && grep -q localdns-fallback-handoff "$root/$dropin"; then
        echo "left of the retired drop-in wiring: $root/$dropin runs localdns-fallback-handoff"
    fi
}

# Writes our drop-in with exactly the missing lines, or removes it when none is missing.
write_dropin() {
    local lines section line
    lines=$(missing_lines)
    rm -f "$root/$dropin"
    if [[ -z $lines ]]; then
        rmdir "$root/${dropin%/*}" 2>/dev/null || true
        return
    fi
    mkdir -p "$root/${dropin%/*}"
    {
        echo "# localdns-fallback (units/install.sh): the node image's lines that localdns.service lacked."
        for section in Unit Service; do
            grep -q "^\[$section\] " <<<"$lines" || continue
            echo "[$section]"
            # (A here-string, not < <(...): a root being built may have no /dev/fd.)
            while read -r _ line; do echo "$line"; done <<<"$(grep "^\[$section\] " <<<"$lines")"
        done
    } >"$root/$dropin"
    chmod 0644 "$root/$dropin"
}

check() {
    local entry src dest mode path actual out
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
    # The binary answers --version; in a root with an OS of its own it runs there (chroot), so the
    # C library it is checked against is the image's.
    dest=$binary_dest
    if [[ -f $root/$dest && -x $root/$dest ]]; then
        if [[ -n $root && -x $root/bin/sh ]]; then
            out=$(chroot "$root" "/$dest" --version 2>&1) || out="FAILED: $out"
        else
            out=$("$root/$dest" --version 2>&1) || out="FAILED: $out"
        fi
        [[ $out == "localdns-fallback "* ]] || echo "binary does not answer --version: $root/$dest: ${out%%$'\n'*}"
    fi
    if [[ -n $(localdns_unit) ]]; then
        while read -r _ line; do
            [[ -z $line ]] || echo "localdns.service lacks $line (units/install.sh adds it)"
        done <<<"$(missing_lines mine)"
    fi
    old_wiring_left
    foreign_unit
    # systemd's own reading of the units: clean means no complaint at all (an unknown key is only
    # a warning, with exit status 0).
    local units=(localdns-fallback.service localdns-fallback-standby.service) root_flag=() verify
    [[ -n $root ]] && root_flag=(--root="$root")
    [[ -n $(localdns_unit) ]] && units+=(localdns.service)
    if [[ -f $root/$unit ]] && { ! verify=$(systemd-analyze verify "${root_flag[@]}" "${units[@]}" 2>&1) || [[ -n $verify ]]; }; then
        echo "systemd-analyze verify ${root_flag[*]} ${units[*]} is not clean:"
        sed 's/^/    /' <<<"$verify"
    fi
}

case $action in
    install)
        [[ -x $binary ]] || { echo "install.sh: no binary at $binary (cargo build --release first)" >&2; exit 1; }
        foreign=$(foreign_unit)
        [[ -z $foreign ]] || { echo "install.sh: not installed: $foreign" >&2; exit 1; }
        # The standby is enabled on every node, except on an upgrade that finds it installed and
        # not enabled: an administrator disabled it. Under 0.1's drop-in wiring it was never
        # enabled, so there its missing link is no administrator's choice.
        standby=1
        if [[ -n $upgrade && ! -L $root/$standby_link && -z $(old_wiring_left) ]]; then standby=""; fi
        for entry in "${files[@]}"; do
            read -r src dest mode <<<"$entry"
            [[ $src == binary ]] && src=$binary || src=$here/$src
            if [[ -n $packaged && ( ! -e $src || $src -ef $root/$dest ) ]]; then
                [[ -e $root/$dest ]] || { echo "install.sh: missing $root/$dest (reinstall the package)" >&2; exit 1; }
                continue
            fi
            install -D -m "$mode" "$src" "$root/$dest"
        done
        if [[ -n $live ]]; then systemctl stop localdns-fallback.path 2>/dev/null || true; fi
        for path in "${old_wiring[@]}"; do rm -f "$root/$path"; done
        write_dropin
        if [[ -n $standby ]]; then
            mkdir -p "$(dirname "$root/$standby_link")"
            ln -sfn /etc/systemd/system/localdns-fallback-standby.service "$root/$standby_link"
        fi
        if [[ -n $live ]]; then systemctl daemon-reload; fi
        if [[ -n $standby && -z $no_start && -n $live ]]; then
            systemctl start --no-block localdns-fallback-standby.service
        fi
        said="standby left disabled"
        [[ -z $standby ]] || said="standby enabled${no_start:+ for the next boot}"
        added=$(missing_lines | sed 's/^\[[A-Za-z]*\] //' | paste -sd, -)
        [[ -n $added ]] && said+="; $dropin adds $added" || said+="; localdns.service has both lines, nothing added"
        echo "installed the binary and both units under ${root:-/}; $said"
        ;;
    uninstall)
        if [[ -n $live ]]; then systemctl stop localdns-fallback-standby.service 2>/dev/null || true; fi
        rm -f "$root/$standby_link" "$root/$dropin"
        rmdir "$root/${dropin%/*}" 2>/dev/null || true
        removed="$root/$dropin"
        foreign=$(foreign_unit)
        if [[ -z $packaged ]]; then
            for entry in "${files[@]}"; do
                read -r src dest mode <<<"$entry"
                if [[ $dest == "$unit" && -n $foreign ]]; then
                    echo "install.sh: left in place: $foreign" >&2
                    continue
                fi
                rm -f "$root/$dest"
                removed+=", $root/$dest"
            done
        fi
        if [[ -n $live ]]; then systemctl daemon-reload; fi
        echo "removed the standby's enablement, $removed"
        ;;
    check)
        problems=$(check)
        if [[ -n $problems ]]; then
            echo "install.sh --check: ${root:-/} is NOT a complete localdns-fallback install:" >&2
            echo "$problems" | sed 's/^/  /' >&2
            exit 1
        fi
        if [[ -L $root/$standby_link ]]; then
            standby="standby enabled"
        else
            standby="standby disabled (systemctl disable): only OnFailure= covers LocalDNS"
        fi
        if [[ -n $(localdns_unit) ]]; then lines="localdns.service has both lines"; else lines="no localdns.service yet (our drop-in holds both lines)"; fi
        echo "check OK: ${root:-/}: binary and units in place; $lines; $standby; systemd-analyze verify clean"
        ;;
esac
