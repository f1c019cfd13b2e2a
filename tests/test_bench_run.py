"""`oospec bench` end to end on the embedded default, and its flags reaching the engine and the run."""
from __future__ import annotations

import json

import pytest

from oospec_agents.bench.metrics import summarize
from oospec_agents.bench.records import spread
from oospec_agents.bench.report import markdown
from oospec_agents.cli import main

from oospec_testing import DATA
from bench_testing import ALL_METHODS, DESIGN_KEYS, describe_run, run_row


def test_the_thinking_flag_benches_the_embedded_thinking_target(monkeypatch, capsys):
    from oospec_agents.engine import Engine
    seen = {}

    def load(target, sidecar, **kw):
        seen["target"] = target
        raise SystemExit(7)
    monkeypatch.setattr(Engine, "from_pretrained", load)
    with pytest.raises(SystemExit):
        main(["bench", "--data", str(DATA / "dev.jsonl"), "--limit", "1", "--thinking"])
    assert seen["target"] == "embedded-thinking"
    assert main(["bench", "--data", str(DATA / "dev.jsonl"), "--thinking", "--target", "Qwen/Qwen3-8B"]) != 0
    assert "--thinking benches the embedded thinking target" in capsys.readouterr().err


# ------------------------------------------------------------------ end to end on the embedded default

@pytest.mark.slow
def test_small_bench_run_writes_valid_outputs_and_is_lossless(tmp_path, capsys):
    out = tmp_path / "bench"
    # --no-warmup keeps the CPU suite short; the warm-up is one more pass over the first record.
    rc = main(["bench", "--data", str(DATA / "dev.jsonl"), "--limit", "2", "--max-new-tokens", "12", "--no-warmup",
               "--methods", ",".join(ALL_METHODS), "--out", str(out), "--quiet"])
    assert rc == 0

    results = json.loads((out / "results.json").read_text())
    assert list(results["methods"]) == ALL_METHODS
    for name, figs in results["methods"].items():
        assert DESIGN_KEYS <= set(figs), name
        assert figs["n"] == 2
        assert figs["lossless"], (name, [r["runs"][name]["check"] for r in results["records"]])
    assert results["methods"]["ar"]["speedup_decode"] == pytest.approx(1.0)
    assert results["methods"]["ar"]["mean_accepted_tokens"] == pytest.approx(1.0)
    assert results["methods"]["oracle"]["hint_bytes"] > 0
    for m in ("ar", "toolspec", "oospec"):  # the engine's methods split decode into forwards and host work
        assert 0 < results["methods"][m]["host_share"] < 1, m
        assert all(len(r["runs"][m]["rounds"]) == r["runs"][m]["target_forwards"] - 1 for r in results["records"])
    assert len(results["sources"]) == 2  # --limit 2 takes one record from each of two sources
    for key in ("target_device_name", "dtype", "torch", "transformers", "torch_threads"):
        assert results["env"][key], key
    # the default is the embedded sidecar, in a thread here: oospec is not silently toolspec
    assert results["env"]["sidecar"].startswith("embedded:SmolLM2-135M-Instruct"), results["env"]["sidecar"]
    assert results["env"]["sidecar_runtime"] == "WaveSidecar"
    report = (out / "report.md").read_text()
    assert all(f"| {m} |" in report for m in ALL_METHODS)
    assert (out / "speedup.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("given, loaded", [([], None), (["--sidecar", "none"], False), (["--sidecar", "None"], False),
                                           (["--sidecar", "my/sidecar"], "my/sidecar")])
def test_the_sidecar_flag_reaches_the_engine(monkeypatch, given, loaded):
    """No --sidecar is the engine's default (None: the embedded sidecar); only the word 'none' loads none."""
    from oospec_agents.engine import Engine
    seen = {}

    def load(target, sidecar, **kw):
        seen.update(sidecar=sidecar, **kw)
        raise SystemExit(7)
    monkeypatch.setattr(Engine, "from_pretrained", load)
    with pytest.raises(SystemExit):
        main(["bench", "--data", str(DATA / "dev.jsonl"), "--limit", "1", "--sidecar-placement", "process", *given])
    assert seen["sidecar"] == loaded and seen["sidecar_placement"] == "process"


