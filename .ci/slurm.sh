#!/usr/bin/env bash
# A one-node Slurm cluster on this machine (Debian's slurm-wlm: munged, slurmctld, slurmd), for the
# Slurm executor's test. Containers have no cgroups to give Slurm: processes are tracked by their parent
# pid (proctrack/linuxproc), tasks are not bound (task/none), and there is no accounting database, so
# finished jobs are read back from slurmctld's memory (MinJobAge) and the job completion file.
# Idempotent: a controller that already answers is left as it is. Needs root and apt-get.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

up() { pgrep -x slurmctld >/dev/null && pgrep -x slurmd >/dev/null && timeout 10 scontrol ping 2>/dev/null | grep -q "is UP" && sinfo -h -o %t 2>/dev/null | grep -Eq '^(idle|mix|alloc)'; }
if command -v scontrol >/dev/null && up; then
  echo "slurm: a controller and a node already answer"; exit 0
fi
[ "$(id -u)" = 0 ] || { echo "slurm.sh needs root to install and start Slurm" >&2; exit 1; }
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null; then
  apt-get update -qq || true
  apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null
fi

host=$(hostname -s)
cpus=$(nproc)
mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm /run/munge /etc/munge
cat > /etc/slurm/slurm.conf <<CONF
# written by dflash-bench .ci/slurm.sh: a one-node test cluster
ClusterName=dflash-ci
SlurmctldHost=${host}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=/var/log/slurm/jobcomp.log
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
MinJobAge=3600
KillWait=10
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
SlurmdParameters=config_overrides
NodeName=${host} CPUs=${cpus} State=UNKNOWN
PartitionName=debug Nodes=${host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
CONF
# no cgroup.conf: with proctrack/linuxproc and task/none slurmd uses no cgroup (22.05 has no "disabled")

if [ ! -s /etc/munge/munge.key ]; then
  dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null
fi
chown -R munge:munge /etc/munge /run/munge /var/lib/munge /var/log/munge 2>/dev/null || true
chmod 0400 /etc/munge/munge.key
if ! munge -n >/dev/null 2>&1; then
  runuser -u munge -- /usr/sbin/munged
fi

pgrep -x slurmctld >/dev/null || slurmctld
pgrep -x slurmd >/dev/null || slurmd
for _ in $(seq 1 30); do
  if up; then
    echo "slurm: one-node cluster up on ${host} (${cpus} CPUs)"; exit 0
  fi
  sleep 1
done
echo "slurm: the cluster did not come up; see /var/log/slurm/" >&2
tail -n 20 /var/log/slurm/slurmctld.log /var/log/slurm/slurmd.log >&2 || true
exit 1
