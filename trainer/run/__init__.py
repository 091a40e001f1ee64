"""The training run: `train.main` and its loop, checkpoints (checkpoint.py),
and the side tasks that hook in after the step: the hang watchdog
(watchdog.py), slow ranks (stragglers.py), drills (drills.py). May import every
other folder (common/, data/, model/, parallel/, optim/, report/, eval/,
tasks/);
nothing imports run/ but hpcyolo's commands."""
