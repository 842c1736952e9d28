#!/usr/bin/env bash
# A one-node Slurm cluster on this machine, to try the Slurm job scripts and `srun` for real.
#
#   bash tools/slurm_cluster.sh start     # munged, slurmctld and slurmd; waits until the node is idle
#   eval "$(bash tools/slurm_cluster.sh env)"
#   sinfo; sbatch jobs/slurm/ddp.sh; squeue; salloc -n 2 ...
#   bash tools/slurm_cluster.sh stop      # cancels every job, stops the three daemons, leaves nothing
#
# Everything is private to one folder ($SCALEDL_SLURM_DIR, default /tmp/scaledl-slurm-$USER): its own
# slurm.conf (point SLURM_CONF at it; `env` prints the line), munge key and socket, state, spool,
# logs and pid files, and its own ports, so a site's Slurm or munge on the same machine is not touched.
# The node is this machine as `slurmd -C` describes it (its CPUs and memory), with no GPUs.
# Needs Debian's slurm-wlm and munge (`make setup` installs them) and root: the daemons run as
# root (through sudo when you are not), as slurmd must to start jobs as their user.
set -euo pipefail

dir=${SCALEDL_SLURM_DIR:-/tmp/scaledl-slurm-$(id -un)}
ctld_port=${SCALEDL_SLURM_PORT:-16817}  # slurmd listens on the next port
conf=$dir/slurm.conf

