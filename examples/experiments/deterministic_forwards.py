"""What one deterministic decode forward costs against a normal one (docs/deterministic.md, "Decode forwards").

    OMP_NUM_THREADS=1 .venv/bin/python examples/experiments/deterministic_forwards.py --threads 1 --reps 7 --past 700,4400

The embedded target, one cache per length of past (random tokens, prefilled once). Per repetition every
variant runs each forward once, in an order that rotates per repetition, so that a machine's load drifts
over all of them; the minimum over the repetitions is reported. The forwards: one token (`ar`) and a
48-node tree (a first draft of 30 tokens and two branches off it, as `toolspec` and `oospec` build).
After each forward the cache is cropped back to its past. Variants:

- `normal`: `deterministic=False`, the forward `Verifier.forward` always ran;
- `before`: the deterministic forward as it was (to b706adf): keys padded to the reply's width (prompt +
  256 new tokens + 64, rounded to 64) by the cache's concatenation then a padded copy, attention through
  transformers' `sdpa` (which repeats the key and value heads under a mask);
- `gqa`: the same keys, attention by torch's kernel with `enable_gqa` (`deterministic.decode_attention`);
- `after`: the deterministic forward now: `gqa`, the keys appended and padded in one copy.

All three deterministic variants give the same bits (tests/test_deterministic.py).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

VARIANTS = ("normal", "before", "gqa", "after")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--past", default="700,4400", help="lengths of cached past, comma-separated")
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--nodes", type=int, default=48)
    p.add_argument("--variants", default=",".join(VARIANTS))
    args = p.parse_args(argv)

    import torch
    from transformers import DynamicCache

    from oospec_agents import Engine
    from oospec_agents import deterministic as det
    from oospec_agents.drafters import Draft
    from oospec_agents.verify import build_tree

    if args.threads:
        torch.set_num_threads(args.threads)
    engine = Engine.from_pretrained("embedded", sidecar=False, dtype=torch.bfloat16)
    v = engine._verifier
    new_padded = det._PaddedKeys

    class CatThenPad(DynamicCache):  # deterministic._PaddedKeys as it was: the cache's own cat, then a padded copy
        width: int

        def update(self, key_states, value_states, layer_idx, *a, **kw):
            keys, values = super().update(key_states, value_states, layer_idx, *a, **kw)
            pad = self.width - keys.shape[-2]
            if pad > 0:
                keys = torch.nn.functional.pad(keys, (0, 0, 0, pad))
                values = torch.nn.functional.pad(values, (0, 0, 0, pad))
            return keys, values

    def setup(variant):
        v._gqa_decode = {"before": False, "gqa": True, "after": True}.get(variant)
        det._PaddedKeys = CatThenPad if variant in ("before", "gqa") else new_padded

    variants = args.variants.split(",")
    load0 = os.getloadavg()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {engine.target.dtype}, "
          f"load average {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}", file=sys.stderr)
    g = torch.Generator().manual_seed(0)
    rows = []
    for past in (int(x) for x in args.past.split(",")):
        ids = torch.randint(100, 40000, (past + 64,), generator=g).tolist()
        cache = v.new_cache()
        for start in range(0, past, 1024):  # the prefill in pieces: its cost is not measured here
            v.forward(ids[start:min(past, start + 1024)], cache, start)
        first = ids[past + 1:past + 31]
        drafts = [Draft(first, "schema"), Draft(first[:10] + list(range(50, 70)), "retrieval"),
                  Draft(first[:3] + list(range(80, 100)), "retrieval")]
        tree = build_tree(ids[past], drafts, args.nodes)
        assert len(tree.tokens) == args.nodes and det.within_blocks(tree, past), (len(tree.tokens), past)
        shapes = det.Shapes.for_reply(past, 256)
        forwards = {"1 token": ([ids[past]], None), f"{args.nodes}-node tree": (tree.tokens, tree)}
        times = {(f, x): [] for f in forwards for x in variants}
        for rep in range(args.reps):
            order = [(f, x) for f in forwards for x in variants]
            k = rep % len(order)
            for f, x in order[k:] + order[:k]:
                tokens, t = forwards[f]
                setup(x)
                t0 = time.perf_counter()
                v.forward(tokens, cache, past, t, shapes=None if x == "normal" else shapes)
                times[(f, x)].append(time.perf_counter() - t0)
                cache.crop(-len(tokens))
                assert cache.get_seq_length() == past
        setup("after")
        for f in forwards:
            base = min(times[(f, "normal")]) if "normal" in variants else None
            cells = []
            for x in variants:
                m = min(times[(f, x)])
                cells.append(f"{m:.3f}" + (f" ({100 * (m / base - 1):+.0f}%)" if base and x != "normal" else ""))
            rows.append(f"| {past} | {f} | " + " | ".join(cells) + " |")
            print(rows[-1], file=sys.stderr, flush=True)
    load1 = os.getloadavg()
    print(f"\nmin of {args.reps}, seconds per forward (vs normal); load average at start {load0[0]:.2f}, "
          f"at end {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}\n")
    print("| past | forward | " + " | ".join(variants) + " |")
    print("|---|---|" + "---:|" * len(variants))
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
