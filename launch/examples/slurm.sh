#!/bin/bash
# Slurm batch script: one emulated DGX H100 (8 GPU ranks + 1 switch rank) on the cluster's MPI.
# Submit with: sbatch launch/examples/slurm.sh put_ring.py
#SBATCH --job-name=nvlink-emu
#SBATCH --ntasks=9
#SBATCH --time=00:10:00
set -euo pipefail
source .venv/bin/activate            # a venv with mpi4py built against the site's MPI (see README)
srun -n "$SLURM_NTASKS" python -m nvlink_emu.launch "$1" --preset dgx-h100 --gpus $((SLURM_NTASKS - 1)) "${@:2}"
