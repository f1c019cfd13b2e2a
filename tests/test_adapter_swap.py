"""The sidecar's adapter hot swap (#49): `engine.load_sidecar_adapter(DIR)` and the server's admin call.

- Waves that begin after a swap run the new adapter, in a thread and in a worker process; a wave
  already running ends on the old one; a worker restarted after the swap loads the new one.
- The target is the sole verifier: a swap in the middle of a reply changes none of its tokens.
- A bad adapter (missing, not an adapter, corrupt, made for another base model) is an AdapterError
  naming the problem, and the old adapter stays.
- Over HTTP: only with the API key, only under --adapter-root, errors in OpenAI's body.

The adapters are fresh peft LoRAs saved for their base in a temporary directory: no training. A test
loader (`tagged_wave`, through `WorkerSpec.loader`, as tests/sidecar_faults.py does) names the adapter
each wave ran in the wave's profile, which reaches `Hint.profile` from a thread and a worker alike.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

import httpx
import pytest
import torch

from oospec_testing import greedy, on_target_of, save_lora, tiny_model
from oospec_agents import Engine
from oospec_agents.chat import normalize_messages
from oospec_agents.errors import AdapterError
from oospec_agents.formats import Llama3JsonFormat
from oospec_agents.sidecar import FixedHint, HintRequest
from oospec_agents.sidecar import runtime
from oospec_agents.sidecar.hosts.process import ProcessSidecar
from oospec_agents.sidecar.hosts.thread import WaveSidecar
from oospec_agents.tools import normalize_tools

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
    "required": ["city"]}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
N = 16
#: while this file exists, a tagged wave waits before it runs (the worker process inherits the variable)
GATE = os.environ.setdefault("OOSPEC_TEST_ADAPTER_GATE", os.path.join(tempfile.gettempdir(),
                                                                        f"oospec-adapter-gate-{os.getpid()}"))


# ---------------------------------------------------------------- the test loader (runs in the worker too)

def tagged_wave(spec: runtime.WorkerSpec):
    return TaggedWave(runtime.load_wave(dataclasses.replace(spec, loader=None)), Path(spec.adapter).name)


class TaggedWave:
    """The real wave, whose result's profile names its adapter; it waits at the gate before it runs."""

    def __init__(self, wave, adapter: str):
        self.wave, self.adapter = wave, adapter

    def __getattr__(self, name):  # estimate, prefix_cache, cost: the real wave's
        return getattr(self.wave, name)

    def __call__(self, *args):
        while os.path.exists(GATE):
            time.sleep(0.01)
        result = self.wave(*args)
        return dataclasses.replace(result, profile={**result.profile, "adapter": self.adapter})


# ---------------------------------------------------------------- models and adapters on disk

@pytest.fixture(scope="module")
def tiny(tmp_path_factory, smollm2_tokenizer) -> dict[str, Path]:
    """A tiny random sidecar base, two adapters for it (a, b), and adapters for other bases."""
    root = tmp_path_factory.mktemp("adapters")
    base = root / "base"
    tiny_model("llama", smollm2_tokenizer, seed=3).save_pretrained(base)
    smollm2_tokenizer.save_pretrained(base)
    paths = {"base": base, "a": save_lora(base, root / "a", 1), "b": save_lora(base, root / "b", 2)}
    for name, changes in {"narrower": {"hidden_size": 32, "intermediate_size": 64},
                          "deeper": {"num_hidden_layers": 3}}.items():
        other = tiny_model("llama", smollm2_tokenizer)
        other = type(other)(type(other.config)(**{**other.config.to_dict(), **changes}))
        other.save_pretrained(root / f"{name}-base")
        paths[name] = save_lora(root / f"{name}-base", root / name, 5)
    return paths


def spec_of(tiny, adapter="a") -> runtime.WorkerSpec:
    return runtime.WorkerSpec(str(tiny["base"]), "cpu", torch.float32, str(tiny[adapter]), 8, 4096, 1,
                              loader=f"{__name__}:tagged_wave")


@pytest.fixture(scope="module", params=["thread", "process"])
def side(request, tiny):
    spec = spec_of(tiny)
    if request.param == "thread":
        sidecar = WaveSidecar(runtime.load_wave(spec), spec=spec, name=spec.name)
    else:
        sidecar = ProcessSidecar(spec, name=spec.name)
        sidecar.wait_ready()
    yield sidecar
    sidecar.close()


