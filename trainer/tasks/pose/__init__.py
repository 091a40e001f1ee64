"""Keypoints (ultralytics' pose): label rows of a box and K keypoints
(`cls cx cy w h x1 y1 v1 ...`, the data YAML's kpt_shape [K, 2 or 3],
flip_idx and kpt_oks_sigmas) carried through every augmentation as
ultralytics carries them (data/keypoints.py: warped with the image, those
that leave it unlabelled, flipped and reordered by flip_idx), the detector
with a keypoint branch per level (model/pose.py: ultralytics' Pose, YOLO26's
Pose26), ultralytics' v8PoseLoss or, for YOLO26, its E2ELoss of PoseLoss26
(optim/pose_loss.py), the boxes' P, R, mAP50 and mAP50-95 by IoU and the
keypoints' by OKS after NMS or YOLO26's one-to-one picks (eval/evaluate.py
pose_batch_stats, eval/pose_metrics.py), fitness the boxes' mAP50-95 plus
the keypoints'. Its parts live in their concern's folders; this module
hands them to the run as one `Task`, shaped by the data YAML's keypoint keys."""
