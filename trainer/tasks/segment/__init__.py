"""Instance segmentation (ultralytics' segment): polygon label files (`cls x1
y1 x2 y2 ...`, fractions of the image) carried through every augmentation
and rasterised as ultralytics does (data/masks.py), the detector with mask
coefficients and prototypes (model/segment.py), ultralytics'
v8SegmentationLoss, or for YOLO26 its E2ELoss of SegmentLoss26
(optim/segment_loss.py), box and mask P, R, mAP50 and
mAP50-95 with ultralytics' matching, fitness the boxes' mAP50-95 plus the
masks'. Its parts live in their concern's folders; this module hands them
to the run as one `Task`."""
