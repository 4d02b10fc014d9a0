#!/bin/bash
# Example Slurm batch script: every process of the job (this script, srun tasks, their
# children) runs under the PADLL stage, limited to 20 000 metadata ops/s and 2 GiB/s of
# data per process on /scratch. The job id, node count and account come from Slurm.
#
#   sbatch scripts/slurm-job.sh
#
# Where the site installed the SPANK plugin (README "Slurm"), `sbatch --padll` puts every
# task under the stage without this wrapper, with the site's mountpoints and controller.
#
#SBATCH --job-name=padll-example
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=4
#SBATCH --time=00:30:00

set -euo pipefail
PADLL=${PADLL:-/opt/padll/bin/padll}   # libpadll.so must sit beside it

# One stage per process; statistics go to one JSON line per process.
exec "$PADLL" run \
  --mount /scratch \
  --limit /scratch:metadata=20k/s \
  --limit /scratch:data=2GiB/s \
  --stats "/scratch/$USER/padll-$SLURM_JOB_ID.json" \
  -- bash -c '
    srun --cpu-bind=cores ./my_simulation --input /scratch/$USER/input --output /scratch/$USER/out
    # Afterwards: padll stats /scratch/$USER/padll-$SLURM_JOB_ID.json
  '
