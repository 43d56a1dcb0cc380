#!/usr/bin/env bash
# The release: the binary and the Debian package for amd64 and arm64, each checked to run on
# glibc 2.34 (the oldest of the fleet's images is Ubuntu 22.04's 2.35):
#   units/release.sh                  both architectures
#   units/release.sh --arch arm64     one (amd64 or arm64)
# Writes target/debian/localdns-fallback_<version>-1_<arch>.deb and prints each binary's path,
# size and glibc floor. Fails when a binary needs a newer GLIBC_ symbol version than 2.34, is not
# for its architecture, or a package's Architecture field is not its own.
#
# amd64 is built by the toolchain on PATH (rustup's, as for everything else). arm64 is built by
# Debian 12's cargo-web and rustc-web from bookworm-security (/usr/bin/cargo and /usr/bin/rustc,
# called by their full paths: rustup's proxies come first on PATH) with the arm64 standard library
# libstd-rust-web-dev:arm64 and gcc-aarch64-linux-gnu as the linker, into target/cross, so the two
# compilers never share a target directory. Linked against bookworm's glibc, the floor is
# GLIBC_2.34; a newer distribution's rustc or glibc can raise it (trixie's std needs 2.39 for its
# pidfd calls), which the check catches. The packages it needs (tests/run.sh installs them):
#   dpkg --add-architecture arm64 && apt-get update
#   apt-get install rustc-web cargo-web libstd-rust-web-dev:arm64 gcc-aarch64-linux-gnu \
#       libc6-dev-arm64-cross binutils
# and dpkg-deb (units/deb.sh builds each package).
set -euo pipefail
cd "$(dirname "$0")/.."

# The newest glibc symbol version a release binary may need.
glibc_floor=2.34
arm64_triple=aarch64-unknown-linux-gnu
arm64_target_dir=target/cross

arches=(amd64 arm64)
while (($#)); do
    case $1 in
        --arch)
            [[ ${2:-} == amd64 || ${2:-} == arm64 ]] || { echo "release.sh: --arch amd64 or arm64, not \"${2:-}\"" >&2; exit 2; }
            arches=("$2"); shift ;;
        *) echo "release.sh: unknown argument $1" >&2; exit 2 ;;
    esac
    shift
done

die() { echo "release.sh: $*" >&2; exit 1; }
need() { command -v "$1" >/dev/null 2>&1 || die "$1 is not installed ($2)"; }

need readelf "apt-get install binutils"
need dpkg-deb "apt-get install dpkg"

# Checks one built binary: its machine, and the newest GLIBC_ version it needs.
check_binary() {
    local binary=$1 machine=$2 floor
    [[ -f $binary ]] || die "no binary at $binary"
    readelf --file-header "$binary" | grep -Eq "Machine: +$machine\$" ||
        die "$binary is not a $machine binary: $(readelf --file-header "$binary" | grep Machine:)"
    # The versions the binary needs from the C library (readelf reads any architecture's ELF).
    floor=$(readelf --version-info --wide "$binary" | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -n 1)
    [[ -n $floor ]] || die "$binary names no GLIBC_ symbol version (not linked against glibc?)"
    if [[ $(printf '%s\n' "${floor#GLIBC_}" "$glibc_floor" | sort -V | tail -n 1) != "$glibc_floor" ]]; then
        die "$binary needs $floor, newer than GLIBC_$glibc_floor: it would not run on every image of the fleet"
    fi
    echo "$floor"
}

# Checks one package's Architecture field.
check_deb() {
    local deb=$1 arch=$2 field
    field=$(dpkg-deb --field "$deb" Architecture)
    [[ $field == "$arch" ]] || die "$deb says Architecture: $field, not $arch"
}

version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)
mkdir -p target/debian
summary=()
for arch in "${arches[@]}"; do
    started=$SECONDS
    deb=target/debian/localdns-fallback_${version}-1_${arch}.deb
    case $arch in
        amd64)
            cargo build --locked --release
            binary=target/release/localdns-fallback
            floor=$(check_binary "$binary" "Advanced Micro Devices X86-64")
            units/deb.sh amd64 "$binary" "$deb"
            ;;
        arm64)
            [[ -x /usr/bin/cargo && -x /usr/bin/rustc ]] ||
                die "Debian's cargo-web and rustc-web are not installed (apt-get install rustc-web cargo-web)"
            sysroot=$(/usr/bin/rustc --print sysroot)
            [[ -d $sysroot/lib/rustlib/$arm64_triple/lib ]] ||
                die "no arm64 standard library for /usr/bin/rustc (dpkg --add-architecture arm64; apt-get update; apt-get install libstd-rust-web-dev:arm64)"
            need aarch64-linux-gnu-gcc "apt-get install gcc-aarch64-linux-gnu"
            # Debian's compiler, whatever rustup would pick here.
            env -u RUSTUP_TOOLCHAIN -u RUSTC_WRAPPER -u RUSTFLAGS -u CARGO_BUILD_TARGET \
                RUSTC=/usr/bin/rustc RUSTDOC=/usr/bin/rustdoc \
                CARGO_TARGET_DIR=$arm64_target_dir \
                CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc \
                /usr/bin/cargo build --locked --release --target "$arm64_triple"
            binary=$arm64_target_dir/$arm64_triple/release/localdns-fallback
            floor=$(check_binary "$binary" AArch64)
            units/deb.sh arm64 "$binary" "$deb"
            ;;
    esac
    check_deb "$deb" "$arch"
    summary+=("$arch: $binary ($(stat -c %s "$binary") bytes, needs $floor), $deb ($(stat -c %s "$deb") bytes), $((SECONDS - started)) s")
done
printf 'release OK: %s\n' "${summary[@]}"
