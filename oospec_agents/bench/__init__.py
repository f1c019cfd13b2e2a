"""`oospec bench`: every decoding method on the same records, interleaved, checked against AR.

    records.py   read the shared JSONL, spread a limit over sources
    bfcl.py      BFCL's own files -> the shared record format
    methods.py   one function per method; each returns a `Run` with its timings
    metrics.py   token-level lossless check (numerical ties apart) and aggregation
    runner.py    warm-up, the interleaved loop, the progress bar
    report.py    results.json, report.md, speedup.png
    cli.py       the argparse front end
"""
from .metrics import summarize
from .runner import BenchConfig, run_bench

__all__ = ["BenchConfig", "run_bench", "summarize"]
