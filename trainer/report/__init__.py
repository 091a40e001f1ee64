"""What users read besides results.csv: plots (plots.py), TensorBoard events
(tboard.py), MLflow and W&B (tracking.py), the progress bar (progress.py),
and the background thread that keeps them off the loop (background.py).
Imports common/ and parallel/."""