@pytest.fixture
def on_a(side, tiny):
    """`side` with adapter a, whatever the test before left."""
    if side.describe()["adapter"] != str(tiny["a"]):
        side.load_adapter(tiny["a"])
    return side


def request_() -> HintRequest:
    return HintRequest(normalize_messages(ASK), normalize_tools([WEATHER]), Llama3JsonFormat(), ("required", None))


def hint_of(ticket, timeout_s: float = 60.0):
    deadline = time.monotonic() + timeout_s
    while (hint := ticket.poll()) is None and ticket.error is None and time.monotonic() < deadline:
        time.sleep(0.005)
    assert ticket.error is None and hint is not None, ticket.error
    return hint


def adapter_of(sidecar) -> str:
    """The adapter the next wave runs."""
    return hint_of(sidecar.submit(request_())).profile["adapter"]


# ---------------------------------------------------------------- the swap

def test_waves_after_a_swap_run_the_new_adapter(on_a, tiny):
    assert adapter_of(on_a) == "a" and on_a.name.endswith("+a")
    assert on_a.load_adapter(tiny["b"]) == f"{tiny['base']}+b" == on_a.name
    assert adapter_of(on_a) == "b" and on_a.describe()["adapter"] == str(tiny["b"])


def test_the_swapped_in_weights_are_the_new_adapters(tiny):
    """What a thread's wave computes with after a swap is the base merged with the new adapter, exactly."""
    spec = dataclasses.replace(spec_of(tiny), loader=None)
    sidecar = WaveSidecar(runtime.load_wave(spec), spec=spec)
    old = sidecar.wave
    sidecar.load_adapter(tiny["b"])
    fresh = runtime.load_wave(dataclasses.replace(spec, adapter=str(tiny["b"])))
    swapped, reference = sidecar.wave.model.state_dict(), fresh.model.state_dict()
    assert swapped.keys() == reference.keys()
    assert all(torch.equal(swapped[k], reference[k]) for k in reference)
    assert not torch.equal(old.model.state_dict()["model.layers.0.self_attn.q_proj.weight"],
                           reference["model.layers.0.self_attn.q_proj.weight"])
    # a new prefix cache (the old one's KV is the old adapter's), the old cost line (same base, same cost)
    assert sidecar.wave.prefix_cache is not old.prefix_cache and sidecar.wave.cost is old.cost


def test_a_running_wave_ends_on_the_old_adapter(on_a, tiny):
    Path(GATE).touch()
    try:
        running = on_a.submit(request_())  # begins, and waits at the gate on adapter a
        while not wave_running(on_a):
            time.sleep(0.01)
        on_a.load_adapter(tiny["b"])  # does not wait for the running wave
        assert running.poll() is None and running.error is None
    finally:
        os.unlink(GATE)
    assert hint_of(running).profile["adapter"] == "a"
    assert adapter_of(on_a) == "b"


def wave_running(sidecar) -> bool:
    if isinstance(sidecar, ProcessSidecar):
        return sidecar._worker.running is not None  # the worker said "started"
    return not sidecar.wait_idle(0)


def test_a_restarted_worker_loads_the_new_adapter(side, on_a, tiny):
    if not isinstance(side, ProcessSidecar):
        pytest.skip("only a worker process restarts")
    side.load_adapter(tiny["b"])
    side.close()  # the next request starts another worker, from the sidecar's spec
    assert adapter_of(side) == "b"


# ---------------------------------------------------------------- a bad adapter: a clear error, the old one stays