as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }
say() { printf 'slurm_cluster: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 2; }

need() {
    local missing=()
    for program in munged mungekey slurmctld slurmd sinfo; do
        command -v "$program" >/dev/null || missing+=("$program")
    done
    [ ${#missing[@]} -eq 0 ] || die "${missing[*]} not found: install Debian's slurm-wlm and munge (make setup does)"
}

write_conf() {
    local host node
    host=$(hostname -s)
    # `slurmd -C` prints this machine as a node line: CPUs, sockets, cores, threads, memory.
    node=$(slurmd -C | head -1)
    [[ $node == "NodeName=$host "* ]] || die "slurmd -C printed an unexpected line: $node"
    cat > "$conf" <<EOF
# Written by tools/slurm_cluster.sh: a one-node cluster whose every path is under $dir.
ClusterName=scaledl
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$((ctld_port + 1))
AuthType=auth/munge
# cred_expire: a requeued job waits out its old credential's lifetime before it starts again
# (slurm.conf(5)); 10 s instead of the default 120 keeps the requeue test short (Slurm refuses less than 5:
# src/common/slurm_cred.c, 22.05).
AuthInfo=socket=$dir/munge/munge.socket,cred_expire=10
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
# No cgroups here: processes are tracked through /proc, and tasks are not bound to cores
# (srun --cpu-bind needs TaskPlugin=task/affinity, which most sites have).
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MailProg=/bin/true
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# srun starts tasks without an MPI plugin (as many clusters do), so Open MPI cannot initialize
# under it: code run by srun must not need MPI (srun --mpi=pmix gives it PMIx, which Debian's
# Open MPI uses).
MpiDefault=none
ReturnToService=2
# SIGTERM to SIGKILL after a time limit or scancel: 5 s instead of 30, so tests do not wait.
KillWait=5
OverTimeLimit=0
$node NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
}

pid_of() {  # the pid in a pid file, if that process is alive
    local pid
    pid=$(cat "$dir/$1.pid" 2>/dev/null) || return 1
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && echo "$pid"
}

start() {
    need
    if pid_of slurmctld >/dev/null || pid_of slurmd >/dev/null; then
        die "a cluster already runs from $dir: stop it first (bash tools/slurm_cluster.sh stop)"
    fi
    as_root mkdir -p "$dir"
    as_root chown "$(id -u):$(id -g)" "$dir"
    rm -rf "${dir:?}/state" "${dir:?}/spool" "$dir"/*.log
    mkdir -p "$dir/state" "$dir/spool"
    write_conf
    # munge: a private key, socket and pid file (munged checks that only its owner can write there).
    as_root rm -rf "$dir/munge"
    as_root mkdir -m 700 "$dir/munge"
    as_root mungekey --create --keyfile="$dir/munge/munge.key"
    as_root chmod 600 "$dir/munge/munge.key"
    as_root munged --force --socket="$dir/munge/munge.socket" --key-file="$dir/munge/munge.key" \
        --log-file="$dir/munge/munged.log" --pid-file="$dir/munge.pid" --seed-file="$dir/munge/munged.seed"
    # The clients (sinfo, sbatch, srun) of other users must reach the socket.
    as_root chmod 755 "$dir/munge"
    as_root env SLURM_CONF="$conf" slurmctld -c
    as_root env SLURM_CONF="$conf" slurmd
    local state=""
    for _ in $(seq 60); do
        state=$(SLURM_CONF=$conf sinfo -h -o %T 2>/dev/null || true)
        [ "$state" = idle ] && break
        sleep 0.5
    done
    if [ "$state" != idle ]; then
        say "the node is '${state:-not reporting}' after 30 s; the logs say:"
        tail -n 5 "$dir/slurmctld.log" "$dir/slurmd.log" >&2 || true
        stop
        exit 1
    fi
    say "up: 1 node ($(hostname -s), $(nproc) CPUs, no GPUs), partition debug; run:"
    echo "export SLURM_CONF=$conf"
}

# This cluster's job steps (slurmstepd carries its SLURM_CONF; it outlives slurmd by design) and
# every process under them: what a killed job could leave.  Nothing else is touched.
cluster_processes() {
    local stat line pid ppid name
    local -A children=()
    local queue=()
    for stat in /proc/[0-9]*/stat; do
        read -r line 2>/dev/null < "$stat" || continue
        pid=${line%% *}
        name=${line#*(}
        name=${name%)*}
        ppid=${line##*) }
        ppid=${ppid#* }
        ppid=${ppid%% *}
        children[$ppid]+=" $pid"
        if [ "$name" = slurmstepd ] &&
            as_root cat "/proc/$pid/environ" 2>/dev/null | tr '\0' '\n' | grep -qxF "SLURM_CONF=$conf"; then
            queue+=("$pid")
        fi
    done
    while [ ${#queue[@]} -gt 0 ]; do
        pid=${queue[0]}
        queue=("${queue[@]:1}")
        echo "$pid"
        # shellcheck disable=SC2206
        queue+=(${children[$pid]:-})
    done
}

stop() {
    if [ -f "$conf" ] && pid_of slurmctld >/dev/null; then
        SLURM_CONF=$conf scancel --full --quiet --partition=debug 2>/dev/null || true
        for _ in $(seq 40); do
            [ -z "$(SLURM_CONF=$conf squeue -h 2>/dev/null)" ] && break
            sleep 0.5
        done
    fi
    local name pid
    for name in slurmd slurmctld munge; do
        pid=$(pid_of "$name") || continue
        as_root kill "$pid" 2>/dev/null || true
        for _ in $(seq 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
        kill -0 "$pid" 2>/dev/null && as_root kill -9 "$pid" 2>/dev/null
    done
    # What a killed job step may have left (slurmstepd outlives slurmd by design).
    local left
    left=$(cluster_processes)
    if [ -n "$left" ]; then
        # shellcheck disable=SC2086
        as_root kill -9 $left 2>/dev/null || true
    fi
    say "stopped (nothing of it runs; its files stay in $dir)"
}

status() {
    local name
    for name in munge slurmctld slurmd; do
        if pid_of "$name" >/dev/null; then echo "$name: running (pid $(pid_of "$name"))"; else echo "$name: stopped"; fi
    done
    [ -f "$conf" ] && SLURM_CONF=$conf sinfo 2>/dev/null || true
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    status) status ;;
    env) echo "export SLURM_CONF=$conf" ;;
    *) echo "usage: $0 start|stop|status|env   (folder: \$SCALEDL_SLURM_DIR, now $dir)" >&2; exit 2 ;;
esac
