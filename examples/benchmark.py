# %% [markdown]
# # A small benchmark
#
# `oospec bench` as a library: every method on the same records, interleaved, each checked token by
# token against plain autoregressive decoding (`ar`). The records are yours (`OOSPEC_DATA`, a JSONL file in
# the record format of docs/own-model.md#records) or else BFCL's own questions, from the `bfcl-eval`
# package's data (fetched once through pip without its dependencies). The command line does the same:
# `oospec bench --bfcl --sources bfcl_simple,bfcl_multiple --limit 60 --out bench-out` (see docs/bench.md).

# %%
import os

from IPython.display import Image

from oospec_agents import Engine
from oospec_agents.bench import BenchConfig, run_bench
from oospec_agents.bench.bfcl import bfcl_data, read_bfcl
from oospec_agents.bench.records import load_records, spread
from oospec_agents.bench.report import write_all
from oospec_agents.data import only_sources

LIMIT = int(os.environ.get("BENCH_LIMIT", "5"))
MAX_NEW_TOKENS = int(os.environ.get("BENCH_MAX_NEW_TOKENS", "64"))
METHODS = ("ar", "prompt_lookup", "toolspec", "oospec", "oracle")
# Your records ($OOSPEC_DATA), else BFCL's single-call questions (simple and multiple, BFCL v4).
DATA = os.environ.get("OOSPEC_DATA") or str(bfcl_data())

# %%
engine = Engine.from_pretrained("embedded")
records = load_records(DATA) if os.environ.get("OOSPEC_DATA") else \
    only_sources(read_bfcl(DATA), "bfcl_simple,bfcl_multiple", DATA)
records = spread(records, LIMIT)  # round-robin over the sources
results = run_bench(engine, records, BenchConfig(METHODS, max_new_tokens=MAX_NEW_TOKENS), data=str(DATA))
paths = write_all(results, os.environ.get("BENCH_OUT", "bench-out"))

# %%
print(paths["report"].read_text())

# %%
Image(filename=str(paths["plot"]))
