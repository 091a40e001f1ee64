"""What moves the weights: the losses (loss.py: detection; segment_loss.py:
instance segmentation; pose_loss.py: keypoints), the optimizers and the learning-rate schedule
(schedule.py, musgd.py), the weights' moving average (ema.py). Imports
common/ and model/."""
