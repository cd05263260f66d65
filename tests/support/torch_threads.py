"""One torch intra-op thread for the reference pipeline's tests, as the CLI does on CPU (``set_cpu_threads``): the
pipeline's three threads would otherwise each start an OpenMP team and spin against each other on a small
machine. torch is imported only by the tests that use it."""

import pytest


@pytest.fixture
def one_cpu_thread():
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
