"""From a data YAML's files to training batches: label files read and checked
(dataset.py), the dataset's index (index.py), augmentation (augment.py,
photometric.py), polygons rasterised into instance masks (masks.py),
keypoint labels read, flipped and warped (keypoints.py), the sampler and its
run-long iterator (sampler.py), the multi-scale sizes (multiscale.py), rank
0's file listing forked before torch (filescan.py, no torch). Imports
common/ only."""
