"""The docs as a guide (#57): every relative link (and its #anchor) in README.md, docs/ and the
integrations' READMEs resolves, every `docs/...` path that code, examples and tests name exists, every
run report under docs/reports/ is listed once in docs/reports/README.md, and README stays a front door."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
REPORTS = DOCS / "reports"

#: a Markdown link or image: [text](target) or ![alt](target), the target up to a space, `#` or `)`
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s#>]*)")
#: a `docs/...` path as code names it (not `shared/docs/...`, which is outside the repository)
DOCS_PATH = re.compile(r"(?<![\w/.])docs/[\w./-]+")


def markdown_files() -> list[Path]:
    """README.md, every page of docs/, and the front-end packages' READMEs (they link into docs/)."""
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md")), *sorted(ROOT.glob("integrations/*/README.md"))]


def code_files() -> list[Path]:
    files = []
    for folder in ("oospec_agents", "integrations", "examples", "tests"):
        files += [p for p in (ROOT / folder).rglob("*") if p.is_file() and ".venv" not in p.parts
                  and p.suffix in {".py", ".ipynb", ".sh", ".md", ".toml", ".jinja", ".json", ".txt"}]
    return files


def _without_code_blocks(text: str) -> str:
    """Links are not links inside fenced code."""
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def relative_links(path: Path) -> list[str]:
    targets = LINK.findall(_without_code_blocks(path.read_text(encoding="utf-8")))
    return [t for t in targets if t and not re.match(r"^[a-zA-Z][\w+.-]*:", t) and not t.startswith("/")]


def test_every_relative_link_in_readme_and_docs_resolves():
    broken = [f"{path.relative_to(ROOT)}: {target}" for path in markdown_files() for target in relative_links(path)
              if not (path.parent / target).exists()]
    assert not broken, "links to nothing:\n" + "\n".join(broken)


#: a link's target and its `#fragment`, for the anchor check
LINK_WITH_ANCHOR = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s#>]*)#([^)\s>]+)")


def anchors(path: Path) -> set[str]:
    """GitHub's ids of a page's headings: lower case, punctuation but `-` and `_` dropped, spaces as
    `-`, a repeated one suffixed `-1`, `-2`, ..."""
    seen: dict[str, int] = {}
    ids = set()
    for line in _without_code_blocks(path.read_text(encoding="utf-8")).splitlines():
        heading = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not heading:
            continue
        base = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
        n = seen.get(base, 0)
        seen[base] = n + 1
        ids.add(base if n == 0 else f"{base}-{n}")
    return ids


def test_every_anchor_of_a_link_to_a_page_names_one_of_its_headings():
    broken = []
    for path in markdown_files():
        for target, fragment in LINK_WITH_ANCHOR.findall(_without_code_blocks(path.read_text(encoding="utf-8"))):
            page = path if not target else path.parent / target
            if re.match(r"^[a-zA-Z][\w+.-]*:", target) or page.suffix != ".md" or not page.exists():
                continue
            if fragment not in anchors(page):
                broken.append(f"{path.relative_to(ROOT)}: {target}#{fragment}")
    assert not broken, "anchors that name no heading:\n" + "\n".join(broken)


def test_every_docs_path_named_in_code_exists():
    missing = set()
    for path in code_files():
        for found in DOCS_PATH.findall(path.read_text(encoding="utf-8", errors="replace")):
            name = found.rstrip(".-/")
            if not (ROOT / name).exists():
                missing.add(f"{path.relative_to(ROOT)}: {name}")
    assert not missing, "docs paths that do not exist:\n" + "\n".join(sorted(missing))


def test_every_report_is_listed_once_in_the_reports_index():
    """Each file under docs/reports/ (a report, its plot, its JSON) is in exactly one row of the index."""
    rows = [line for line in (REPORTS / "README.md").read_text(encoding="utf-8").splitlines()
            if line.startswith("|") and "](" in line]
    linked = [{Path(t).name for t in LINK.findall(row) if t and (REPORTS / t).parent == REPORTS} for row in rows]
    reports = sorted(p.name for p in REPORTS.iterdir() if p.is_file() and p.name != "README.md")
    times = {name: sum(name in names for names in linked) for name in reports}
    assert all(n == 1 for n in times.values()), {name: n for name, n in times.items() if n != 1}


@pytest.mark.parametrize("name", ["bench-embedded-60.md", "bench-strict-60.md", "history.md"])
def test_dated_reports_live_under_reports_not_beside_the_guides(name):
    assert (REPORTS / name).exists() and not (DOCS / name).exists()


def test_docs_holds_guides_only():
    """No plot or JSON beside the guides, and no page that is a run's report: `oospec bench` writes
    `# oospec bench` as its report's heading, and a kept report starts with its command in a comment."""
    stray = [p.name for p in DOCS.iterdir() if p.is_file() and p.suffix != ".md"]
    reports = [p.name for p in DOCS.glob("*.md")
               if re.match(r"(<!-- oospec bench|# oospec bench\s*$)", p.read_text(encoding="utf-8").lstrip(),
                           flags=re.M)]
    assert not stray and not reports, (stray, reports)


def test_readme_is_a_front_door():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 400
    for section in ("## Quick start", "## Use it", "## Benchmark", "## Agents: speculative tools", "## Limits",
                    "## Docs"):
        assert f"\n{section}\n" in text, section
    # one headline plot, beside the decode table; the agent table (#55) and the load table (#58) may have
    # their own; none elsewhere
    plots = {section.split("\n", 1)[0]: len(re.findall(r"!\[[^\]]*\]\([^)]+\.png\)", section))
             for section in text.split("\n## ")[1:]}
    assert plots.pop("Benchmark") == 1 and plots.pop("Agents: speculative tools") <= 1
    assert plots.pop("Many agents at once", 0) <= 1
    assert not any(plots.values()), plots


def test_the_link_checks_catch_a_broken_link(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("[ok](page.md) [gone](nowhere.md#x) ![plot](img.png) [web](https://x.org)\n"
                    "```\n[in code](not-a-link.md)\n```\n")
    assert relative_links(page) == ["page.md", "nowhere.md", "img.png"]
    assert DOCS_PATH.findall("see docs/bench.md. and ../shared/docs/design.md") == ["docs/bench.md."]


def test_anchors_are_githubs_heading_ids(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Title\n## Layouts on a CPU (`--layout shared|split|both`)\n## Title\n```\n## not one\n```\n")
    assert anchors(page) == {"title", "layouts-on-a-cpu---layout-sharedsplitboth", "title-1"}


# --- what the docs show must exist: every `oospec <command> --flag`, every imported Python name (#64) ---

#: a fenced code block: its info string (language) and its body
FENCE = re.compile(r"^```[ \t]*([\w+-]*)[^\n]*\n(.*?)^```", flags=re.S | re.M)
#: an inline code span that is an `oospec` command line in prose
INLINE_COMMAND = re.compile(r"`((?:\.venv/bin/)?oospec [^`]+)`")


def shown_pages() -> list[Path]:
    """The pages a user reads: README, docs/ (not the dated reports, which keep the exact commands
    they ran, flags since renamed included) and the front-end packages' READMEs."""
    return [p for p in markdown_files() if REPORTS not in p.parents]


def cli_flags() -> dict[str, set[str]]:
    """Each `oospec` subcommand's option strings, from the parsers the CLI builds (`oospec_agents.cli`)."""
    import argparse
    import importlib

    from oospec_agents.cli import COMMANDS

    sub = argparse.ArgumentParser(prog="oospec").add_subparsers()
    flags = {}
    for name, module in COMMANDS.items():
        importlib.import_module(module).add_parser(sub, name)  # as `oospec_agents.cli.main` builds them
        usage = sub.choices[name].format_usage()  # every option but --help, which usage shows as -h
        flags[name] = {"--help", *re.findall(r"(?<![\w-])--?[A-Za-z][\w-]*", usage)}
    return flags


def command_lines(text: str) -> list[str]:
    """The `oospec ...` command lines shown in a page: in shell blocks (continuations joined) and in
    inline code spans."""
    lines = []
    for lang, body in FENCE.findall(text):
        if lang not in {"", "bash", "sh", "shell", "console", "text"}:
            continue
        for line in body.replace("\\\n", " ").splitlines():
            lines.append(re.sub(r"^\s*\$\s+", "", line))
    lines += INLINE_COMMAND.findall(_without_code_blocks(text))
    return lines


def oospec_flags(line: str) -> list[tuple[str, str]]:
    """(subcommand, flag) for each flag of each `oospec <subcommand>` in one shell line; a `#` comment,
    `|`, `;`, `&&` or `>` ends a command."""
    from oospec_agents.cli import COMMANDS

    out = []
    words = re.split(r"\s+", re.split(r"(?<!\S)#", line, maxsplit=1)[0].strip())
    command = None
    for i, word in enumerate(words):
        if word in {"|", "||", ";", "&&", "&"} or word.startswith((">", "2>")):
            command = None
        elif word.rsplit("/", 1)[-1] == "oospec" and i + 1 < len(words) and words[i + 1] in COMMANDS:
            command = words[i + 1]
        elif command and re.match(r"^--[a-z][\w-]*", word):
            out.append((command, re.match(r"^--[a-z][\w-]*", word).group(0)))
    return out


def test_every_oospec_flag_the_docs_show_exists():
    flags = cli_flags()
    unknown = sorted({f"{path.relative_to(ROOT)}: oospec {command} {flag}"
                      for path in shown_pages()
                      for line in command_lines(path.read_text(encoding="utf-8"))
                      for command, flag in oospec_flags(line) if flag not in flags[command]})
    assert not unknown, "flags that `oospec` does not take:\n" + "\n".join(unknown)


#: `from X import a, b` (one line or parenthesised) and `import X` in a Python snippet
FROM_IMPORT = re.compile(r"^\s*from\s+([\w.]+)\s+import\s+(\([^)]*\)|[^\n#]+)", flags=re.M)
PLAIN_IMPORT = re.compile(r"^\s*import\s+([\w.]+)(?:\s+as\s+(\w+))?\s*$", flags=re.M)


def python_names(code: str) -> list[tuple[str, str]]:
    """(module, dotted name) for each name a Python snippet imports and each `Name.attr(` it calls on
    an imported name; `("x.y", "")` for `import x.y`."""
    bound: dict[str, tuple[str, str]] = {}
    names = []
    for module, imported in FROM_IMPORT.findall(code):
        for part in imported.strip("()").replace("\n", " ").split(","):
            if part.strip():
                name, _, alias = part.strip().partition(" as ")
                names.append((module, name.strip()))
                bound[(alias or name).strip()] = (module, name.strip())
    for module, alias in PLAIN_IMPORT.findall(code):
        names.append((module, ""))
        bound[alias or module.split(".")[0]] = (module.split(".")[0], "") if not alias else (module, "")
    for name, attr in re.findall(r"(?<![\w.])([A-Za-z_]\w*)\.([A-Za-z_]\w*)\(", code):
        if name in bound:
            module, prefix = bound[name]
            names.append((module, f"{prefix}.{attr}".strip(".")))
    return names


def resolve(module: str, dotted: str) -> str | None:
    """None where `module` has `dotted`; else what is missing. A third-party package that is not
    installed here (an optional extra, or what one of our modules needs from it) is not checked."""
    import importlib

    try:
        obj = importlib.import_module(module)
    except ModuleNotFoundError as e:  # ours missing: stale; a third-party one (an extra) not installed: unchecked
        missing = e.name or module
        ours = missing.split(".")[0] in {"oospec_agents", "langchain_oospec"} or missing.startswith("llama_index.llms.oospec")
        return f"no module {missing}" if ours else None
    for part in [p for p in dotted.split(".") if p]:
        if not hasattr(obj, part):
            try:
                obj = importlib.import_module(f"{obj.__name__}.{part}")
                continue
            except (ImportError, AttributeError):
                return f"no {part} in {getattr(obj, '__name__', obj)}"
        obj = getattr(obj, part)
    return None


def test_every_python_name_the_docs_show_exists():
    missing = set()
    for path in shown_pages():
        for lang, body in FENCE.findall(path.read_text(encoding="utf-8")):
            if lang not in {"python", "py", "pycon"}:
                continue
            for module, dotted in python_names(body):
                problem = resolve(module, dotted)
                if problem:
                    missing.add(f"{path.relative_to(ROOT)}: from {module} import {dotted}: {problem}")
    assert not missing, "names the snippets use that do not exist:\n" + "\n".join(sorted(missing))


def test_the_name_and_flag_checks_read_what_a_reader_sees():
    assert oospec_flags(".venv/bin/oospec bench --data x.jsonl --limit=60 -m 3 # --not-a-flag") == \
        [("bench", "--data"), ("bench", "--limit")]
    assert oospec_flags("oospec serve --port 8000 | tee log --x && oospec adapt --log l") == \
        [("serve", "--port"), ("adapt", "--log")]
    assert command_lines("```bash\noospec serve \\\n    --port 1\n```\nsee `oospec demo --model m`\n") == \
        ["oospec serve      --port 1", "oospec demo --model m"]
    code = ("from oospec_agents import Engine, Generation as G\nfrom a.b import (c,\n d)\nimport json\n"
            "Engine.from_pretrained(x)\nengine.generate()\n")
    assert python_names(code) == [("oospec_agents", "Engine"), ("oospec_agents", "Generation"), ("a.b", "c"),
                                  ("a.b", "d"), ("json", ""), ("oospec_agents", "Engine.from_pretrained")]
    assert resolve("oospec_agents", "Engine.from_pretrained") is None
    assert resolve("oospec_agents", "Engine.no_such_method") == "no no_such_method in Engine"
    assert resolve("oospec_agents.no_such_module", "") is not None
    assert resolve("a_package_nobody_installed", "x") is None


def test_every_example_is_listed_in_the_examples_index():
    """examples/README.md names each user example and each experiment script once in its tables."""
    examples = ROOT / "examples"
    index = (examples / "README.md").read_text(encoding="utf-8")
    linked = {(examples / t).resolve() for t in LINK.findall(index) if t}
    files = [p for p in examples.rglob("*") if p.is_file() and p.name != "README.md" and "__pycache__" not in p.parts
             and ".ipynb_checkpoints" not in p.parts]
    assert not [p.relative_to(ROOT) for p in files if p.resolve() not in linked]
    experiments = [p for p in files if p.parent.name == "experiments"]
    assert experiments and not [p for p in files if p.parent == examples and p.stem not in _user_examples()], \
        "an experiment script beside the user examples: move it to examples/experiments/"


def _user_examples() -> set[str]:
    import sys

    sys.path.insert(0, str(ROOT / "examples"))
    from sync_notebooks import TWINS

    return {*TWINS, "sync_notebooks"}


def test_the_docs_index_names_every_page():
    """docs/README.md gives the reading order: every guide in docs/ is in it, by link or by name."""
    index = (DOCS / "README.md").read_text(encoding="utf-8")
    assert not [p.name for p in sorted(DOCS.glob("*.md")) if p.name != "README.md" and p.name not in index]


# --- what a user is shown runs from a clone: no command needs the project's `../shared` (#64) ---

#: `../shared` (the development checkout's sibling, which a clone lacks), and the same path built in Python
SHARED = re.compile(r"\.\./shared\b|['\"]shared['\"]\s*/\s*['\"]data['\"]")

