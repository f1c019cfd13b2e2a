"""The call log (oospec_agents/calllog.py): records in the shared format, 0600, tool results left out
unless asked, bounded with the oldest dropped, safe across threads and processes, and a write that
fails never reaches the reply."""
from __future__ import annotations

import json
import multiprocessing
import os
import stat
import threading

import pytest

from oospec_agents.calllog import CallLog

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather.",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
MESSAGES = [{"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c0", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Rome\"}"}}]},
            {"role": "tool", "tool_call_id": "c0", "content": "secret: 21 C in Rome"},
            {"role": "user", "content": "And Paris?"}]
CALLS = [{"id": "call_0", "name": "get_weather", "arguments": {"city": "Paris"}}]


def lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_record_in_the_shared_format_in_a_0600_file_without_tool_results(tmp_path):
    path = tmp_path / "calls.jsonl"
    log = CallLog(path)
    log.record(MESSAGES, TOOLS, CALLS, model="tiny", method="oospec", hint='{"name": "get_weather"}', hint_tokens=7)
    assert log.flush()
    [rec] = lines(path)
    assert rec["source"] == "call_log" and rec["id"].startswith("log_") and rec["tools"] == TOOLS
    assert rec["expected"] == [{"name": "get_weather", "arguments": {"city": "Paris"}}]
    assert rec["messages"][2] == {"role": "tool", "tool_call_id": "c0", "content": None}  # the result is left out
    assert rec["messages"][:2] == MESSAGES[:2] and rec["messages"][3] == MESSAGES[3]
    assert "secret" not in path.read_text()
    meta = rec["meta"]
    assert (meta["model"], meta["method"], meta["hint_tokens"], meta["tool_results"]) == ("tiny", "oospec", 7, "omitted")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    log.close()
    kept = CallLog(tmp_path / "kept.jsonl", tool_results=True)
    kept.record(MESSAGES, TOOLS, CALLS)
    kept.close()
    [rec] = lines(tmp_path / "kept.jsonl")
    assert rec["messages"] == MESSAGES and rec["meta"]["tool_results"] == "kept"


def test_the_log_keeps_to_its_bound_dropping_the_oldest(tmp_path):
    path = tmp_path / "calls.jsonl"
    log = CallLog(path, max_mb=4096 / 2**20)  # 4 KiB: about a dozen records
    for i in range(60):
        log.record([{"role": "user", "content": f"request {i}"}], TOOLS, CALLS)
    log.close()
    recs = lines(path)
    assert os.path.getsize(path) <= 4096 and 0 < len(recs) < 60
    assert [r["messages"][0]["content"] for r in recs] == [f"request {i}" for i in range(60 - len(recs), 60)]
    assert log.written == 60 and log.dropped == 60 - len(recs) and log.errors == 0


def _write_from_a_process(path: str, n: int) -> None:
    log = CallLog(path)
    for i in range(n):
        log.record([{"role": "user", "content": f"process {i}"}], TOOLS, CALLS)
    log.close()