def bad_adapter(kind: str, tiny, tmp_path: Path) -> tuple[Path, str]:
    """An adapter directory that is wrong in the way `kind` says, and the error it must raise."""
    copy = tmp_path / kind
    if kind in ("narrower", "deeper"):
        return tiny[kind], {"narrower": r"made for another base model: its LoRA A for "
                                        r"'model\.layers\.0\.self_attn\.q_proj' has shape \[4, 32\], where that "
                                        r"layer has 64 inputs, not 32",
                            "deeper": r"made for another base model: it adapts 'model\.layers\.2\.self_attn\."}[kind]
    if kind == "missing":
        return copy, "no such directory"
    shutil.copytree(tiny["a"], copy)
    config, weights = copy / "adapter_config.json", copy / "adapter_model.safetensors"
    if kind == "no config":
        config.unlink()
        return copy, "holds no adapter_config.json: not a peft adapter directory"
    if kind == "config not json":
        config.write_text('{"peft_type": "LORA", ')
        return copy, "adapter_config.json is not valid JSON"
    if kind == "not lora":
        config.write_text(json.dumps({**json.loads(config.read_text()), "peft_type": "PREFIX_TUNING"}))
        return copy, "peft_type 'PREFIX_TUNING'; expected 'LORA'"
    if kind == "no weights":
        weights.unlink()
        return copy, "holds no adapter_model.safetensors"
    if kind == "truncated weights":
        weights.write_bytes(weights.read_bytes()[:-100])
        return copy, r"adapter_model.safetensors is corrupt \(SafetensorError: .*incomplete metadata"
    if kind == "garbage weights":
        weights.write_bytes(b"\x00" * 64)
        return copy, r"adapter_model.safetensors is corrupt"
    raise ValueError(kind)


BAD = ["missing", "no config", "config not json", "not lora", "no weights", "truncated weights", "garbage weights",
       "narrower", "deeper"]


@pytest.mark.parametrize("kind", BAD)
def test_a_bad_adapter_is_refused_by_name_and_the_old_one_stays(kind, on_a, tiny, tmp_path):
    path, error = bad_adapter(kind, tiny, tmp_path)
    with pytest.raises(AdapterError, match=error):
        on_a.load_adapter(path)
    assert on_a.name.endswith("+a") and on_a.describe()["adapter"] == str(tiny["a"])
    assert adapter_of(on_a) == "a"


def test_an_adapter_naming_another_base_model_is_refused_before_anything_loads(tmp_path):
    """The base a LoRA names (`base_model_name_or_path`, a hub id) is checked against the sidecar's: the
    embedded sidecar's is SmolLM2-135M-Instruct. (No model loads: the wave here is a stub.)"""
    from oospec_agents.models import EMBEDDED_SIDECAR_ADAPTER
    copy = shutil.copytree(EMBEDDED_SIDECAR_ADAPTER, tmp_path / "qwen")
    config = copy / "adapter_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()),
                                  "base_model_name_or_path": "Qwen/Qwen2.5-0.5B-Instruct"}))
    sidecar = WaveSidecar(lambda *args: [], spec=runtime.WorkerSpec("embedded", "cpu", torch.float32, None, 8))
    with pytest.raises(AdapterError, match="made for base model 'Qwen/Qwen2.5-0.5B-Instruct', not "
                                           "'HuggingFaceTB/SmolLM2-135M-Instruct'"):
        sidecar.load_adapter(copy)


def test_a_sidecar_oospec_did_not_load_has_no_adapter_to_swap(smollm2_tokenizer, tiny):
    engine = Engine(tiny_model("llama", smollm2_tokenizer), smollm2_tokenizer)
    with pytest.raises(AdapterError, match=r"no sidecar \(sidecar=False\)"):
        engine.load_sidecar_adapter(tiny["a"])
    with pytest.raises(AdapterError, match="'fixed hint' has no adapter to swap"):
        Engine(engine.target, smollm2_tokenizer, FixedHint("x")).load_sidecar_adapter(tiny["a"])
    with pytest.raises(AdapterError, match="handed a loaded wave"):
        WaveSidecar(lambda *args: []).load_adapter(tiny["a"])


# ---------------------------------------------------------------- lossless: a swap mid-reply changes no token

def test_a_swap_during_a_stream_changes_no_token(on_a, tiny, smollm2_tokenizer):
    engine = Engine(tiny_model("llama", smollm2_tokenizer, seed=7), smollm2_tokenizer, on_a, wave_payback=None)
    reference = greedy(engine, engine.prompt_ids(ASK, [WEATHER], tool_choice="required"), N)
    events = engine.stream(ASK, [WEATHER], tool_choice="required", max_new_tokens=N)
    first = next(events)  # the reply has begun, its wave submitted on adapter a
    assert engine.load_sidecar_adapter(tiny["b"]).endswith("+b")
    gen = [first, *events][-1]
    assert gen.token_ids == reference
    gen = engine.generate(ASK, [WEATHER], tool_choice="required", max_new_tokens=N)
    assert gen.token_ids == reference and gen.stats["sidecar"].endswith("+b")


