#!/usr/bin/env bash
# Try the README's two commands on a fresh Debian 13 (Python 3.13), made here from Debian's own
# packages: a debootstrap root with only python3, venv, make, a compiler, cmake and git, a clone
# of this checkout, then `make demo` and `make check` inside it.  Nothing is installed by hand.
#
#   bash tools/debian_root.sh [ROOT]        (as root; ROOT defaults to /var/tmp/scaledl-trixie)
#
# pip inside the root ignores this machine's pip configuration and local wheels, so it takes
# PyPI's torch (the CUDA build, several GB).  /proc, /sys and /dev are bind-mounted for the run and
# unmounted when it ends, also on failure or Ctrl-C.  Logs: ROOT/scaledl-*.log.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
root=${1:-/var/tmp/scaledl-trixie}
suite=${SCALEDL_DEBIAN_SUITE:-trixie}
fail() { echo "debian_root: error: $*" >&2; exit 2; }
log() { printf '[debian_root %s] %s\n' "$(date +%H:%M:%S)" "$*"; }

[ "$(id -u)" -eq 0 ] || fail "debootstrap and chroot need root: run it with sudo"
case "$root" in /|/usr|/usr/*|/etc|/etc/*|/bin|/lib|/home) fail "ROOT=$root would clobber the system: pick an empty folder" ;; esac
if [ -e "$root" ] && [ ! -d "$root" ]; then fail "ROOT=$root is a file, not a folder"; fi

# shellcheck disable=SC2329  # called by the EXIT trap
unmount() {
    for point in "$root/dev" "$root/sys" "$root/proc"; do
        if mountpoint -q "$point" 2>/dev/null; then umount -l "$point" || true; fi
    done
}
trap unmount EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

if [ ! -x "$root/usr/bin/python3" ]; then
    command -v debootstrap >/dev/null || { log "installing debootstrap"; apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null; }
    log "debootstrap $suite into $root (about 1 min)"
    debootstrap --variant=minbase --include=python3,python3-venv,python3-dev,make,g++,cmake,git,ca-certificates,sudo \
        "$suite" "$root" http://deb.debian.org/debian > "$root.debootstrap.log" 2>&1 ||
        fail "debootstrap failed: see $root.debootstrap.log"
fi
# The root must trust what this machine trusts (a TLS proxy's certificate, if any), or pip fails.
cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
cp /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
# An installed Debian resolves its own name (the installer writes "127.0.1.1 <hostname>" to
# /etc/hosts); debootstrap's root does not, and the chroot shares this machine's hostname.
name=$(hostname)
grep -qw -- "$name" "$root/etc/hosts" 2>/dev/null || printf '127.0.1.1\t%s\n' "$name" >> "$root/etc/hosts"
mount --bind /proc "$root/proc"
mount --bind /sys "$root/sys"  # lscpu reads it (DeepSpeed's build asks it for the CPU)
mount --bind /dev "$root/dev"

rm -rf "$root/src"
git clone -q "$here" "$root/src"
# The working tree's uncommitted changes too, so that what is tried is what is here.
(cd "$here" && git diff HEAD) > "$root/src/.uncommitted.diff"
if [ -s "$root/src/.uncommitted.diff" ]; then (cd "$root/src" && git apply .uncommitted.diff); fi
rm -f "$root/src/.uncommitted.diff"
(cd "$here" && git ls-files --others --exclude-standard -z) |
    (cd "$here" && xargs -0 -r cp --parents -t "$root/src")  # new files not yet committed
in_root() { chroot "$root" env -i HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
                LANG=C.UTF-8 TERM=dumb bash -c "cd /src && $1"; }
log "$(in_root 'python3 --version')"
status=0
# The README's two commands (make check is the quick one of the tests), then the Horovod TensorFlow
# rung against one process on this Python's Keras, in both of its modes.
steps=("make demo" "make check"
       "PATH=/src/.venv/bin:\$PATH OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 TF_CPP_MIN_LOG_LEVEL=2
        .venv/bin/python -m pytest -q -p no:cacheprovider tests/ladder/test_equivalence.py -k horovod_tf")
names=("make demo" "make check" "horovod_tf equivalence")
for i in "${!steps[@]}"; do
    name=${names[$i]}
    logfile="$root/scaledl-${name// /-}.log"
    log "$name (logs: $logfile)"
    started=$(date +%s)
    if in_root "${steps[$i]}" > "$logfile" 2>&1; then result=passed; else result=failed; status=1; fi
    log "$name $result in $(( ($(date +%s) - started) / 60 )) min $(( ($(date +%s) - started) % 60 )) s"
    tail -25 "$logfile"
    [ $result = passed ] || break
done
log ".venv: $(du -sh "$root/src/.venv" 2>/dev/null | cut -f1)"
exit $status
