#!/usr/bin/env bash
# Debian's SLURM (slurm-wlm: slurmctld, slurmd, the client commands) and munge for `make test-slurm`.
# Installs them with apt when missing and possible; otherwise says why, and the SLURM tests skip with
# that reason (or fail, where REQUIRE_SLURM=1). scripts/start_slurm.sh starts the cluster itself.
set -uo pipefail
if command -v slurmctld >/dev/null 2>&1 && command -v slurmd >/dev/null 2>&1 \
    && command -v sbatch >/dev/null 2>&1 && command -v munged >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "install_slurm: slurm-wlm is missing and apt-get as root is not available here"
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get install -y --no-install-recommends slurm-wlm munge >/dev/null \
    || { apt-get update >/dev/null && apt-get install -y --no-install-recommends slurm-wlm munge >/dev/null; } \
    || echo "install_slurm: apt-get could not install slurm-wlm and munge"
command -v slurmd >/dev/null 2>&1 && slurmd -V
exit 0
