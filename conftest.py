"""Suite-wide settings for running the tests in parallel: `make test` runs them under pytest-xdist
(`-n logical --dist loadfile --no-loadscope-reorder`); plain `pytest` runs them in one process, as before.

- Each worker process gets its share of the cores for torch. Two workers of two threads each on a
  two-core machine would oversubscribe every forward; one thread each keeps both cores busy where one
  process of two threads left one of them idle most of the time (the suite's many small forwards,
  tokenisation, HTTP and process start-ups run on one core).
- Every test file runs in one worker (`--dist loadfile`), so its module-scoped fixtures (models, servers,
  reference tokens) are built once. Not `--dist loadgroup`: xdist 3.8 marks a group by appending it to
  `item._nodeid`, which pytest 9 no longer reads (`nodeid` is built from `item._id`), so under pytest 9
  every test was a scope of its own and a file's tests were spread over the workers, each building the
  file's fixtures again (Gemma 3's ten references twice: 150 s each).
- The longest files are handed out first (`LONGEST_FIRST`)."""
from __future__ import annotations

import os

import pytest


# `sidecar_placement="auto"` splits the cores between the target and the sidecar where its cost model
# projects a split faster (oospec_agents/sidecar/layout.py), which depends on the machine's core count:
# the suite pins "shared" so that what it asserts is the same on every machine (tests/test_cores.py
# drives the projection itself).
os.environ.setdefault("OOSPEC_CPU_LAYOUT", "shared")


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


# The files that take longest, longest first (per-file sums of `--durations=0`, 2026-12-03): handed out
# first, so that no long file starts when the others are nearly done. The two Ray files stand apart, so that
# two local Ray clusters seldom run at once. The rest follow in collection order (`make test` passes
# --no-loadscope-reorder, which keeps this order).
LONGEST_FIRST = ["tests/test_wheels.py", "tests/test_strict.py", "tests/test_deterministic.py", "tests/test_gemma3.py",
                 "tests/test_sidecar_process.py", "tests/test_engine.py", "tests/test_serve_ray.py",
                 "tests/test_sidecar_embedded.py", "tests/test_notebooks.py", "tests/test_bench_run.py",
                 "tests/test_bench_strict.py", "tests/test_serve_langchain_standard.py", "tests/test_train_embedded.py",
                 "tests/test_train_lora.py", "tests/test_prefix_cache.py", "tests/test_sidecar_ray.py",
                 "integrations/langchain/tests/integration_tests/test_chat_oospec_standard_live.py"]


def _file(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]  # as xdist's loadfile scopes it


class _LongestFirst:
    @pytest.hookimpl(trylast=True)  # after pytest's own reordering (by parametrized session fixtures)
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        # Only in xdist's workers: they collect, and the first one's order is the order files are handed out in.
        if not os.environ.get("PYTEST_XDIST_WORKER"):
            return
        rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
        items.sort(key=lambda item: rank.get(_file(item), len(rank)))  # stable: each file keeps its order
