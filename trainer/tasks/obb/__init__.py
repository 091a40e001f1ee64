"""Oriented bounding boxes (ultralytics' obb): label files of four corners
(`cls x1 y1 x2 y2 x3 y3 x4 y4`, fractions of the image) carried through
every augmentation as ultralytics carries them (data/augment.py
rotated_clip), each item's boxes the minimum-area rectangle of its corners
(xywhr), the detector with an angle branch (model/obb.py), ultralytics'
v8OBBLoss or, for YOLO26, its E2ELoss of it (optim/obb_loss.py), P, R, mAP50
and mAP50-95 matched by ProbIoU after rotated NMS (eval/evaluate.py
obb_batch_stats), fitness detection's. Its parts live in their concern's
folders; this module hands them to the run as one `Task`."""
