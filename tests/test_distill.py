"""`oospec distill`: the target's own calls label the sidecar's rows; resumable labels and training;
α before and after on a held-out part. End to end, small, on the embedded pair and on a target saved to
a local directory."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from oospec_agents.cli import main
from oospec_agents.train import distill as D

from oospec_testing import DATA

TRAIN = str(DATA / "train.jsonl")
SMALL = ["--limit", "4", "--held-out", "0.5", "--batch-size", "2", "--max-new-tokens", "128", "--steps", "2",
         "--train-batch-size", "1", "--checkpoint-every", "1", "--no-progress"]


def test_dev_jsonl_is_refused_and_a_bad_share_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="never trains on .*dev.jsonl"):
        D.check_data([str(DATA / "dev.jsonl")])
    with pytest.raises(ValueError, match="--held-out"):
        D.distill(TRAIN, tmp_path, D.DistillOptions(held_out=1.0))


def test_the_split_holds_out_the_same_records_on_a_rerun(tmp_path):
    recs = [{"id": str(i)} for i in range(10)]
    train, held = D.split(recs, 0.3, 0, tmp_path, resume=True)
    assert len(held) == 3 and len(train) == 7 and not {r["id"] for r in train} & {r["id"] for r in held}
    again = D.split(recs, 0.5, 1, tmp_path, resume=True)  # the kept split wins over new settings
    assert again[1] == held
    assert len(D.split(recs, 0.5, 1, tmp_path, resume=False)[1]) == 5


def _gen(calls=(), invalid=()):
    return SimpleNamespace(tool_calls=list(calls), invalid_tool_calls=list(invalid), tool_call_problems=[],
                           token_ids=[1, 2], stats=SimpleNamespace(target_forwards=2))


def test_labels_are_appended_and_a_rerun_decodes_only_the_rest(tmp_path):
    recs = [{"id": f"r{i}", "source": "s", "messages": [{"role": "user", "content": str(i)}], "tools": []}
            for i in range(5)]
    done = [{"id": "r0", "kind": "call", "calls": [{"name": "f", "arguments": {}}]},
            {"id": "r1", "kind": "no_call", "calls": []}]
    (tmp_path / D.LABELS).write_text("".join(json.dumps(x) + "\n" for x in done) + '{"id": "r2", "ki')  # torn
    asked = []

    class Engine:
        def generate(self, messages, tools, **kw):
            asked.append(messages[0]["content"])
            assert kw["tool_choice"] == "required" and kw["method"] == "toolspec"
            n = int(messages[0]["content"])
            if n == 3:
                return _gen(invalid=[{"name": "f", "arguments": "{", "error": "bad"}])
            return _gen([{"id": "c", "name": "f", "arguments": {"x": n}}])
    labels, figs = D.label(recs, D.DistillOptions(batch_size=2, progress=False), tmp_path, Engine())
    assert sorted(asked) == ["2", "3", "4"] and figs["reused"] == 2 and figs["labelled_now"] == 3
    assert [labels[f"r{i}"]["kind"] for i in range(5)] == ["call", "no_call", "call", "invalid", "call"]
    assert labels["r4"]["calls"] == [{"name": "f", "arguments": {"x": 4}}]
    assert D.read_labels(tmp_path) == labels  # the file holds them all, the torn line dropped
    traces, kinds = D.labelled(recs, labels, "required")
    assert [t["id"] for t in traces] == ["r0", "r2", "r4"] and kinds == {"call": 3, "invalid": 1, "no_call": 1}
    auto, _ = D.labelled(recs, labels, "auto")  # under auto, the target's "no call" is a decline to learn
    assert [t["id"] for t in auto] == ["r0", "r1", "r2", "r4"] and auto[1]["meta"]["no_call"]


def _check_run(out, *, done: bool):
    m = json.loads((out / "metrics.json").read_text())
    assert m["labels"]["records"] == 4 and m["held_out_records"] == 2
    assert m["alpha_before"]["n"] == m["held_out_scored"] and 0 <= m["alpha_before"]["alpha_slots"] <= 1
    assert m["train"]["done"] is done and ("alpha_after" in m) is done
    return m


def test_distill_the_embedded_pair_interrupted_then_resumed(tmp_path, monkeypatch):
    out = tmp_path / "d"
    assert main(["distill", "--target", "embedded", "--data", TRAIN, "--out", str(out), *SMALL,
                 "--stop-after", "1"]) == 0
    first = _check_run(out, done=False)
    assert first["labels"]["labelled_now"] == 4 and first["train"]["steps"] == 1
    lines = (out / "labels.jsonl").read_text()
    assert len(lines.splitlines()) == 4

    def no_target(*a, **kw):
        raise AssertionError("the labels were decoded again")
    monkeypatch.setattr(D, "target_engine", no_target)
    assert main(["distill", "--target", "embedded", "--data", TRAIN, "--out", str(out), *SMALL]) == 0
    second = _check_run(out, done=True)
    assert second["labels"]["labelled_now"] == 0 and (out / "labels.jsonl").read_text() == lines
    assert second["train"]["resumed_from"] == 1 and second["train"]["steps"] == 2
    assert second["alpha_before"] == first["alpha_before"]  # kept, not scored again
    assert 0 <= second["alpha_after"]["alpha_call"] <= 1 and second["alpha_after"]["adapter"] == str(out)
    # DIR is an adapter the engine loads as its sidecar's
    from oospec_agents import models
    assert models.read_adapter(out)["r"] == 16 and (out / "rows.json").exists()


def test_distill_a_target_in_a_local_directory(tmp_path, embedded_fp32):
    target = tmp_path / "target"
    embedded_fp32.target.save_pretrained(target)
    embedded_fp32.tokenizer.save_pretrained(target)
    out = tmp_path / "d"
    assert main(["distill", "--target", str(target), "--data", TRAIN, "--out", str(out), "--limit", "4",
                 "--held-out", "0.5", "--max-new-tokens", "128", "--steps", "1", "--train-batch-size", "2",
                 "--no-progress"]) == 0
    m = _check_run(out, done=True)
    assert m["target"] == str(target) and m["labels"]["kinds_train"]["call"] >= 1
    assert m["train"]["examples"]["total"] >= 1
