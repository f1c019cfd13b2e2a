"""TEST HELPER: the `oospec bench` tests' figures every method reports, the methods, a run's row and a
results file's description."""
from __future__ import annotations

DESIGN_KEYS = {"n", "lossless", "speedup_decode", "speedup_e2e", "mean_accepted_tokens", "target_forwards",
               "numerical_ties"}
ALL_METHODS = ["ar", "hf_generate", "prompt_lookup", "assisted", "toolspec", "oospec", "oracle"]


def run_row(tokens, decode, forwards, verdict="exact"):
    return {"new_tokens": tokens, "prefill_s": 0.5, "decode_s": decode, "target_forwards": forwards,
            "check": {"verdict": verdict}}


def describe_run(results):
    results["env"] = {"target": "t", "target_device_name": "cpu", "dtype": "bfloat16", "torch": "2",
                      "transformers": "5", "torch_threads": 2, "git_commit": None}
    results["config"] = {"n_records": 1, "data": "x.jsonl", "tool_choice": "required", "max_new_tokens": 8,
                         "tie_tolerance": 0.3, "wall_s": 1.0}