@pytest.mark.slow
def test_the_embedded_sidecar_swapped_mid_stream_stays_greedy(embedded_fp32, dev_records20, smollm2_dir, tmp_path):
    """The real pair: the shipped sidecar adapter, swapped mid-reply (from another thread, while the
    target decodes) for a fresh one on the same base; both replies equal transformers' greedy tokens."""
    from oospec_agents.models import resolve_dtype
    from oospec_agents.sidecar.load import load_sidecar
    fresh = save_lora(Path(smollm2_dir), tmp_path / "fresh", 0)
    cpu = torch.device("cpu")
    sidecar = load_sidecar("embedded", device=cpu, dtype=resolve_dtype(None, cpu), sidecar_placement="thread")
    engine = on_target_of(embedded_fp32, sidecar, wave_payback=None)
    rec = dev_records20[0]
    reference = greedy(embedded_fp32, embedded_fp32.prompt_ids(rec["messages"], rec["tools"], tool_choice="required"), 48)
    swapping = threading.Thread(target=engine.load_sidecar_adapter, args=(fresh,))
    for event in engine.stream(rec["messages"], rec["tools"], tool_choice="required", max_new_tokens=48):
        if swapping.ident is None:  # the reply has begun: swap while it decodes
            swapping.start()
    swapping.join()
    assert event.token_ids == reference and event.stats["sidecar"] == "embedded:SmolLM2-135M-Instruct+smollm2-sidecar"
    gen = engine.generate(rec["messages"], rec["tools"], tool_choice="required", max_new_tokens=48)
    assert gen.token_ids == reference and gen.stats["sidecar"] == "embedded:SmolLM2-135M-Instruct+fresh"
    sidecar.close()


# ---------------------------------------------------------------- the server's admin call

KEY = "sk-adapter-test"


@pytest.fixture(scope="module")
def server_engine(tiny, smollm2_tokenizer):
    spec = spec_of(tiny)
    sidecar = WaveSidecar(runtime.load_wave(spec), spec=spec, name=spec.name)
    engine = Engine(tiny_model("llama", smollm2_tokenizer, seed=7), smollm2_tokenizer, sidecar, wave_payback=None)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def admin(server_engine, tiny, tmp_path_factory):
    """A server with a key and an adapter root that holds b (and a corrupt copy, and a link out)."""
    from oospec_agents.serve import create_app
    from serve_testing import running
    root = tmp_path_factory.mktemp("root")
    shutil.copytree(tiny["b"], root / "b")
    shutil.copytree(tiny["a"], root / "corrupt")
    (root / "corrupt" / "adapter_model.safetensors").write_bytes(b"not safetensors")
    (root / "link").symlink_to(tiny["a"])
    with running(create_app(server_engine, model="tiny", api_key=KEY, adapter_root=str(root))) as url:
        yield url, root


def post(url: str, path, key: str | None = KEY) -> httpx.Response:
    headers = {} if key is None else {"Authorization": f"Bearer {key}"}
    return httpx.post(url + "/v1/oospec/sidecar-adapter", json={"path": str(path)}, headers=headers, timeout=120)


def test_the_admin_call_swaps_in_an_adapter_under_the_root(admin, server_engine, tiny):
    url, root = admin
    server_engine.load_sidecar_adapter(tiny["a"])
    reply = post(url, "b")  # relative: under the root
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["sidecar"] == f"{tiny['base']}+b" and body["adapter"] == str(root / "b")
    assert body["previous"] == f"{tiny['base']}+a" and body["object"] == "oospec.sidecar_adapter"
    auth = {"Authorization": f"Bearer {KEY}"}
    assert httpx.get(url + "/v1/oospec/sidecar-adapter", headers=auth).json()["sidecar"] == body["sidecar"]
    chat = httpx.post(url + "/v1/chat/completions", headers=auth, timeout=120, json={
        "model": "tiny", "messages": ASK, "tools": [WEATHER], "tool_choice": "required", "max_tokens": N})
    assert chat.json()["oospec"]["stats"]["sidecar"] == body["sidecar"]


@pytest.mark.parametrize("where", ["absolute", "dotdot", "symlink"])
def test_a_path_outside_the_root_is_refused(where, admin, server_engine, tiny):
    url, root = admin
    before = server_engine.sidecar.name
    path = {"absolute": tiny["a"], "dotdot": f"b/../../{tiny['a'].parent.name}/a", "symlink": "link"}[where]
    reply = post(url, path)
    assert reply.status_code == 403, reply.text
    error = reply.json()["error"]
    assert error["code"] == "adapter_outside_root" and error["param"] == "path" and error["type"] == "permission_error"
    assert f"resolves to {str(tiny['a'])!r}, outside --adapter-root {str(root)!r}" in error["message"]
    assert server_engine.sidecar.name == before


