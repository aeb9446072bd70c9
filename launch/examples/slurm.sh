#!/bin/bash
# Slurm batch script: one emulated DGX H100 (8 GPU ranks + 1 switch rank) on the cluster's MPI.
# Submit from the repository's top directory (where .venv is), naming the workload by its path there:
#   sbatch launch/examples/slurm.sh launch/examples/put_ring.py [options] [-- ARGS]
#SBATCH --job-name=nvlink-emu
#SBATCH --ntasks=9
#SBATCH --time=00:10:00
set -euo pipefail
if [ $# -lt 1 ]; then
    echo "usage: sbatch launch/examples/slurm.sh SCRIPT.py [options] [-- ARGS]   (from the repository's top directory)" >&2
    exit 2
fi
if [ -z "${SLURM_NTASKS:-}" ]; then
    echo "slurm.sh: SLURM_NTASKS is not set: submit this script with sbatch (it runs srun -n \$SLURM_NTASKS)" >&2
    exit 2
fi
source .venv/bin/activate            # a venv with mpi4py built against the site's MPI (see README)
srun -n "$SLURM_NTASKS" python -m nvlink_emu.launch "$1" --preset dgx-h100 --gpus $((SLURM_NTASKS - 1)) "${@:2}"
