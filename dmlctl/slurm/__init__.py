"""Slurm as a way to reach hosts: one allocation per run (:mod:`.allocation`), the
host agents and every other command run in it through ``srun`` (:mod:`.transport`),
Slurm's commands run with the cluster's configuration (:mod:`.commands`). Never
imports torch."""
