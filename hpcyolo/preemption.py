"""The preemption protocol shared by the sbatch script and the trainer.

A training process that stops because Slurm warned of preemption or of the
time limit exits with EXIT_CODE after its checkpoint is safely written; the
batch script requeues the job on exactly that code and passes any other
failure through.
"""

# EX_TEMPFAIL from sysexits.h: "temporary failure, try again later".
EXIT_CODE = 75
