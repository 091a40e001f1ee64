"""A model's outputs judged and handed out: the one validation (evaluate.py),
mAP and its curves (metrics.py; keypoints matched by OKS: pose_metrics.py),
`hpcyolo predict` (predict.py) and `hpcyolo export` (export.py). Imports
common/, data/, model/, parallel/ and report/."""
