import pytest
import torch

import jfa  # noqa: F401  (turns on Triton's interpreter on a machine without CUDA before triton is imported)
from jfa.runtime import interpreting


def pytest_collection_modifyitems(config, items):
    """gpu: needs CUDA. interpreter: runs the Triton kernels on CPU tensors, which needs Triton's interpreter
    (on by default on a machine with no GPU; a GPU machine runs the `gpu` tests instead)."""
    no_gpu = pytest.mark.skip(reason="needs a CUDA device")
    no_interp = pytest.mark.skip(reason="Triton runs compiled here (CUDA present); the gpu tests cover it")
    for item in items:
        if "gpu" in item.keywords and not torch.cuda.is_available():
            item.add_marker(no_gpu)
        if "interpreter" in item.keywords and not interpreting():
            item.add_marker(no_interp)
