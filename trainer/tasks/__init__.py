"""What a task (ultralytics' detect, segment, classify, pose, obb) brings to
a run, as one `Task` record (task.py): its datasets (label reader and how the
augmentations move its labels), its model's head, its loss, its validation,
metrics and fitness, its results.csv columns, its epoch line and its plots.
The run asks the task and never which task it is (run/ imports no task's
module by name); `hpcyolo val` and `predict` take the same record.

Adding a task is a folder here, `tasks/NAME/` whose `task.py` defines `TASK`,
and its name in common/registry.py's TASKS (the `train.task` / `--task`
choices). May import common/, data/, model/, optim/, parallel/, report/ and
eval/; only run/ imports tasks/."""
