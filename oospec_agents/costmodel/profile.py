"""`oospec profile`: time the target's verify forwards on a device, with random weights, into cost.json.

The model is built from a config alone (no weights, no hub): a shipped config by name
(oospec_agents/configs/), "embedded" (the embedded SmolLM2-135M's config), or a config.json file or a directory
holding one. Every forward goes through the engine's own `Verifier`, so the tree mask, the position ids
and the KV cache are exactly the engine's; the time kept is `Verifier.last_forward_s`, the model call
alone (synchronised on CUDA), which is what the engine's `stats.forward_s` counts. The rest of a round
(drafting, the mask, commits) is host time, which `oospec project` takes from the bench run.
"""
from __future__ import annotations

import json
import logging
import random
import statistics
import time
from pathlib import Path

import torch

from ..errors import DeviceError, ModelLoadError
from .table import KIND

log = logging.getLogger(__name__)

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"
ALIASES = {"embedded": "smollm2-135m"}


def shipped_configs() -> list[str]:
    return sorted(p.stem for p in CONFIG_DIR.glob("*.json")) + sorted(ALIASES)


def load_config(ref: str) -> tuple[str, dict]:
    """(name, config dict without our "_source" note) for a shipped name, a config.json, or a model dir."""
    path = Path(ref).expanduser()
    if path.is_dir():
        path = path / "config.json"
        if not path.is_file():
            raise ModelLoadError(f"{ref!r} is a directory without a config.json")
    elif not path.is_file():
        name = ALIASES.get(ref, ref)
        path = CONFIG_DIR / f"{name}.json"
        if not path.is_file():
            raise ModelLoadError(f"unknown config {ref!r}: expected one of {', '.join(shipped_configs())}, "
                                 "a config.json file, or a directory holding one")
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ModelLoadError(f"{str(path)!r} is not valid JSON: {e}") from None
    if "model_type" not in config:
        raise ModelLoadError(f"{str(path)!r} has no model_type: not a transformers config.json")
    source = config.pop("_source", None)
    name = ref if path.parent != CONFIG_DIR else path.stem
    return name, config | ({"_source": source} if source else {})


def build_model(config: dict, device: torch.device, dtype: torch.dtype):
    """A randomly initialised causal LM of `config`'s shape, created directly on `device`."""
    from transformers import AutoConfig, AutoModelForCausalLM
    cfg = AutoConfig.for_model(**{k: v for k, v in config.items() if k != "_source"})
    with torch.device(device):  # initialise on the device: a 32B model's random init on the CPU takes minutes
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    return model.eval()


def bushy_tree(k: int, vocab: int, rng: random.Random):
    """A tree of `k` nodes like the engine's: a main chain of depth k // 2 (the first draft) and the
    other nodes as branches off random chain nodes (the later drafts). k <= 2 is a chain."""
    from ..verify import Tree
    depth = k // 2 if k > 2 else k - 1
    parents = [-1] + list(range(depth))
    while len(parents) < k:  # never below the newest node: that would only lengthen a chain
        parents.append(rng.randrange(len(parents) - 1))
    depths = [0]
    for p in parents[1:]:
        depths.append(depths[p] + 1)
    children: list[dict[int, int]] = [{} for _ in parents]
    tokens = [rng.randrange(vocab) for _ in parents]
    for i, p in enumerate(parents[1:], 1):
        while tokens[i] in children[p]:  # siblings carry distinct tokens, as in a trie
            tokens[i] = rng.randrange(vocab)
        children[p][tokens[i]] = i
    return Tree(tokens, parents, [None] * k, depths, children)


#: a point whose runs spread more than this (interquartile range / median) is listed as noisy
NOISY = 0.10


def spread(runs: list[float]) -> float:
    if len(runs) < 3:
        return 0.0
    q1, q2, q3 = statistics.quantiles(runs, n=4)
    return (q3 - q1) / q2 if q2 else 0.0


