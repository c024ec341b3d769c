import pytest
import torch

import jfa  # noqa: F401  (turns on Triton's interpreter on a machine without CUDA before triton is imported)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
