"""Checks of what the documentation promises that mkdocs cannot see; run by the nox `docs` session.

- Install lines work as written today: no package of this project is installed from PyPI
  without the caveat that it is not there yet, and torch is not installed unpinned (pip then
  takes a multi-GB CUDA build where a CPU one would do) unless the CPU index is named.
- The README's reliability claim is the measured one, with a link to the figures.
- Benchmark pages: titles say what was measured, not a session's internal name; a speed-up is
  stated with the run-to-run spread; no commit is recorded as ``-dirty``.
- The plugin tutorial does not ask authors to add a test the template already generates.

    python tools/check_docs.py      # exit 1 with one line per problem
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
CAVEAT = "not on PyPI"
CPU_INDEX = "download.pytorch.org/whl/cpu"
# A command a reader runs (not an error message quoted in prose): pip or python -m pip, perhaps
# after environment variables or a virtual environment's path.
COMMAND = re.compile(r"^(?:[A-Z_]+=\S+\s+)*(?:\S*/)?(?:pip3?|python3? -m pip) install\b")
PUBLISHED_NAME = re.compile(r"pip install [^`\n]*?(?<![\w./-])[\"']?lightning-strategies[\w-]*")


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]


def install_commands(text: str) -> list[tuple[int, str]]:
    """(line number, command) of each `pip install` in a code block or an inline code span."""
    found, in_block = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            in_block = not in_block
            continue
        if in_block and COMMAND.match(line.strip()):
            found.append((number, line.strip()))
        elif not in_block:
            found += [(number, span) for span in re.findall(r"`([^`]*pip install[^`]*)`", line) if COMMAND.match(span)]
    return found


def check_install_lines() -> list[str]:
    problems = []
    for page in pages():
        text = page.read_text()
        lines = text.splitlines()
        for number, command in install_commands(text):
            where = f"{page.relative_to(ROOT)}:{number}"
            nearby = "\n".join(lines[max(0, number - 8) : number + 8])
            if PUBLISHED_NAME.search(command) and CAVEAT not in nearby and "Install it with" not in nearby:
                problems.append(
                    f"{where}: `{command}` installs from PyPI, where the packages are not yet; say so "
                    f"(`{CAVEAT}`) and give the install from a checkout next to it"
                )
            if ".whl" in command and "packages/core" not in nearby:
                problems.append(
                    f"{where}: `{command}` installs a wheel whose dependency lightning-strategies is {CAVEAT} yet; "
                    "install the core from a checkout in the same environment first"
                )
            if re.search(r"pip install (?:[^`]*\s)?torch(?:\s|$)", command) and CPU_INDEX not in command:
                problems.append(
                    f"{where}: `{command}` installs an unpinned torch, a multi-GB CUDA build; name the CPU "
                    f"index (--index-url https://{CPU_INDEX}) or pin the version the project tests"
                )
    return problems


def check_reliability_claim() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    problems = []
    if re.search(r"Every strategy here keeps", readme):
        problems.append(
            "README.md: claims every strategy keeps progress safe; the figures cover the CPU strategies only"
        )
    if "docs/reliability.md#measured" not in readme:
        problems.append("README.md: the reliability claim links no figures (docs/reliability.md#measured)")
    return problems


def check_benchmarks() -> list[str]:
    page = DOCS / "benchmarks.md"
    text = page.read_text()
    labels = {path.name.removesuffix(".summary.json") for path in (DOCS / "results").glob("*.summary.json")}
    problems = [
        f"docs/benchmarks.md: the title '{heading}' is a session's internal name; say what was measured"
        for heading in re.findall(r"^## (.+)$", text, flags=re.MULTILINE)
        if heading.strip() in labels
    ]
    if re.search(r"speed-up", text) and "run-to-run spread" not in text:
        problems.append("docs/benchmarks.md: a speed-up is stated without the run-to-run spread of the same run")
    for path in pages():
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"[0-9a-f]{7,40}-dirty", line):
                problems.append(f"{path.relative_to(ROOT)}:{number}: a '-dirty' commit; say the tree was modified")
    # A result measured on a modified tree belongs to no commit exactly: the pages must say so.
    shown = "\n".join(path.read_text() for path in pages())
    recorded = "\n".join(path.read_text() for path in (DOCS / "results").glob("*.json*"))
    for commit in sorted(set(re.findall(r"([0-9a-f]{7,40})-dirty", recorded))):
        if f"{commit[:7]} with uncommitted changes" not in shown:
            problems.append(
                f"docs/results: results measured at {commit[:7]} with uncommitted changes are shown without saying so"
            )
    return problems


def check_tutorial_tests() -> list[str]:
    """A test shown in the tutorial after "add" must not be one the template generates."""
    template = "\n".join(path.read_text() for path in (ROOT / "tools" / "plugin-template" / "tests").glob("*.py"))
    generated = {call.replace("{{name}}", "acme") for call in re.findall(r"strategy_conformance\([^)]*\)", template)}
    text = (DOCS / "plugin-authoring.md").read_text()
    problems = []
    for match in re.finditer(r"([^\n]*\n){0,3}```python\n(.*?)```", text, flags=re.DOTALL):
        before, block = match.group(0).split("```python", 1)[0], match.group(2)
        calls = set(re.findall(r"strategy_conformance\([^)]*\)", block))
        if calls & generated and re.search(r"\badd\b", before, flags=re.IGNORECASE):
            line = text.count("\n", 0, match.start(2)) + 1
            problems.append(
                f"docs/plugin-authoring.md:{line}: asks authors to add a test that tools/new-plugin already "
                "generates (tests/test_conformance.py); say it is there"
            )
    return problems


def main() -> int:
    problems = check_install_lines() + check_reliability_claim() + check_benchmarks() + check_tutorial_tests()
    for problem in problems:
        print(problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
