"""What runs on the job's nodes around the trainer: staging into node-local scratch, the
launcher's variables to the standard ones, the preflight checks, the local launcher, and
why Slurm sent SIGTERM."""
