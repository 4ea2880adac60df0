#!/bin/sh
# A stand-in for srun in the launch tests: `fake_srun.sh [--option=value ...] COMMAND ARGS...` runs
# --ntasks copies of COMMAND on this machine with the SLURM_* variables srun gives each task, and
# waits for them (stopping it, as the launcher does with its process group, stops them all).
ntasks=1
while [ $# -gt 0 ]; do
  case $1 in
    --ntasks=*) ntasks=${1#--ntasks=} ;;
    --*) ;;
    *) break ;;
  esac
  shift
done
i=0
while [ "$i" -lt "$ntasks" ]; do
  SLURM_PROCID=$i SLURM_NTASKS=$ntasks SLURM_LOCALID=$i SLURM_NODEID=0 SLURMD_NODENAME=fake-node "$@" &
  i=$((i + 1))
done
wait
