"""What moves the weights: the loss (loss.py), the optimizers and the
learning-rate schedule (schedule.py, musgd.py), the weights' moving average
(ema.py). Imports common/ and model/."""
