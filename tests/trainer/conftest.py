"""Fixtures for the trainer's tests."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture
def one_thread():
    """Run on one intra-op thread: these tensors are tiny, and on a busy 2-core
    CI machine OpenMP's thread hand-off costs several times the work itself."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