#: Files other engineers were editing when this check came (#64) that still show a `../shared` command.
#: The lead empties this at merge time, once their owners' lines give the user's own records
#: (`--data my-records.jsonl`), BFCL's package data (`--bfcl`) or a link to the report holding the command.
PENDING_OWNERS = {
}


def shown_commands(path: Path) -> list[str]:
    """What a page shows to run: its code blocks (any language) and inline code spans; a script or
    notebook under examples/: every line (its docstring's commands, its defaults)."""
    text = path.read_text(encoding="utf-8")
    if path.suffix != ".md":
        return text.splitlines()
    return [body for _, body in FENCE.findall(text)] + re.findall(r"`([^`]+)`", _without_code_blocks(text))


def clone_files() -> list[Path]:
    """README, the guides (not the dated reports, which keep their commands as run), the front-ends'
    READMEs, and every file under examples/."""
    examples = [p for p in (ROOT / "examples").rglob("*") if p.is_file() and "__pycache__" not in p.parts
                and p.suffix in {".py", ".sh", ".ipynb", ".md"}]
    return [*shown_pages(), *sorted(examples)]


def test_no_command_a_user_is_shown_needs_the_projects_shared_checkout():
    needs = sorted({f"{path.relative_to(ROOT)}: {SHARED.search(shown).group(0)} in {shown.strip()[:90]!r}"
                    for path in clone_files() if str(path.relative_to(ROOT)) not in PENDING_OWNERS
                    for shown in shown_commands(path) if SHARED.search(shown)})
    assert not needs, ("commands a clone cannot run (name your records: --data my-records.jsonl, --bfcl, or "
                       "link the report that holds the command as run):\n" + "\n".join(needs))


def test_the_pending_owners_still_need_their_exemption():
    """A file leaves PENDING_OWNERS once its owner's lines are fixed, so the list cannot hide a new one."""
    stale = [name for name in sorted(PENDING_OWNERS) if not (ROOT / name).is_file()
             or not any(SHARED.search(shown) for shown in shown_commands(ROOT / name))]
    assert not stale, f"fixed or gone: remove from PENDING_OWNERS: {stale}"


def test_the_shared_check_reads_commands_not_prose(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("Measured on the project's set beside the checkout (../shared, not in a clone).\n"
                    "```bash\noospec bench --data ../shared/data/toolcalls/dev.jsonl\n```\n"
                    "or `oospec bench --dev ../shared/x.jsonl` and `--data my-records.jsonl`\n")
    assert [bool(SHARED.search(s)) for s in shown_commands(page)] == [True, True, False]
    assert SHARED.search('DATA = Path(__file__).parents[3] / "shared" / "data" / "toolcalls"')
    assert not SHARED.search("the shared prefix / shared layout")
