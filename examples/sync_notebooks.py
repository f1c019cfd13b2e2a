"""Build each example notebook from its plain-script twin: `python examples/sync_notebooks.py`.

A script is split into cells at `# %%` lines (`# %% [markdown]` cells are comment blocks). The only
rewrite is `x = asyncio.run(f(...))` -> `x = await f(...)`, since a notebook already runs an event loop.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

import nbformat

HERE = Path(__file__).parent
TWINS = ["langchain_agent", "llamaindex_agent", "benchmark", "speculative_tools_langchain", "speculative_tools_llamaindex",
         "hf_model", "mcp_agent"]
_ASYNCIO_RUN = re.compile(r"^(\s*(?:[\w, ]+ = )?)asyncio\.run\((.*)\)\s*$")


def cells(script: str) -> list[tuple[str, str]]:
    """[(cell_type, source)] of a `# %%` script."""
    out: list[tuple[str, list[str]]] = []
    for line in script.splitlines():
        if line.startswith("# %%"):
            out.append(("markdown" if "[markdown]" in line else "code", []))
        elif out:
            out[-1][1].append(line)
    result = []
    for kind, lines in out:
        if kind == "markdown":
            lines = [re.sub(r"^# ?", "", ln) for ln in lines]
        else:
            lines = [_ASYNCIO_RUN.sub(r"\1await \2", ln) for ln in lines]
        result.append((kind, "\n".join(lines).strip("\n")))
    return result


def notebook(script: str) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_markdown_cell(src) if kind == "markdown" else nbformat.v4.new_code_cell(src)
                for kind, src in cells(script)]
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"cell-{i}"  # stable ids keep regenerated notebooks diff-free
    return nb


def main() -> int:
    for name in TWINS:
        nb = notebook((HERE / f"{name}.py").read_text())
        nbformat.validate(nb)
        nbformat.write(nb, HERE / f"{name}.ipynb")
        print(f"wrote examples/{name}.ipynb")
    return 0


if __name__ == "__main__":
    sys.exit(main())
