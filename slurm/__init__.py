"""Launch backends (local processes, Slurm), sbatch templates and the one-host cluster."""