def test_threads_engines_and_processes_share_one_log(tmp_path):
    path = tmp_path / "calls.jsonl"
    logs = [CallLog(path), CallLog(path)]  # two engines of one process
    proc = multiprocessing.get_context("spawn").Process(target=_write_from_a_process, args=(str(path), 40))
    proc.start()

    def write(k: int) -> None:
        for i in range(40):
            logs[k % 2].record([{"role": "user", "content": f"thread {k} {i}"}], TOOLS, CALLS)

    threads = [threading.Thread(target=write, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for log in logs:
        log.close()
    proc.join(60)
    assert proc.exitcode == 0
    contents = [r["messages"][0]["content"] for r in lines(path)]  # every line whole JSON
    assert len(contents) == len(set(contents)) == 4 * 40 + 40


def test_a_record_that_cannot_be_written_is_a_warning_and_a_count(tmp_path, monkeypatch, caplog):
    log = CallLog(tmp_path / "calls.jsonl")
    real_write = os.write

    def full_disk(fd, data):
        if fd == log._fd:
            raise OSError(28, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", full_disk)
    with caplog.at_level("WARNING", logger="oospec_agents.calllog"):
        log.record(MESSAGES, TOOLS, CALLS)  # returns at once: the writer thread meets the error
        assert log.flush()
    assert log.errors == 1 and log.written == 0 and "No space left on device" in caplog.text
    monkeypatch.undo()
    log.record(MESSAGES, TOOLS, CALLS)
    log.close()
    assert log.written == 1


@pytest.mark.parametrize("kw, says", [({"max_mb": 0}, "call_log_max_mb must be a number > 0"),
                                      ({"max_mb": True}, "call_log_max_mb must be a number > 0")])
def test_bad_settings_are_clear_errors(tmp_path, kw, says):
    with pytest.raises(ValueError, match=says):
        CallLog(tmp_path / "calls.jsonl", **kw)
    with pytest.raises(ValueError, match="is a directory"):
        CallLog(tmp_path)
    with pytest.raises(ValueError, match="its directory does not exist"):
        CallLog(tmp_path / "missing" / "calls.jsonl")


def test_the_engine_logs_the_replies_whose_calls_all_fit_and_nothing_else(tmp_path, smollm2_tokenizer):
    from oospec_agents import Engine
    from oospec_agents.testing import BOOK_TABLE, CALL_REPLIES, _book
    from oospec_testing import ScriptedTarget, tiny_model
    ask = [{"role": "user", "content": "Book a table for 4 people at Da Michele at 19:30."}]
    path = tmp_path / "calls.jsonl"
    engine = Engine(tiny_model("llama", smollm2_tokenizer), smollm2_tokenizer, model_name="tiny-scripted",
                    call_log=path)
    target = ScriptedTarget(engine.target, smollm2_tokenizer)
    prompt = engine.prompt_ids(ask, [BOOK_TABLE])
    fits = _book('{"restaurant": "Da Michele", "people": 4, "time": "19:30"}')
    for reply in [fits, *CALL_REPLIES.values(), "No table is free."]:  # one fits; misfits, unparseable, text: not
        target.script(prompt, reply)
        gen = engine.generate(ask, [BOOK_TABLE], max_new_tokens=120, method="toolspec")
        assert gen.text == reply
    engine.close()  # flushes the log
    [rec] = lines(path)
    assert rec["expected"] == [{"name": "book_table", "arguments": {"restaurant": "Da Michele", "people": 4,
                                                                    "time": "19:30"}}]
    assert rec["messages"] == ask and rec["tools"] == [BOOK_TABLE]
    assert (rec["meta"]["model"], rec["meta"]["method"], rec["meta"]["hint"]) == ("tiny-scripted", "toolspec", None)
    assert Engine(engine.target, smollm2_tokenizer).call_log is None  # off by default


def test_every_front_end_passes_the_call_log_on(tmp_path, monkeypatch):
    """ChatOoOSpec, OoOSpec and `oospec serve --call-log` load `Engine(call_log=...)` (and
    `deterministic`), loading nothing until first use."""
    import sys
    import types

    from langchain_oospec import ChatOoOSpec
    from llama_index.llms.oospec import OoOSpec

    from oospec_agents import Engine
    from oospec_agents.cli import main
    from oospec_agents.serve import app
    path = tmp_path / "calls.jsonl"
    for options in (ChatOoOSpec(call_log=path, deterministic=True)._engines.options,
                    OoOSpec(call_log=path, deterministic=True)._engine.options):
        assert (options["call_log"], options["deterministic"]) == (str(path), True)
    assert ChatOoOSpec()._engines.options["call_log"] is None and OoOSpec()._engine.options["call_log"] is None
    seen = []

    def load(target="embedded", sidecar=None, **kw):
        seen.append({k: v for k, v in kw.items() if k.startswith("call_log")})
        raise SystemExit(7)
    monkeypatch.setattr(Engine, "from_pretrained", load)
    monkeypatch.setattr(app, "create_app", lambda loader, **kw: loader())
    monkeypatch.setitem(sys.modules, "uvicorn", types.SimpleNamespace(run=lambda *a, **k: None))
    for flags in ([], ["--call-log", str(path)], ["--call-log", str(path), "--call-log-max-mb", "8",
                                                  "--call-log-tool-results"]):
        with pytest.raises(SystemExit):
            main(["serve", *flags])
    assert seen == [{}, {"call_log": str(path)},
                    {"call_log": str(path), "call_log_max_mb": 8.0, "call_log_tool_results": True}]

def test_call_log_options_without_a_log_are_an_error(capsys):
    from oospec_agents.cli import main
    assert main(["serve", "--call-log-max-mb", "8"]) == 2  # before anything loads
    assert "--call-log-max-mb and --call-log-tool-results need --call-log PATH" in capsys.readouterr().err
