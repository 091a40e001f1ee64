"""The DDP trainer and the YOLO-family detector (installed as hpcyolo_trainer).

This package imports torch; hpcyolo itself must not import it at start-up.
"""
