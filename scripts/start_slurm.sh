#!/usr/bin/env bash
# A one-machine SLURM cluster for `make test-slurm` and notebook 06: munged, slurmctld and two
# slurmd daemons ("nodes" n1 and n2 on this host), all state, logs and sockets under one folder.
# Each node offers SLURM_NODE_GPUS (default 2) fake GPUs: GRES "gpu" backed by device files under
# that folder, so that SLURM itself binds GPUs to jobs and tasks and sets CUDA_VISIBLE_DEVICES
# (--gpus-per-node, --gpus-per-task). Nothing can run on them: they test who gets which GPU.
#   scripts/start_slurm.sh DIR     start it; prints `export SLURM_CONF=DIR/slurm.conf`
#   scripts/start_slurm.sh --stop DIR     stop every daemon it started (by the pids it wrote)
# Needs slurm-wlm and munge (scripts/install_slurm.sh) and root: SlurmUser=root, since a container
# has no slurm user to switch to. No cgroups: proctrack/linuxproc and task/none work in a container.
set -euo pipefail

stop() {
    local dir=$1 pidfile jobs
    # cancel every job first (bounded): slurmd waits for its job steps before it exits
    if [ -s "$dir/slurmctld.pid" ] && kill -0 "$(cat "$dir/slurmctld.pid")" 2>/dev/null; then
        jobs=$(SLURM_CONF="$dir/slurm.conf" timeout 15 squeue -h -o %i 2>/dev/null || true)
        if [ -n "$jobs" ]; then
            # shellcheck disable=SC2086
            SLURM_CONF="$dir/slurm.conf" timeout 15 scancel $jobs || true
            for _ in $(seq 60); do
                [ -z "$(SLURM_CONF="$dir/slurm.conf" timeout 15 squeue -h -o %i 2>/dev/null)" ] && break
                sleep 0.5
            done
        fi
    fi
    for pidfile in "$dir"/slurmd-*.pid "$dir"/slurmctld.pid "$dir"/munged.pid; do
        [ -s "$pidfile" ] || continue
        kill "$(cat "$pidfile")" 2>/dev/null || true
    done
    # wait (bounded) for them to go, then make sure
    for _ in $(seq 50); do
        local alive=0
        for pidfile in "$dir"/slurmd-*.pid "$dir"/slurmctld.pid "$dir"/munged.pid; do
            [ -s "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null && alive=1
        done
        [ $alive -eq 0 ] && return 0
        sleep 0.2
    done
    for pidfile in "$dir"/slurmd-*.pid "$dir"/slurmctld.pid "$dir"/munged.pid; do
        [ -s "$pidfile" ] && kill -9 "$(cat "$pidfile")" 2>/dev/null || true
    done
}

if [ "${1:-}" = "--stop" ]; then
    stop "${2:?usage: start_slurm.sh --stop DIR}"
    exit 0
fi
dir=$(realpath -m "${1:?usage: start_slurm.sh DIR}")
mkdir -p "$dir"/{spool-ctld,spool-n1,spool-n2,munge,dev-n1,dev-n2}
host=$(hostname -s)
# each node offers this many CPUs (both nodes share the machine's cores: SLURM only counts them, and
# config_overrides below lets a node offer more than the machine has, so nproc=3 runs on 2 cores)
cpus=${SLURM_NODE_CPUS:-8}
memory_mb=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 / 2 ))
ctld_port=${SLURM_CTLD_PORT:-16817}
node_port=${SLURM_NODE_PORT:-16818}
gpus=${SLURM_NODE_GPUS:-2}

# munge: a key of our own and a socket of our own, so the system's munged (if any) is untouched
dd if=/dev/urandom bs=1 count=1024 of="$dir/munge/munge.key" status=none
chmod 400 "$dir/munge/munge.key"
chmod 700 "$dir/munge"
munged --force --key-file="$dir/munge/munge.key" --socket="$dir/munge/munge.socket" \
    --pid-file="$dir/munged.pid" --log-file="$dir/munged.log" --seed-file="$dir/munge/seed"

# the fake GPUs: per node and GPU, a link named like the real device (nvidia0, ...) to /dev/null.
# slurmd wants a File= that is a character device, and opens none; without task/cgroup nothing
# is constrained, and SLURM's binding shows in each task's CUDA_VISIBLE_DEVICES
gres_conf="AutoDetect=off"
for node in n1 n2; do
    for ((i = 0; i < gpus; i++)); do ln -sfn /dev/null "$dir/dev-$node/nvidia$i"; done
    gres_conf+=$'\n'"NodeName=$node Name=gpu File=$dir/dev-$node/nvidia[0-$((gpus - 1))]"
done
echo "$gres_conf" > "$dir/gres.conf"

cat > "$dir/slurm.conf" <<CONF
ClusterName=workbench
SlurmctldHost=$host
SlurmctldPort=$ctld_port
SlurmdPort=$node_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# cred_expire is also how long a requeued job waits before it may start again (default 120 s)
AuthInfo=socket=$dir/munge/munge.socket,cred_expire=10
CredType=cred/munge
StateSaveLocation=$dir/spool-ctld
SlurmdSpoolDir=$dir/spool-%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd-%n.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
ReturnToService=2
SlurmdParameters=config_overrides
MpiDefault=none
GresTypes=gpu
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
MinJobAge=300
NodeName=n1 NodeHostname=$host NodeAddr=127.0.0.1 Port=$((node_port + 1)) CPUs=$cpus RealMemory=$memory_mb Gres=gpu:$gpus State=UNKNOWN
NodeName=n2 NodeHostname=$host NodeAddr=127.0.0.1 Port=$((node_port + 2)) CPUs=$cpus RealMemory=$memory_mb Gres=gpu:$gpus State=UNKNOWN
PartitionName=debug Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP
CONF
export SLURM_CONF="$dir/slurm.conf"
slurmctld -f "$SLURM_CONF"
slurmd -f "$SLURM_CONF" -N n1
slurmd -f "$SLURM_CONF" -N n2
echo "export SLURM_CONF=$SLURM_CONF"
