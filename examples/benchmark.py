# %% [markdown]
# # A small benchmark
#
# `oospec bench` as a library: every method on the same records, interleaved, each checked token by
# token against plain autoregressive decoding (`ar`). The full run is the command line
# `oospec bench --data ../shared/data/toolcalls/dev.jsonl --limit 60 --out bench-out` (see docs/bench.md).

# %%
import os
from pathlib import Path

from IPython.display import Image

from oospec_agents import Engine
from oospec_agents.bench import BenchConfig, run_bench
from oospec_agents.bench.records import load_records, spread
from oospec_agents.bench.report import write_all

LIMIT = int(os.environ.get("BENCH_LIMIT", "5"))
MAX_NEW_TOKENS = int(os.environ.get("BENCH_MAX_NEW_TOKENS", "64"))
METHODS = ("ar", "prompt_lookup", "toolspec", "oospec", "oracle")
# The shared dev records: $OOSPEC_DATA, else ../shared/data/toolcalls/dev.jsonl next to the checkout.
DATA = Path(os.environ.get("OOSPEC_DATA") or next(
    p / "shared/data/toolcalls/dev.jsonl" for p in [Path.cwd(), *Path.cwd().resolve().parents]
    if (p / "shared/data/toolcalls/dev.jsonl").exists()))

# %%
engine = Engine.from_pretrained("embedded")
records = spread(load_records(DATA), LIMIT)  # round-robin over the sources
results = run_bench(engine, records, BenchConfig(METHODS, max_new_tokens=MAX_NEW_TOKENS), data=str(DATA))
paths = write_all(results, os.environ.get("BENCH_OUT", "bench-out"))

# %%
print(paths["report"].read_text())

# %%
Image(filename=str(paths["plot"]))
