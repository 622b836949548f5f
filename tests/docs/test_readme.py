"""README.md stays a five-minute read that points into docs/: short, its links resolve, and it names the test
command CI runs (.ci/run = `make test`). Reads files only (milliseconds)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def test_readme_is_short():
    lines = README.read_text().count("\n")
    assert lines <= 250, f"README.md has {lines} lines (at most ~250): move usage to docs/guide/, figures to docs/performance.md"


def test_readme_links_resolve():
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", README.read_text()):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        if not (ROOT / target.split("#", 1)[0]).exists():
            broken.append(target)
    assert not broken, f"README.md links to missing files: {broken}"


def test_readme_names_the_test_command_ci_runs():
    text = README.read_text()
    assert "make test" in text and "make demo" in text
    assert "make test" in (ROOT / ".ci" / "run").read_text()