def profile(model, ks: list[int], contexts: list[int], *, warmup: int = 2, repeats: int = 7,
            prefill_repeats: int = 3, seed: int = 0, progress=None) -> dict:
    """{"k", "context", "verify_s" [k][context], "prefill_s" [context], "noisy", "runs"}: medians in seconds.

    The runs are interleaved, as the bench interleaves its methods: each repeat sweeps every point of
    the grid once, in a new random order, so a slow spell of the device (another tenant of a VM, a
    clock change) lands on all points alike instead of on the few measured during it. One filled KV
    cache per context is kept for the whole sweep."""
    from ..verify import Verifier
    verifier = Verifier(model)
    vocab = model.config.get_text_config(decoder=True).vocab_size
    rng = random.Random(seed)
    runs: dict[str, list[float]] = {}

    def sync():
        if verifier.device.type == "cuda":
            torch.cuda.synchronize(verifier.device)

    prompts = {ctx: [rng.randrange(vocab) for _ in range(ctx)] for ctx in contexts}
    caches = {}

    def prefill(ctx):
        caches[ctx] = verifier.new_cache()
        sync()
        t0 = time.perf_counter()
        verifier.forward(prompts[ctx], caches[ctx], 0, last_only=True)
        sync()
        return time.perf_counter() - t0

    for ctx in contexts:  # a warm-up each, then the timed prefills interleaved over the contexts
        prefill(ctx)
    for _ in range(prefill_repeats):
        for ctx in rng.sample(contexts, len(contexts)):
            runs.setdefault(f"prefill/{ctx}", []).append(prefill(ctx))
    trees = {k: bushy_tree(k, vocab, rng) for k in ks}

    def verify(k, ctx):
        cache = caches[ctx]
        verifier.forward(trees[k].tokens, cache, ctx, trees[k])
        cache.crop(-k)  # back to the filled context (transformers 5.x crops by a negative count)
        assert cache.get_seq_length() == ctx
        return verifier.last_forward_s

    points = [(k, ctx) for ctx in contexts for k in ks]
    for k, ctx in points:
        for _ in range(warmup):
            verify(k, ctx)
    for r in range(repeats):
        for k, ctx in rng.sample(points, len(points)):
            runs.setdefault(f"verify/{k}/{ctx}", []).append(verify(k, ctx))
        if progress:
            progress(f"sweep {r + 1}/{repeats} of {len(points)} points")
    verify_s = [[statistics.median(runs[f"verify/{k}/{ctx}"]) for ctx in contexts] for k in ks]
    prefill_s = [statistics.median(runs[f"prefill/{ctx}"]) for ctx in contexts]
    noisy = [key for key, raw in runs.items() if spread(raw) > NOISY]
    if progress:
        _report(progress, ks, contexts, verify_s, prefill_s, noisy, len(runs))
    return {"k": ks, "context": contexts, "verify_s": verify_s, "prefill_s": prefill_s, "noisy": noisy, "runs": runs}


def _report(progress, ks: list[int], contexts: list[int], verify_s: list[list[float]], prefill_s: list[float],
            noisy: list[str], n_points: int) -> None:
    """The sweep's medians through `progress`, and a warning where points vary too much between runs."""
    for i, k in enumerate(ks):
        progress(f"k={k:<3} " + "  ".join(f"context={ctx}: {1000 * verify_s[i][j]:.2f} ms"
                                         for j, ctx in enumerate(contexts)))
    progress("prefill " + "  ".join(f"context={ctx}: {1000 * t:.2f} ms" for ctx, t in zip(contexts, prefill_s)))
    if noisy:
        progress(f"warning: {len(noisy)} of {n_points} points vary by more than {NOISY:.0%} between runs "
                 "(interquartile range / median): is something else running on this device?")


def _ints(text: str) -> list[int]:
    try:
        values = sorted({int(v) for v in text.split(",") if v.strip()})
    except ValueError:
        values = []
    if not values or values[0] < 1:
        import argparse
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r}")
    return values


def add_parser(sub, name):
    p = sub.add_parser(name, help="time verify forwards of a config (random weights) on a device: cost.json",
                       description=__doc__)
    p.add_argument("--config", required=True,
                   help=f"a shipped config ({', '.join(shipped_configs())}), a config.json, or a directory")
    p.add_argument("--device", default="cuda:0" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="bfloat16", help="bfloat16 | float16 | float32")
    p.add_argument("--k", type=_ints, default=_ints("1,2,4,8,16,32,48,64"), help="tree sizes, root included")
    p.add_argument("--context", type=_ints, default=_ints("256,1024,4096"), help="cached tokens before a forward")
    p.add_argument("--repeats", type=int, default=7, help="timed runs per point (the median is kept)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (CPU)")
    p.add_argument("--out", default="cost.json")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(run=run)


def run(args):
    import transformers

    from ..bench.env import device_name
    from ..gcheap import freeze_gc_heap
    from ..models import resolve_dtype
    if args.threads:
        from ..sidecar.cores import set_threads  # every thread count is set in one place
        set_threads(args.threads)
    name, config = load_config(args.config)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise DeviceError(f"--device {args.device}: no CUDA device is visible to torch")
    dtype = resolve_dtype(args.dtype, device)
    say = None if args.quiet else (lambda line: print(line, flush=True))
    t0 = time.perf_counter()
    model = build_model(config, device, dtype)
    freeze_gc_heap()  # as Engine.from_pretrained does: the forwards timed here are the engine's (gcheap.py)
    if say:
        params = sum(p.numel() for p in model.parameters())
        say(f"{name}: {params / 1e9:.2f}B parameters (random) on {device} in {dtype}, "
            f"built in {time.perf_counter() - t0:.1f} s")
    table = profile(model, args.k, args.context, warmup=args.warmup, repeats=args.repeats, progress=say)
    out = {"kind": KIND, "config": name, "config_source": config.get("_source"),
           "device": str(device), "device_name": device_name(device), "dtype": str(dtype).removeprefix("torch."),
           "torch": torch.__version__, "transformers": transformers.__version__,
           "torch_threads": torch.get_num_threads() if device.type == "cpu" else None,
           "tree": "k=1: the root alone; k=2: a chain; k>2: a random tree, main chain of depth k // 2, "
                   "the rest branching off it (tree mask and position ids from the engine's Verifier)",
           "timing": f"median of {args.repeats} after {args.warmup} warm-up runs, interleaved: each repeat sweeps "
                     "the whole grid in a random order; the model call alone (Verifier.last_forward_s); prefill: "
                     "median of 3 from an empty cache, interleaved over the contexts; `noisy`: the points "
                     f"whose runs spread more than {NOISY:.0%} (interquartile range / median)",
           "weights": "random (AutoModelForCausalLM.from_config): a cost table, not a model"} | table
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0
