"""Helpers the tests share: the data path, reading records, tiny random models, greedy reference.

(A module of its own, not conftest.py: every test folder has a conftest, and `from conftest import`
would pick whichever was imported first.)
"""
from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import pytest
import torch


from oospec_agents import data
from oospec_agents.events import ReplyEvents, TextDelta, ToolCallDelta
from oospec_agents.drafters import Draft, ReplyState, Drafter
from oospec_agents.sidecar import SidecarBase
from oospec_agents.testing import chat_template  # noqa: F401  (the `<think>` template the tests share)
from oospec_agents.bench.records import spread  # noqa: F401  (n records round-robin over the sources)

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "toolcalls"


def load_records(split: str = "dev") -> list[dict]:
    """The shared data's records, read by the package's own reader."""
    return data.load_records(DATA / f"{split}.jsonl")


#: a weather tool, as the training tests offer it
WEATHER = {"type": "function", "function": {
    "name": "get_current_weather", "description": "Get the current weather in a given city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city"]}}}


def tiny_model(kind: str, tokenizer, seed: int = 0):
    """A randomly initialised 2-layer model of the given family with SmolLM2's vocabulary."""
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config
    cls = {"llama": LlamaConfig, "qwen2": Qwen2Config, "qwen3": Qwen3Config}[kind]
    cfg = cls(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=2048,
              eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id,
              pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.eos_token_id
    return model


# ---------------------------------------------------------------- reasoning targets (#47)

TEMPLATES = {"qwen3": chat_template(), "r1": chat_template(opens=True, reads_reasoning=False)}


def tiny_qwen3(tokenizer, seed: int = 0):
    """A randomly initialised 2-layer Qwen3 with SmolLM2's vocabulary."""
    return tiny_model("qwen3", tokenizer, seed)


def make_tiny_engine(kind: str = "llama"):
    """A real engine on a tiny random model with SmolLM2's tokenizer: nonsense replies, a few
    milliseconds a round -- for what needs a real engine but not a real answer."""
    from transformers import AutoTokenizer

    from oospec_agents import Engine
    from oospec_agents.models import resolve_reference
    tokenizer = AutoTokenizer.from_pretrained(resolve_reference("embedded"))
    return Engine(tiny_model(kind, tokenizer), tokenizer, model_name=f"tiny-{kind}")


def on_target_of(engine, sidecar=None, **kw):
    """Another engine on `engine`'s target and tokenizer (its own sidecar, method defaults and locks),
    sharing `engine`'s prefix cache: the KV of a prompt depends on the target alone, so a slow test
    need not prefill again what an earlier one left (about 0.5 s a 430-token prompt in float32)."""
    from oospec_agents import Engine
    return Engine(engine.target, engine.tokenizer, sidecar, **kw).with_parts(prefix_cache=engine.prefix_cache)


def once_per_run(tmp_path_factory, name: str, compute):
    """`compute()` (JSON-able) once per test run, however many xdist workers ask for it: the first
    computes it under a file lock in the run's shared temporary folder, the others wait and read it
    (pytest-xdist's documented pattern for session fixtures). Without xdist, just `compute()`."""
    import json
    import os

    from filelock import FileLock
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return compute()
    path = tmp_path_factory.getbasetemp().parent / name
    with FileLock(f"{path}.lock"):
        if path.is_file():
            return json.loads(path.read_text())
        value = compute()
        path.write_text(json.dumps(value))
    return value


def greedy(engine, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """Plain transformers greedy decoding: the reference every method must reproduce."""
    inp = torch.tensor([prompt_ids], device=engine.target.device)
    with torch.inference_mode():
        out = engine.target.generate(inp, attention_mask=torch.ones_like(inp), do_sample=False,
                                     max_new_tokens=max_new_tokens)
    return out[0, len(prompt_ids):].tolist()


def masked_reference(engine, messages, tools, tool_choice, max_new_tokens: int, *, greedy_ids=None,
                     **grammar) -> list[int]:
    """Greedy decoding with the strict grammar's logits processor: the reference strict decoding must reproduce.
    `grammar` goes to `engine.logits_processor` (`strict=False`, `response_format=...`).

    `greedy_ids`, where given, are this prompt's unconstrained greedy tokens (`greedy`: `max_new_tokens`
    of them, or fewer ending in EOS). If the processor allows each of them in turn, they *are* what
    `generate` under it returns, and the forwards are not run again: the processor only masks, and an
    allowed unmasked argmax is the masked argmax (argmax takes the first maximum; a mask only lowers
    others), so step by step the same token is chosen from the same prefix. Otherwise `generate` runs
    under the mask. `test_strict` checks the shortcut against `generate` on embedded records."""
    ids = engine.prompt_ids(messages, tools, tool_choice=tool_choice)
    if greedy_ids is not None:
        greedy_ids = list(greedy_ids[:max_new_tokens])
        eos = engine.target.generation_config.eos_token_id
        ended = len(greedy_ids) == max_new_tokens or greedy_ids[-1] in (eos if isinstance(eos, list) else [eos])
        if ended and allowed_in_turn(engine.logits_processor(messages, tools, tool_choice=tool_choice, **grammar),
                                     ids, greedy_ids, engine.target.get_output_embeddings().weight.shape[0]):
            return greedy_ids
    inp = torch.tensor([ids], device=engine.target.device)
    proc = engine.logits_processor(messages, tools, tool_choice=tool_choice, **grammar)
    with torch.inference_mode():
        out = engine.target.generate(inp, attention_mask=torch.ones_like(inp), logits_processor=[proc],
                                     do_sample=False, max_new_tokens=max_new_tokens)
    return out[0, len(ids):].tolist()


def allowed_in_turn(proc, prompt_ids: list[int], tokens: list[int], vocab: int) -> bool:
    """Whether logits processor `proc` (single use), called as `generate` calls it (the whole sequence so
    far, then scores of one row), leaves each of `tokens` finite in its turn."""
    scores = torch.zeros(1, vocab)
    for t, token in enumerate(tokens):
        masked = proc(torch.tensor([prompt_ids + tokens[:t]]), scores)
        if masked[0, token] == float("-inf"):
            return False
    return True


def trace_stream(engine, *args, **kwargs) -> tuple[list[tuple[int, object]], list[int]]:
    """Consume `engine.stream(...)`, noting the round in which each event arrived.

    Returns ([(round, event), ...], committed): round r is the commit after the target's r-th
    forward (1 = the prefill), and `committed[r - 1]` is how many new tokens were committed by then
    (under a grammar, with the tokens it forced right after that forward: jump-forward).
    """
    verifier, decoder = engine._verifier, engine._decoder
    committed = [1]  # the prefill's forward commits one token
    real, real_forced = verifier.verify, decoder._forced

    def verify(tree, cache, past, **kw):
        path, nxt, logits = real(tree, cache, past, **kw)
        # the accepted drafts plus the target's own token (the forced tokens at the tree's start were counted)
        committed.append(committed[-1] + len(path) - tree.start)
        return path, nxt, logits

    def forced(*a, **kw):
        run = real_forced(*a, **kw)
        committed[-1] += len(run)
        return run

    verifier.verify, decoder._forced = verify, forced
    try:
        events = [(len(committed), item) for item in engine.stream(*args, **kwargs)]
    finally:
        del verifier.verify, decoder._forced
    return events, committed


def check_events(engine, prefix: str, events, committed) -> None:
    """The event-stream contract, checked against the final Generation and the commit schedule:

    - the ReasoningDeltas join to `Generation.reasoning` (none where it is None), the TextDeltas to
      `Generation.content`;
    - call i's first event carries its id and name, the rest argument fragments, and the fragments
      join to its arguments (valid: `json.loads` equals them; invalid: the raw string);
    - nothing is sent later than the round that committed it: after round r, each call's fragments
      cover its arguments as far as the committed text reaches (less an unfinished escape), and its
      name arrives in the round that commits the name's closing quote;
    - one `ToolCallReady` per entry of `Generation.tool_calls`, in order, with its id, name and
      arguments, after the call's last fragment, in the round that commits the arguments' end;
    - `CallPredicted` only from `oospec`, each call a `{"name", "arguments": dict}`.
    """
    import json

    from oospec_agents import CallPredicted, Generation, ReasoningDelta, TextDelta, ToolCallDelta, ToolCallReady
    gen = events[-1][1]
    assert isinstance(gen, Generation)
    body = [(r, e) for r, e in events[:-1]]
    assert all(isinstance(e, (ReasoningDelta, TextDelta, ToolCallDelta, ToolCallReady, CallPredicted)) for _, e in body)
    ready = [(k, r, e) for k, (r, e) in enumerate(body) if isinstance(e, ToolCallReady)]
    # a call whose arguments closed is ready; only a reply cut off before the call's closing markup
    # (max_new_tokens, a stop string) can leave it unterminated, an invalid call, after its ToolCallReady
    cut = {c["id"] for c in gen.invalid_tool_calls if gen.finish_reason == "length" or "unterminated" in c["error"]}
    assert [(e.id, e.name, e.arguments) for _, _, e in ready if e.id not in cut] == \
        [(c["id"], c["name"], c["arguments"]) for c in gen.tool_calls]
    for _, e in body:
        if isinstance(e, CallPredicted):
            assert gen.stats.method == "oospec"
            assert all(set(c) == {"name", "arguments"} and isinstance(c["arguments"], dict) for c in e.calls)
    thought = [e.text for _, e in body if isinstance(e, ReasoningDelta)]
    assert ("".join(thought) if thought or gen.reasoning is not None else None) == gen.reasoning
    assert "".join(e.text for _, e in body if isinstance(e, TextDelta)) == gen.content
    calls = sorted([*gen.tool_calls, *gen.invalid_tool_calls], key=lambda c: int(c["id"].rsplit("_", 1)[1]))
    deltas = [(r, e) for r, e in body if isinstance(e, ToolCallDelta)]
    assert sorted({e.index for _, e in deltas}) == list(range(len(calls)))
    tok = engine.tokenizer
    texts = [prefix + tok.decode(gen.token_ids[:n], skip_special_tokens=True).rstrip("\ufffd") for n in committed]
    pos = 0 if gen.reasoning is None else gen.text.find(engine.reasoning.close) + len(engine.reasoning.close)
    for i, call in enumerate(calls):
        mine = [(r, e) for r, e in deltas if e.index == i]
        (r_name, first), rest = mine[0], mine[1:]
        assert (first.id, first.name, first.arguments) == (call["id"], call["name"], "")
        assert all(e.id is None and e.name is None and e.arguments for _, e in rest)
        joined = "".join(e.arguments for _, e in rest)
        if isinstance(call["arguments"], dict):
            assert json.loads(joined) == call["arguments"]
        else:
            assert joined == call["arguments"]
        # where the name and the arguments stand in the reply's text
        name_end = gen.text.index(json.dumps(call["name"], ensure_ascii=False), pos) + len(json.dumps(call["name"]))
        start = gen.text.find(joined, name_end)
        if start < 0:  # an invalid call with no arguments value: its fragments are its raw text
            continue
        pos = start + len(joined)
        assert r_name == next(r for r, t in enumerate(texts, 1) if len(t) >= name_end), "name sent late"
        if isinstance(call["arguments"], dict):  # a tool call: ready once its arguments have closed
            (k_ready, r_ready, _), = [(k, r, e) for k, r, e in ready if e.id == call["id"]]
            last_fragment = max(k for k, (_, e) in enumerate(body) if isinstance(e, ToolCallDelta) and e.index == i)
            assert k_ready > last_fragment
            assert r_ready == next(r for r, t in enumerate(texts, 1) if len(t) >= pos), "ready sent late or early"
        for r, text in enumerate(texts, 1):
            sent = "".join(e.arguments for rr, e in rest if rr <= r)
            due = min(len(joined), max(0, len(text) - start))
            assert joined.startswith(sent) and len(sent) >= due - 5, f"call {i}: fragments sent late in round {r}"


class ReferenceDrafter(Drafter):
    """TEST DOUBLE: knows the greedy continuation and drafts it with a planted error."""
    source = "retrieval"

    def __init__(self, reference, n_prompt, wrong_at, branch):
        self.reference, self.n_prompt, self.wrong_at, self.branch = reference, n_prompt, wrong_at, branch

    def propose(self, ctx: ReplyState):
        done = len(ctx.ids) - self.n_prompt
        good = self.reference[done:done + 8]
        bad = list(good)
        if len(bad) > self.wrong_at:
            bad[self.wrong_at] = (bad[self.wrong_at] + 1) % 1000
        # With `branch`, the flawed draft comes first, so the accepted path is not contiguous in the tree.
        return [Draft(bad, self.source), Draft(good, self.source)] if self.branch else [Draft(bad, self.source)]


def replay(fmt, text: str) -> list:
    """Every event of `text` committed one character per round, and the final flush."""
    events = ReplyEvents(fmt, lambda i: f"call_{i}")
    out = [e for end in range(1, len(text) + 1) for e in events.feed(text[:end])]
    return out + events.feed(text, final=True)


def joined(events) -> tuple[str, dict[int, dict]]:
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    calls: dict[int, dict] = {}
    for e in events:
        if isinstance(e, ToolCallDelta):
            call = calls.setdefault(e.index, {"id": e.id, "name": e.name, "arguments": ""})
            call["arguments"] += e.arguments
    return text, calls


class InTime(SidecarBase):
    """Holds submit() until the wave has posted: the hint is ready at the first round, as when the
    sidecar has its own GPU (its place is none of the target's cores: `SidecarBase`'s). Forward counts
    then do not depend on how busy the CPU is."""

    def __init__(self, sidecar):
        self.sidecar = sidecar
        self.name = sidecar.name

    def submit(self, request):
        from oospec_agents.sidecar.protocol import wait_for_wave  # `oospec bench --hint-first`'s wait
        return wait_for_wave(self.sidecar.submit(request), 120)


class ScriptedTarget:
    """A tiny random model made to write a given reply, for a real engine (drafts, verification, KV
    cache, events, `_finish`) whose reply does not depend on what a model happens to write. A forward
    hook puts the script's next token far above every other at each position (the engine passes its
    position ids), so greedy decoding, by any method, writes `script(...)`'s text and then its
    end-of-sequence token."""

    def __init__(self, model, tokenizer):
        self.tokenizer, self.eos = tokenizer, tokenizer.eos_token_id
        self.start, self.tokens = 0, []
        model.register_forward_hook(self._force, with_kwargs=True)

    def script(self, prompt_ids: list[int], text: str) -> None:
        """The reply to write after `prompt_ids` (`Engine.prompt_ids` of the request)."""
        self.start = len(prompt_ids)
        self.tokens = self.tokenizer.encode(text, add_special_tokens=False) + [self.eos]

    def _force(self, module, args, kwargs, out):
        rows = out.logits.shape[1]
        for row, pos in enumerate(kwargs["position_ids"][0, -rows:].tolist()):
            k = pos + 1 - self.start  # the logits at `pos` choose the token after it
            out.logits[0, row, self.tokens[k] if 0 <= k < len(self.tokens) else self.eos] += 1e4


class ScriptDrafter(Drafter):
    """TEST DOUBLE: drafts the scripted reply itself, up to 90 tokens a round."""
    source = "retrieval"

    def __init__(self, target: ScriptedTarget):
        self.target = target

    def propose(self, ctx: ReplyState) -> list[Draft]:
        done = len(ctx.ids) - self.target.start
        return [Draft(self.target.tokens[done:done + 90], self.source)]


def save_lora(base, out, seed: int = 0):
    """A freshly initialised LoRA for the model in directory `base`, saved to `out` (returned): random A
    and B (`init_lora_weights=False`), so that it changes the merged weights. No training: a second valid
    adapter for the hot swap's tests."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM
    torch.manual_seed(seed)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32),
                           LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    model.save_pretrained(out)
    return out


@contextmanager
def batch_sizes(engine):
    """The batch sizes of the verify forwards of every reply `engine` streams meanwhile (each `Generation`'s
    `stats.batch_sizes`: how many replies shared each of its forwards)."""
    from oospec_agents import Generation
    sizes, real = [], engine.stream

    def stream(*args, **kwargs):
        for event in real(*args, **kwargs):
            if isinstance(event, Generation):
                sizes.extend(event.stats.batch_sizes)
            yield event
    engine.stream = stream
    try:
        yield sizes
    finally:
        del engine.stream


def record_requests(monkeypatch, engine) -> list[list]:
    """Every request a front-end makes of `engine`: [messages, tools, keywords, Generation]."""
    from contextlib import closing

    from oospec_agents import ChatRequest, Generation
    from oospec_agents.request import SETTINGS
    seen: list[list] = []
    real = engine.stream

    def stream(request, tools=None, **kw):
        events = real(request, tools, **kw)  # eager, as the real one: bad input raises here
        if isinstance(request, ChatRequest):  # its settings as keywords: those it sets, and the sampling
            kw = {**{k: v for k in SETTINGS if k != "tools" and (v := getattr(request, k)) is not None},
                  "sampling": request.sampling, **kw}
            request, tools = request.messages, request.tools
        entry = [request, tools, kw, None]
        seen.append(entry)

        def tap():
            with closing(events):
                for event in events:
                    if isinstance(event, Generation):
                        entry[3] = event
                    yield event
        return tap()

    monkeypatch.setattr(engine, "stream", stream)
    return seen


def _amx_bf16() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            return "amx_bf16" in f.read()
    except OSError:
        return False


#: A known flaw on CPUs whose bf16 matrix products run on AMX tiles (Intel Xeon, Sapphire Rapids on): there
#: the one-forward "exact" prefill and the deterministic mode's fixed shapes are not bit-exact (a warm hit's
#: logits, a position's logits in another forward shape, hence some bf16 replies, differ), measured
#: 2026-12-05 on this project's Xeon at 2c33a8e, before the speculative-tools work; the same tests pass on
#: the AVX512-BF16 EPYC they were written on. Marked, not hidden: they still run, and report XPASS where
#: the flaw is absent. Fixing it (which kernel AMX takes per shape) is open work.
AMX_BF16_FLAW = pytest.mark.xfail(_amx_bf16(), strict=False,
                                  reason="bf16 on AMX tiles: the exact prefill and deterministic shapes are not "
                                         "bit-exact here (measured at 2c33a8e on the Xeon; passes on AVX512-BF16)")
