"""Suite-wide settings for running the tests in parallel: `make test` runs them under pytest-xdist
(`-n auto --dist loadgroup`); plain `pytest` runs them in one process, as before.

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
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")  # set in each xdist worker
    if not workers:
        return
    threads = max(1, _cores() // int(workers))
    # The processes that the tests start (a process sidecar, Ray's workers, a notebook's kernel, the CLI)
    # read it; this process sets torch's own count, which is also the count its later threads start with.
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    import torch
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the groups into the node ids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("dist", "no") != "loadgroup":
        return
    for item in items:
        if next(item.iter_markers("xdist_group"), None) is None:
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
