"""Imported first by the loader workers' fork server (workers.PRELOAD) and
nowhere else: the server ignores the signals Slurm sends to every process
of a job step (the site's preemption signal, SIGTERM at the end), so that
it outlives them; the training process acts on them, its workers ignore
them too (run/inputs.py ignore_signals), and the server exits with the
training process. SIGKILL still ends it."""

import signal

from hpcyolo_trainer.common.settings import SIGNALS

for _name in SIGNALS:
    signal.signal(getattr(signal, f"SIG{_name}"), signal.SIG_IGN)
