"""What a training process makes once and keeps for its whole life (torch's
and the trainer's imports, the run's set-up), made without the cyclic
garbage collector and then kept out of every later collection. No torch
here: the CLI uses it around torch's import."""

from __future__ import annotations

import gc
from contextlib import contextmanager


@contextmanager
def long_lived():
    """The block without the cyclic collector; what it made is then frozen
    (gc.freeze) and the collector runs again where it ran before.

    Its full collections, as the heap grew, traversed every object the block
    had made: torch's imports (0.7 s of a 5 s start at 50k images, CPU), and
    in the set-up one label view and path text per image (23 ms of
    collections at 50k images). Frozen, those objects are not traversed by
    any later full collection, in this process or in a loader worker forked
    from it (the collector's writes would copy pages the fork shared). What
    the block left as garbage in cycles stays: a few thousand objects of the
    imports, under a megabyte, that a collection took 0.2 s to find; a few
    hundred of the set-up."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if collecting:
            gc.enable()
