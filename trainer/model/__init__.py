"""The network: building blocks (blocks.py), one module per family
(families/), the detector and its head (detector.py), the segmentation model
on it (segment.py), the keypoint model (pose.py), the classifier
(classify.py), box geometry and NMS (boxes.py), and weights read into it,
ultralytics' checkpoints through a restricted unpickler (weights.py,
safe_pickle.py). Imports common/ only."""
