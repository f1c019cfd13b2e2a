"""pip, as a user runs it (#64): the three packages built as wheels, installed with pip into a fresh venv
from the package index (this clone's wheels standing in for the released ones), and README.md's own
install line and quick-start snippets run there, outside this checkout: `Engine`, a `create_agent` agent
on `ChatOoOSpec`, a `FunctionAgent` on `OoOSpec`. The snippets are read from README.md, so the README
cannot drift from what works.

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


def install_line(readme: str) -> list[str]:
    """The arguments of README's `pip install` of our three packages (under "Quick start")."""
    for block in fenced(section(readme, "## Quick start"), "bash"):
        for line in block.splitlines():
            cmd = line.split("#", 1)[0].split()
            if cmd[:2] == ["pip", "install"] and any(a.strip("\"'").startswith("oospec-agents") for a in cmd):
                return [a.strip("\"'") for a in cmd[2:]]
    raise AssertionError("README's Quick start section has no `pip install ... oospec-agents...` line")


def as_local_wheels(args: list[str], wheels: dict[str, Path]) -> list[str]:
    """Each of our requirements (`name[extras]`) pointed at this clone's wheel, as pip reads PEP 508."""
    out = []
    for arg in args:
        name = re.match(r"[A-Za-z0-9_.-]+", arg).group(0)
        out.append(f"{arg} @ {wheels[name].as_uri()}" if name in wheels else arg)
    assert set(wheels) <= {re.match(r"[A-Za-z0-9_.-]+", a).group(0) for a in args}, args
    return out


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


def test_readme_quick_start_runs_from_the_built_wheels_in_a_fresh_venv(tmp_path):
    readme = README.read_text(encoding="utf-8")
    env, t0 = clean_env(), time.monotonic()
    dist = tmp_path / "dist"
    for name, where in PACKAGES.items():  # pip's isolated build: hatchling from the index (cached after the first)
        run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), str(where)],
            env=env, cwd=tmp_path, timeout=600)
    wheels = {name: next(dist.glob(name.replace("-", "_") + "-*.whl")) for name in PACKAGES}
    built = time.monotonic()

    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", str(venv)], env=env, cwd=tmp_path, timeout=300)
    py = venv / "bin" / "python"
    run([str(py), "-m", "pip", "install", "-q", "torch==2.13.0"], env=env, cwd=tmp_path, timeout=900)
    run([str(py), "-m", "pip", "install", "-q", *as_local_wheels(install_line(readme), wheels)],
        env=env, cwd=tmp_path, timeout=1200)
    installed = time.monotonic()
    frozen = run([str(py), "-m", "pip", "freeze"], env=env, cwd=tmp_path, timeout=120)
    assert not re.search(r"^(llama[-_]cpp[-_]python|llm)==", frozen, flags=re.M | re.I), frozen

    snippets = {h: fenced(section(readme, h), "python")[0] for h in QUICK_START}
    script = tmp_path / "quick_start.py"
    script.write_text("\n".join(
        f"ns = {{}}\nexec(compile({code + CHECKS[h] + chr(10)!r}, {h!r}, 'exec'), ns)\nprint('ran', {h!r})"
        for h, code in snippets.items()))
    out = run([str(py), str(script)], env=env, cwd=tmp_path, timeout=1200)
    assert out.count("\nran ") + out.startswith("ran ") == len(QUICK_START), out
    ran = time.monotonic()
    print(textwrap.dedent(f"""
        wheels built {built - t0:.0f} s, venv + pip install {installed - built:.0f} s, snippets {ran - installed:.0f} s"""))
