import pytest
import torch

import jfa  # noqa: F401  (turns on Triton's interpreter on a machine without CUDA before triton is imported)
from jfa.runtime import interpreting


def pytest_addoption(parser):
    parser.addoption("--shard", default=None, metavar="I/N",
                     help="run the I-th of N parts of the selected tests (1-based), every case of a test function in "
                          "one part: the GPU suite in two device calls of at most 10 minutes each")
    parser.addoption("--times", default=None, metavar="FILE",
                     help="append each test's seconds (setup, call and teardown), outcome and id to FILE as it "
                          "ends: a run cut by a time limit still says what took its time (scripts/gpu_tests.sh)")


_TIMES = {"file": None, "seconds": {}, "outcome": {}}


def pytest_configure(config):
    path = config.getoption("--times")
    if path and not hasattr(config, "workerinput"):  # (the controller writes: xdist's workers send it every report)
        _TIMES["file"] = open(path, "a", buffering=1)


def pytest_unconfigure(config):
    if _TIMES["file"] is not None:
        _TIMES["file"].close()
        _TIMES["file"] = None


def pytest_runtest_logreport(report):
    """--times: a test's line once its teardown is reported (the sum of its three phases; the outcome of its call,
    or of its setup or teardown where that did not pass)."""
    if _TIMES["file"] is None:
        return
    seconds, outcome = _TIMES["seconds"], _TIMES["outcome"]
    seconds[report.nodeid] = seconds.get(report.nodeid, 0.0) + report.duration
    if report.when == "call" or (report.when == "setup" and not report.passed):
        outcome[report.nodeid] = report.outcome
    if report.when == "teardown":
        done = outcome.pop(report.nodeid, report.outcome)
        if report.failed:
            done = "error"
        _TIMES["file"].write(f"{seconds.pop(report.nodeid):.2f}\t{done}\t{report.nodeid}\n")


def _function(item) -> tuple:
    """The test function an item is a case of: (file, name)."""
    return str(item.path), getattr(item, "originalname", item.name)


def _shard(items, index: int, count: int) -> set:
    """The test functions (file, name) of part `index` of `count`: functions by case count, largest first, each
    into the part with the fewest cases so far (ties by name): the same parts on every run of the same selection,
    and on every xdist worker."""
    groups = {}
    for item in items:
        groups[_function(item)] = groups.get(_function(item), 0) + 1
    load = [0] * count
    mine = set()
    for key, n in sorted(groups.items(), key=lambda kv: (-kv[1], kv[0])):
        part = min(range(count), key=lambda i: (load[i], i))
        load[part] += n
        if part == index - 1:
            mine.add(key)
    return mine


@pytest.hookimpl(trylast=True)  # (after -m and -k have deselected theirs: the parts split what is left)
def pytest_collection_modifyitems(config, items):
    """gpu: needs CUDA. interpreter: runs the Triton kernels on CPU tensors, which needs Triton's interpreter
    (on by default on a machine with no GPU; a GPU machine runs the `gpu` tests instead). --shard I/N: part I."""
    shard = config.getoption("--shard")
    if shard:
        index, count = (int(x) for x in shard.split("/"))
        if not 1 <= index <= count:
            raise pytest.UsageError(f"--shard {shard}: I must lie in 1..N")
        mine = _shard(items, index, count)
        config.hook.pytest_deselected(items=[it for it in items if _function(it) not in mine])
        items[:] = [it for it in items if _function(it) in mine]
    no_gpu = pytest.mark.skip(reason="needs a CUDA device")
    no_interp = pytest.mark.skip(reason="Triton runs compiled here (CUDA present); the gpu tests cover it")
    for item in items:
        if "gpu" in item.keywords and not torch.cuda.is_available():
            item.add_marker(no_gpu)
        if "interpreter" in item.keywords and not interpreting():
            item.add_marker(no_interp)