def test_sources_sidecar_adapter_and_tree_budget_reach_the_run(monkeypatch, capsys):
    """#20: `--sources` benches only those sources' records (a source with none is an error naming it),
    `--sidecar-adapter` and `--sidecar-prior-weight` reach the engine's sidecar loader, and
    `--max-draft-nodes` the engine (0 is refused by name)."""
    from oospec_agents.bench import runner
    from oospec_agents.engine import Engine
    seen = {}

    def load(target, sidecar, **kw):
        seen.update(kw)
        return object()

    def bench(engine, records, config, **kw):
        seen.update(records=records, data=kw["data"])
        raise SystemExit(7)
    monkeypatch.setattr(Engine, "from_pretrained", load)
    monkeypatch.setattr(runner, "run_bench", bench)
    with pytest.raises(SystemExit):
        main(["bench", "--data", str(DATA / "dev.jsonl"), "--sources", "apibank_l1,bfcl_simple", "--limit", "4",
              "--methods", "ar,toolspec", "--sidecar-adapter", "some/adapter", "--sidecar-prior-weight", "0",
              "--max-draft-nodes", "12"])
    assert [r["source"] for r in seen["records"]] == ["bfcl_simple", "apibank_l1"] * 2
    assert seen["max_draft_nodes"] == 12
    assert seen["sidecar_adapter"] == "some/adapter" and seen["data"].endswith("(sources apibank_l1,bfcl_simple)")
    assert seen["sidecar_prior_weight"] == 0.0
    with pytest.raises(SystemExit):  # argparse: exit status 2, the flag and the value named
        main(["bench", "--data", str(DATA / "dev.jsonl"), "--max-draft-nodes", "0"])
    assert "--max-draft-nodes: expected an integer >= 1, got '0'" in capsys.readouterr().err
    assert main(["bench", "--data", str(DATA / "dev.jsonl"), "--sources", "tooltalk", "--methods", "ar"]) != 0
    err = capsys.readouterr().err  # the one check of oospec_agents/data.py, shared with training and evaluate
    assert "no record of source(s) ['tooltalk']" in err and "dev.jsonl" in err and "'bfcl_simple'" in err


def test_hint_first_wraps_the_sidecar_and_the_report_says_so(monkeypatch):
    """`--hint-first`: the engine's sidecar is wrapped (the target waits for the wave: every hint in
    time), results.json's config records it, and the report says the wall clock is no speed figure."""
    from oospec_agents.bench import runner
    from oospec_agents.engine import Engine
    from oospec_agents.sidecar import FixedHint
    from oospec_agents.sidecar.protocol import HintFirst
    seen = {}

    class _Engine:  # the engine's parts are chosen at construction: the CLI asks for a copy with its sidecar
        def __init__(self, sidecar=FixedHint("x")):
            self.sidecar = sidecar

        def with_parts(self, *, sidecar):
            return _Engine(sidecar)

    def bench(engine, records, config, **kw):
        seen["sidecar"] = engine.sidecar
        raise SystemExit(7)
    monkeypatch.setattr(Engine, "from_pretrained", lambda *a, **kw: _Engine())
    monkeypatch.setattr(runner, "run_bench", bench)
    with pytest.raises(SystemExit):
        main(["bench", "--data", str(DATA / "dev.jsonl"), "--limit", "1", "--methods", "toolspec", "--hint-first"])
    assert isinstance(seen["sidecar"], HintFirst) and seen["sidecar"].inner.text == "x"
    records = [{"source": "a", "runs": {"ar": run_row(10, 2.0, 10), "oospec": run_row(10, 0.5, 3)}}]
    results = summarize(records, ["ar", "oospec"])
    describe_run(results)
    assert "--hint-first" not in markdown(results)
    results["config"]["hint_first"] = True
    assert "**--hint-first**: the target waited for the sidecar's wave" in markdown(results)


@pytest.mark.slow
def test_a_sampling_bench_draws_one_seed_per_record_for_every_method(tmp_path):
    """`--temperature`: ar, toolspec and oospec sample with the record's seed; in float32 the verify
    forward's logits are ar's, so every method draws ar's very tokens (`lossless`), with fewer forwards."""
    import torch
    from oospec_agents import Engine
    from oospec_agents.bench import BenchConfig, run_bench
    from oospec_agents.bench.records import load_records
    from oospec_agents.bench.report import write_all
    records = spread(load_records(DATA / "dev.jsonl"), 2)
    engine = Engine.from_pretrained("embedded", sidecar=False, dtype=torch.float32)
    config = BenchConfig(("ar", "toolspec"), max_new_tokens=24, warmup=False, progress=False, temperature=0.7, seed=5)
    results = run_bench(engine, records, config, data=str(DATA / "dev.jsonl"))
    write_all(results, tmp_path)
    assert results["config"]["temperature"] == 0.7 and results["config"]["seed"] == 5
    figs = results["methods"]
    assert figs["toolspec"]["lossless"], [r["runs"]["toolspec"]["check"] for r in results["records"]]
    assert figs["toolspec"]["target_forwards"] < figs["ar"]["target_forwards"]
    assert "`--temperature 0.7`" in (tmp_path / "report.md").read_text()
    with pytest.raises(ValueError, match="engine's methods only"):
        run_bench(engine, records, BenchConfig(("ar", "prompt_lookup"), temperature=0.7, progress=False))
