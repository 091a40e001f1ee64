"""hpcyolo: train YOLO-family detectors on Slurm clusters.

Importing this package must stay cheap: no torch, no submitit, no jinja2.
"""

__version__ = "0.1.0"