def test_a_bad_adapter_over_http_is_a_400_and_the_old_one_stays(admin, server_engine):
    url, root = admin
    before = server_engine.sidecar.name
    reply = post(url, "corrupt")
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["code"] == "invalid_adapter" and error["param"] == "path"
    assert "adapter_model.safetensors is corrupt" in error["message"] and f"keeps {before!r}" in error["message"]
    assert server_engine.sidecar.name == before
    missing = post(url, "nope").json()["error"]
    assert missing["code"] == "invalid_adapter" and "no such directory" in missing["message"]


def test_the_admin_call_needs_the_key(admin, server_engine):
    url, _ = admin
    assert post(url, "b", key=None).status_code == 401
    assert post(url, "b", key="wrong").json()["error"]["code"] == "invalid_api_key"


def test_without_a_key_or_a_root_the_admin_call_refuses(server_engine, tiny):
    from oospec_agents.serve import create_app
    from serve_testing import running
    with running(create_app(server_engine, model="tiny", adapter_root=str(tiny["base"].parent))) as url:
        reply = post(url, "b", key=None)
        assert reply.status_code == 403 and reply.json()["error"]["code"] == "admin_disabled"
        assert "only when the server has an API key (--api-key)" in reply.json()["error"]["message"]
    with running(create_app(server_engine, model="tiny", api_key=KEY)) as url:
        reply = post(url, tiny["b"])
        assert reply.status_code == 403 and reply.json()["error"]["code"] == "no_adapter_root"
        assert "start it with --adapter-root DIR" in reply.json()["error"]["message"]


def test_serve_takes_the_adapter_and_the_root_from_the_command_line(monkeypatch, capsys, tiny, tmp_path):
    import uvicorn

    from oospec_agents.cli import main
    from oospec_agents.serve import app as serve_app
    apps = []
    monkeypatch.setattr(serve_app, "create_app", lambda loader, **options: apps.append((loader, options)))
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: None)
    monkeypatch.setattr(Engine, "from_pretrained", lambda **kw: kw)
    assert main(["serve", "--sidecar", str(tiny["base"]), "--sidecar-adapter", str(tiny["a"]),
                 "--api-key", KEY, "--adapter-root", str(tmp_path)]) == 0
    loader, options = apps[0]
    assert loader()["sidecar_adapter"] == str(tiny["a"]) and options["adapter_root"] == str(tmp_path)
    assert main(["serve", "--adapter-root", str(tmp_path)]) == 2
    assert "--adapter-root needs --api-key" in capsys.readouterr().err
    assert main(["serve", "--sidecar-adapter", str(tmp_path / "nope")]) == 2  # before the server starts
    assert "nope': no such directory" in capsys.readouterr().err
    assert len(apps) == 1


def test_ray_serve_replicas_follow_the_adapter_another_replica_swapped_in(server_engine, tiny, caplog):
    """Serve routes the admin call to one replica, which posts the adapter on the board; every replica's
    `follow` thread loads what the board posts. One it cannot load is a warning, and it keeps its own."""
    pytest.importorskip("ray.serve")
    from oospec_agents.serve.ray_app import AdapterBoard, follow
    board, stop = AdapterBoard(), threading.Event()
    server_engine.load_sidecar_adapter(tiny["a"])
    thread = threading.Thread(target=follow, args=(server_engine, board.get, "r1", stop, 0.02), daemon=True)
    thread.start()
    try:
        board.put(str(tiny["b"]))
        deadline = time.monotonic() + 60
        while not server_engine.sidecar.name.endswith("+b") and time.monotonic() < deadline:
            time.sleep(0.02)
        assert server_engine.sidecar.describe()["adapter"] == str(tiny["b"])
        board.put(str(tiny["b"].parent / "not-on-this-node"))
        while "cannot follow" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.02)
        assert "replica r1 cannot follow the sidecar adapter swap to" in caplog.text and "no such directory" in caplog.text
        assert server_engine.sidecar.name.endswith("+b")
    finally:
        stop.set()
        thread.join(5)
