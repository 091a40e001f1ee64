"""Image classification (ultralytics' classify): a dataset of class folders
(train/CLASS/*.jpg, val/CLASS/*.jpg; data/classify.py), ultralytics'
classify_augmentations and classify_transforms, the `*-cls` classifier of
each family (model/classify.py), ultralytics' v8ClassificationLoss
(optim/classify_loss.py), top-1 and top-5 accuracy with fitness their mean
(eval/classify.py). Its parts live in their concern's folders; this module
hands them to the run as one `Task`."""
