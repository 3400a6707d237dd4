"""Cluster launchers: ``slurm.sbatch`` and the run-state helper it calls (``state.py``)."""
