"""The sidecar in a worker process of its own: the same hints as a thread, and every fault of the
process (death, hang, out of memory, slow start) a fault that changes nothing in the target's output.
No worker outlives `close()` or the interpreter."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest
import torch

from oospec_testing import InTime, greedy, on_target_of, tiny_model
from sidecar_faults import Faults
from oospec_agents import Engine
from oospec_agents.chat import normalize_messages
from oospec_agents.formats import Llama3JsonFormat
from oospec_agents.sidecar import HintRequest
from oospec_agents.sidecar.join import encode_payload
from oospec_agents.sidecar.hosts.process import ProcessSidecar
from oospec_agents.sidecar.runtime import WorkerSpec
from oospec_agents.sidecar.load import resolve_placement
from oospec_agents.sidecar.hosts.thread import WaveSidecar
from oospec_agents.sidecar.load import load_sidecar
from oospec_agents.sidecar.runtime import load_wave
from oospec_agents.tools import normalize_tools

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
    "required": ["city"]}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
N = 12


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _wait_gone(pids, timeout_s: float = 15.0) -> list[int]:
    """The pids still running after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while (left := [p for p in pids if not _gone(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


@pytest.fixture(scope="module")
def tiny_spec(tmp_path_factory, smollm2_tokenizer) -> WorkerSpec:
    """A tiny random sidecar model on disk, for the worker to load: its function row still picks an
    offered name, so its hints are real calls."""
    path = tmp_path_factory.mktemp("tiny-sidecar")
    tiny_model("llama", smollm2_tokenizer, seed=3).save_pretrained(path)
    smollm2_tokenizer.save_pretrained(path)
    return WorkerSpec(str(path), "cpu", torch.float32, None, 8, 4096, 1)


@pytest.fixture(scope="module")
def faults(tmp_path_factory) -> Faults:
    """Faults for the module's worker's waves (tests/sidecar_faults.py: no hook in the package)."""
    return Faults(tmp_path_factory.mktemp("faults") / "fault")


@pytest.fixture(scope="module")
def side(tiny_spec, faults):
    sidecar = ProcessSidecar(faults.spec(tiny_spec), timeout_s=30.0, name="tiny")
    sidecar.wait_ready()
    yield sidecar
    sidecar.close()


@pytest.fixture(scope="module")
def target(smollm2_tokenizer):
    return tiny_model("llama", smollm2_tokenizer, seed=7), smollm2_tokenizer


@pytest.fixture(scope="module")
def reference(target):
    engine = Engine(*target)
    return greedy(engine, engine.prompt_ids(ASK, [WEATHER], tool_choice="required"), N)


def _generate(engine):
    return engine.generate(ASK, [WEATHER], tool_choice="required", max_new_tokens=N)


def _request(fmt=None):
    return HintRequest(normalize_messages(ASK), normalize_tools([WEATHER]), fmt or Llama3JsonFormat(), ("required", None))


# ---------------------------------------------------------------- placement

def test_auto_is_a_process_on_cuda_and_a_thread_on_the_cpu():
    assert resolve_placement("auto", torch.device("cuda", 1)) == "process"
    assert resolve_placement("auto", torch.device("cpu")) == "thread"
    assert resolve_placement("process", torch.device("cpu")) == "process"
    with pytest.raises(ValueError, match="sidecar_placement must be one of .* got 'gpu'"):
        resolve_placement("gpu", torch.device("cpu"))
    with pytest.raises(ValueError, match="sidecar_placement"):
        load_sidecar("embedded", device=torch.device("cpu"), dtype=torch.float32, sidecar_placement="gpu")


def test_sidecar_placement_reaches_the_engine_from_every_front_end(monkeypatch):
    import uvicorn
    from langchain_oospec import ChatOoOSpec
    from llama_index.llms.oospec import OoOSpec

    from oospec_agents.cli import main
    from oospec_agents.serve import app as serve_app
    loads = []
    monkeypatch.setattr(Engine, "_shared", {})
    monkeypatch.setattr(Engine, "from_pretrained", lambda *a, **kw: loads.append(kw) or 1 / 0)
    with pytest.raises(ZeroDivisionError):
        ChatOoOSpec(sidecar_placement="process")._engines.get()
    with pytest.raises(ZeroDivisionError):
        OoOSpec(sidecar_placement="thread").metadata
    assert loads == [{"sidecar_placement": "process"}, {"sidecar_placement": "thread"}]
    loaders = []
    monkeypatch.setattr(serve_app, "create_app", lambda loader, **options: loaders.append(loader))
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: None)
    monkeypatch.setattr(Engine, "from_pretrained", lambda **kw: kw)
    assert main(["serve", "--sidecar-placement", "process"]) == 0
    assert main(["serve"]) == 0
    assert loaders[0]()["sidecar_placement"] == "process" and "sidecar_placement" not in loaders[1]()


# ---------------------------------------------------------------- the worker's hints

def test_the_worker_posts_the_hint_a_thread_would_and_poll_never_blocks(side, tiny_spec):
    ticket = side.submit(_request())
    t0 = time.perf_counter()
    polls = [ticket.poll() for _ in range(100)]
    assert time.perf_counter() - t0 < 0.5 and None in polls
    while (hint := ticket.poll()) is None and ticket.error is None:
        time.sleep(0.002)
    thread = InTime(WaveSidecar(load_wave(tiny_spec))).submit(_request())
    assert ticket.error is None and hint.text == thread.poll().text  # rendered here, in the target's format
    assert hint.text.startswith('{"name": "get_weather", "parameters": ')
    call = json.loads(hint.text)
    assert hint.payload_bytes == len(encode_payload({"name": call["name"], "arguments": call["parameters"]}))
    assert hint.profile["rows"] == 3 and hint.profile["wave_s"] > 0
    assert side.estimate(_request()) > 0  # from the worker's finished waves
    assert side.wait_idle(10)


def test_the_worker_runs_the_waves_that_queued_meanwhile_as_one_batch(side, tiny_spec):
    """Requests sent while a wave runs reach the worker's queue and go together into its next wave
    (`WaveHost.run_many`, `Wave.many`); each hint is the one a wave alone writes."""
    alone = InTime(WaveSidecar(load_wave(tiny_spec))).submit(_request()).poll().text
    tickets = [side.submit(_request()) for _ in range(6)]
    hints = []
    for ticket in tickets:
        while (hint := ticket.poll()) is None and ticket.error is None:
            time.sleep(0.002)
        assert ticket.error is None, ticket.error
        hints.append(hint)
    assert [h.text for h in hints] == [alone] * 6
    assert max(h.profile.get("batched", 1) for h in hints) >= 2, [h.profile for h in hints]
    assert side.wait_idle(10)


# ---------------------------------------------------------------- faults change nothing in the target's output

@pytest.mark.parametrize("fault", ["oom", "memory_error"])
def test_out_of_memory_in_the_worker_is_a_fault_and_the_worker_lives_on(fault, side, faults, target, reference):
    engine = Engine(*target, InTime(side))
    pid = side.pid
    faults.inject(fault)
    gen = _generate(engine)
    assert gen.token_ids == reference
    assert gen.stats["sidecar_error"].startswith("sidecar out of memory on cpu"), gen.stats["sidecar_error"]
    gen = _generate(engine)
    assert gen.token_ids == reference and gen.stats["sidecar_error"] is None and gen.stats["hint_bytes"] > 0
    assert side.pid == pid


def test_a_killed_worker_is_a_fault_and_the_next_request_restarts_it(side, faults, target, reference):
    engine = Engine(*target, InTime(side))
    pid = side.pid
    faults.inject("hang")  # the wave is in flight when the worker is killed
    threading.Timer(0.5, os.kill, (pid, signal.SIGKILL)).start()
    gen = _generate(engine)
    assert gen.token_ids == reference
    assert gen.stats["sidecar_error"].startswith("sidecar worker died: exit code -9"), gen.stats["sidecar_error"]
    assert not _wait_gone([pid], 5)
    gen = _generate(engine)  # a new worker: this request's hint waits for it to load
    assert gen.token_ids == reference and gen.stats["sidecar_error"] is None and gen.stats["hint_bytes"] > 0
    assert side.pid not in (None, pid)


def test_a_hung_worker_times_out_and_is_killed(side, faults, target, reference):
    engine = Engine(*target, InTime(side))
    pid = side.pid
    side.timeout_s = 2.0
    try:
        faults.inject("hang")
        gen = _generate(engine)
    finally:
        side.timeout_s = 30.0
    assert gen.token_ids == reference
    assert gen.stats["sidecar_error"].startswith("sidecar timeout: no hint after 2s; the worker process is killed")
    assert not _wait_gone([pid], 5)  # the next request starts another (the next test's)


def test_a_worker_slow_to_start_is_a_fault_and_is_left_to_finish(side, faults, target, reference):
    engine = Engine(*target, InTime(side))
    side.close()  # (after the hang above, there is no worker left to close)
    faults.inject("slow_start")
    side.timeout_s = 1.0
    try:
        gen = _generate(engine)  # starts the worker, which sleeps before it loads
    finally:
        side.timeout_s = 30.0
    assert gen.token_ids == reference
    error = gen.stats["sidecar_error"]
    assert error.startswith("sidecar timeout: no hint after 1s; the worker process is still starting"), error
    pid = side.pid
    assert side.wait_ready(60) and side.pid == pid  # not killed: it loads, and serves the next request
    gen = _generate(engine)
    assert gen.token_ids == reference and gen.stats["sidecar_error"] is None and gen.stats["hint_bytes"] > 0


def test_a_model_the_worker_cannot_load_fails_at_load_time_and_is_not_restarted(tmp_path, target, reference):
    bad = WorkerSpec(str(tmp_path / "no-such-model"), "cpu", torch.float32, None, 8, 0, 1)
    side = ProcessSidecar(bad, timeout_s=30.0)
    with pytest.raises(ValueError, match="cannot load|no-such-model"):
        side.wait_ready()
    gen = _generate(Engine(*target, InTime(side)))
    assert gen.token_ids == reference
    assert gen.stats["sidecar_error"].startswith("sidecar worker failed to start: ModelLoadError")
    assert side.pid is None


# ---------------------------------------------------------------- no worker left behind

def test_close_leaves_no_child_process_and_a_later_request_starts_another(side, target):
    with Engine(*target, side) as engine:
        side.wait_ready()
        first = side.pid
        assert first in {p.pid for p in psutil.Process().children(recursive=True)}
    assert not _wait_gone([first], 0) and side.pid is None  # close() waited for it
    side.submit(_request())
    second = side.pid
    assert second not in (None, first)
    engine.close()  # while the new worker is still loading
    assert not _wait_gone([second], 0)


EXIT_WITHOUT_CLOSE = """
import sys, psutil, torch
from oospec_agents.sidecar.join import encode_payload
from oospec_agents.sidecar.hosts.process import ProcessSidecar
from oospec_agents.sidecar.runtime import WorkerSpec
side = ProcessSidecar(WorkerSpec(sys.argv[1], "cpu", torch.float32, None, 8, 0, 1))
assert side.wait_ready(120)
print(side.pid, *[p.pid for p in psutil.Process().children(recursive=True)])
"""


def test_interpreter_exit_leaves_no_child_process(tiny_spec):
    out = subprocess.run([sys.executable, "-c", EXIT_WITHOUT_CLOSE, tiny_spec.ref], capture_output=True, text=True,
                         timeout=180, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert out.returncode == 0, out.stderr[-2000:]
    worker, *children = map(int, out.stdout.split())
    assert worker in children
    assert not _wait_gone(children), "children of the exited interpreter still run"


# ---------------------------------------------------------------- the embedded pair (SmolLM2-135M-Instruct, fp32)

@pytest.fixture(scope="module")
def embedded_process():
    from oospec_agents.models import resolve_dtype  # bf16 only where the CPU has it natively
    cpu = torch.device("cpu")
    sidecar = load_sidecar("embedded", device=cpu, dtype=resolve_dtype(None, cpu), sidecar_placement="process")
    yield sidecar
    sidecar.close()


@pytest.mark.slow
def test_a_process_sidecar_is_lossless_and_saves_forwards_on_20_dev_records(embedded_fp32, embedded_process,
                                                                            dev_records20, embedded_greedy48):
    assert isinstance(embedded_process, ProcessSidecar)
    assert embedded_process.name == "embedded:SmolLM2-135M-Instruct+smollm2-sidecar"
    # one engine for both methods: toolspec's prefill is cached, and oospec reuses it
    engine = on_target_of(embedded_fp32, InTime(embedded_process))
    n = 48  # the session's greedy references (conftest.embedded_greedy48)
    forwards = {"toolspec": 0, "oospec": 0}
    hint_tokens = 0
    for r, ref in zip(dev_records20, embedded_greedy48):
        ask = (r["messages"], r["tools"])
        ts, oo = (engine.generate(*ask, tool_choice="required", max_new_tokens=n, method=m) for m in forwards)
        assert oo.token_ids == ref == ts.token_ids, r.get("id")
        assert oo.stats["sidecar_error"] is None, oo.stats["sidecar_error"]
        forwards["toolspec"] += ts.stats["target_forwards"]
        forwards["oospec"] += oo.stats["target_forwards"]
        hint_tokens += oo.stats["accepted_by_source"]["hint"]
    print(f"\n20 records, {n} new tokens: target forwards {forwards}, hint tokens accepted {hint_tokens}")
    assert hint_tokens > 0
    assert forwards["oospec"] < forwards["toolspec"]
