"""Should a new reply's prefill join a batched round, or run as its own forward? (#58 item 1, docs/engine.md
"Many replies at once"). Times the two schedules' forwards on the embedded target as the engine loads it:

    .venv/bin/python examples/experiments/prefill_join.py --prompt 400,1500 --rows 8 --nodes 10 --past 450 --reps 7

- apart: the prompt's prefill (its own forward), then a round: `rows` draft chains of `nodes` tokens, each
  after `past` cached tokens (the replies decoding meanwhile);
- joined: one forward that carries both, the prefill's tokens beside the round's (what a round costs with
  the prefill in it).

A round's rows are modelled as one sequence of rows x nodes tokens after `past` cached ones, and the
joined forward as the prompt and those tokens in one sequence: the linear layers (most of a forward's work
on a CPU) see the same rows as the engine's packed round; attention is the small part. The minimum over
`reps` interleaved repetitions is reported. What joining buys is at most one forward's fixed cost per new
reply; what it costs is that every reply in that round waits for the prefill's tokens.
"""
from __future__ import annotations

import argparse
import time

import torch


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompt", default="400,1500", help="prompt lengths to prefill, comma-separated")
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--nodes", type=int, default=10)
    ap.add_argument("--past", type=int, default=450)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--dtype", default=None)
    a = ap.parse_args(argv)
    from oospec_agents import models
    from oospec_agents.verify import Verifier
    cpu = torch.device("cpu")
    dtype = getattr(torch, a.dtype) if a.dtype else models.resolve_dtype(None, cpu)
    model, tok = models.load_model("embedded", device=cpu, dtype=dtype)
    v = Verifier(model)
    gen = torch.Generator().manual_seed(0)
    rand = lambda n: torch.randint(100, 40000, (n,), generator=gen).tolist()  # noqa: E731
    past_ids = rand(a.past)
    round_ids = rand(a.rows * a.nodes)
    base = v.new_cache()
    v.forward(past_ids, base, 0, last_only=True)

    def run_round():
        cache = base
        v.forward(round_ids, cache, a.past)
        cache.crop(-len(round_ids))  # transformers 5: a negative count drops that many tokens
        return v.last_forward_s

    def prefill(ids):
        v.forward(ids, v.new_cache(), 0, last_only=True)
        return v.last_forward_s
    print(f"embedded target, {dtype}, {torch.get_num_threads()} threads; a round: {a.rows} rows x {a.nodes} "
          f"nodes after {a.past} cached tokens; min of {a.reps}\n")
    print("| prompt | prefill alone | round alone | apart (sum) | joined | joining saves | the round waits |")
    print("|---|---|---|---|---|---|---|")
    for p in (int(x) for x in a.prompt.split(",")):
        prompt = rand(p)
        best = {"prefill": 1e9, "round": 1e9, "joined": 1e9}
        for rep in range(a.reps):
            order = ["prefill", "round", "joined"]
            for name in order[rep % 3:] + order[:rep % 3]:
                if name == "prefill":
                    s = prefill(prompt)
                elif name == "round":
                    s = run_round()
                else:
                    s = prefill(prompt + round_ids)
                best[name] = min(best[name], s)
        apart = best["prefill"] + best["round"]
        print(f"| {p} | {best['prefill'] * 1e3:.0f} ms | {best['round'] * 1e3:.0f} ms | {apart * 1e3:.0f} ms | "
              f"{best['joined'] * 1e3:.0f} ms | {(apart - best['joined']) * 1e3:.0f} ms | "
              f"{(best['joined'] - best['round']) * 1e3:.0f} ms |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
