#!/usr/bin/env bash
# A one-node SLURM cluster on this machine from Debian's packages, for the SLURM tests (make slurm-check):
#   bash scripts/slurm_cluster.sh start   # installs slurm-wlm and munge when missing, writes the config, starts
#                                         # munged, slurmctld and slurmd, waits until the node takes jobs
#   bash scripts/slurm_cluster.sh stop    # stops the daemons it started, by the PIDs it recorded
# Root (or sudo) is needed. The node is this machine with its CPUs and 85% of its memory; no cgroups
# (proctrack/linuxproc, task/none) and no accounting database: the launcher reads job states from squeue and
# scontrol. A slurm.conf this script did not write is left alone: the script stops instead.
set -euo pipefail
STATE_DIR=${SLURM_CLUSTER_STATE:-/tmp/empathic-slurm-cluster}
CONF=/etc/slurm/slurm.conf
MARK="# written by empathic-fusion scripts/slurm_cluster.sh"
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"

install_packages() {
  command -v slurmctld >/dev/null && command -v munged >/dev/null && return
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q slurm-wlm munge
}

write_config() {
  if [ -f "$CONF" ] && ! grep -qF "$MARK" "$CONF"; then
    echo "$CONF exists and was not written by this script: not touching a real cluster's configuration" >&2
    exit 1
  fi
  local host node memory
  host=$(hostname -s)
  node=$(slurmd -C | head -n 1)
  memory=$(sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' <<<"$node")
  node=$(sed "s/RealMemory=[0-9]*/RealMemory=$((memory * 85 / 100))/" <<<"$node")
  $SUDO mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm
  $SUDO chown slurm: /var/spool/slurmctld /var/log/slurm
  $SUDO tee "$CONF" >/dev/null <<EOF
$MARK
ClusterName=onenode
SlurmctldHost=$host
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
ReturnToService=2
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmdSpoolDir=/var/spool/slurmd
StateSaveLocation=/var/spool/slurmctld
SlurmUser=slurm
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
MinJobAge=600
$node
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
}

start() {
  install_packages
  write_config
  mkdir -p "$STATE_DIR"
  $SUDO mkdir -p /run/munge /var/log/munge /var/lib/munge
  $SUDO chown munge: /run/munge /var/log/munge /var/lib/munge
  [ -f /etc/munge/munge.key ] || $SUDO mungekey --create 2>/dev/null || $SUDO /usr/sbin/create-munge-key -f
  $SUDO chown munge: /etc/munge/munge.key
  $SUDO su -s /bin/sh munge -c /usr/sbin/munged
  $SUDO cat /run/munge/munged.pid > "$STATE_DIR/munged.pid"
  $SUDO slurmctld -c   # -c: no jobs from an earlier cluster's saved state
  $SUDO slurmd
  for _ in $(seq 60); do
    if [ -s /run/slurmctld.pid ] && [ -s /run/slurmd.pid ] && sinfo -h -o %T 2>/dev/null | grep -q idle; then
      $SUDO cat /run/slurmctld.pid > "$STATE_DIR/slurmctld.pid"
      $SUDO cat /run/slurmd.pid > "$STATE_DIR/slurmd.pid"
      sinfo -N -h -o "SLURM node %N: %c CPUs, %m MB, %T"
      return
    fi
    sinfo -h -o %T 2>/dev/null | grep -Eq "down|drain|unk" && $SUDO scontrol update nodename="$(hostname -s)" state=resume 2>/dev/null || true
    sleep 1
  done
  echo "the SLURM node did not become idle in 60 s; see /var/log/slurm/" >&2
  exit 1
}

stop() {
  for daemon in slurmd slurmctld munged; do
    [ -s "$STATE_DIR/$daemon.pid" ] || continue
    pid=$(cat "$STATE_DIR/$daemon.pid")
    $SUDO kill "$pid" 2>/dev/null || true
    for _ in $(seq 30); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    rm -f "$STATE_DIR/$daemon.pid"
  done
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
