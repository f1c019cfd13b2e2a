"""Suite-wide settings for running the tests in parallel: `make test` runs them under pytest-xdist
(`-n logical --dist loadgroup --no-loadscope-reorder`); plain `pytest` runs them in one process, as before.

- Each worker process gets its share of the cores for torch. Two workers of two threads each on a
  two-core machine would oversubscribe every forward; one thread each keeps both cores busy where one
  process of two threads left one of them idle most of the time (the suite's many small forwards,
  tokenisation, HTTP and process start-ups run on one core).
- Every test file is one xdist group, so its module-scoped fixtures (models, servers, reference tokens)
  are built once, in one worker. The files that start a local Ray cluster share one group, so that
  two clusters never start at once (`pytest.mark.xdist_group("ray")` in those files)."""
from __future__ import annotations

import os

import pytest


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(_LongestFirst(), "oospec-longest-first")
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")  # set in each xdist worker
    if not workers:
        return
    threads = max(1, _cores() // int(workers))
    # The processes that the tests start (a process sidecar, Ray's workers, a notebook's kernel, the CLI)
    # read it; this process sets torch's own count, which is also the count its later threads start with.
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    import torch
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


# The groups that take longest, longest first (`pytest --durations=0` of a serial run, seconds summed per
# file, 2026-12-03): handed out first, so that no long group starts when the others are nearly done.
# The rest follow in collection order (`make test` passes --no-loadscope-reorder, which keeps this order).
LONGEST_FIRST = ["tests/test_strict.py", "tests/test_bench.py", "tests/test_engine.py", "ray",
                 "tests/test_sidecar_process.py", "tests/test_gemma3.py", "tests/test_serve_langchain_standard.py",
                 "tests/test_sidecar.py", "tests/test_notebooks.py", "tests/test_train.py",
                 "tests/test_prefix_cache.py",
                 "integrations/langchain/tests/integration_tests/test_chat_oospec_standard_live.py"]


def _group(item: pytest.Item) -> str:
    mark = next(item.iter_markers("xdist_group"), None)
    if mark is None:
        return ""
    return str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))  # as xdist reads it


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the groups into the node ids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("dist", "no") != "loadgroup":
        return
    for item in items:
        if next(item.iter_markers("xdist_group"), None) is None:
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))


class _LongestFirst:
    @pytest.hookimpl(trylast=True)  # after pytest's own reordering (by parametrized session fixtures)
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        if config.getoption("dist", "no") != "loadgroup":
            return
        rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
        items.sort(key=lambda item: rank.get(_group(item), len(rank)))  # stable: groups keep their order
