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
