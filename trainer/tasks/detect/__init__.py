"""Detection, hpcyolo's first task: YOLO label files (`cls cx cy w h`,
fractions of the image), the anchor-free head of model/detector.py, YOLOv8's
loss (YOLO26's two-head one for an end-to-end model), mAP50 and mAP50-95
with ultralytics' matching, fitness 0.1 x mAP50 + 0.9 x mAP50-95, and
ultralytics' detection plots. Each part lives in its concern's folder; this
module hands them to the run as one `Task`."""
