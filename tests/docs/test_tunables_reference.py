"""The runtime's tunables (engine_builder/runner/tunables.py) and their reference page cannot drift apart."""

from __future__ import annotations

import ast

from tunables_reference import PAGE, SOURCE, page

FIX = "regenerate it: .venv/bin/python tests/docs/tunables_reference.py"


def test_the_page_is_the_module_as_it_is():
    assert PAGE.read_text() == page(), f"docs/reference/tunables.md is stale; {FIX}"


def test_every_tunable_has_a_row_and_a_reason():
    names = [node.targets[0].id for node in ast.parse(SOURCE.read_text()).body if isinstance(node, ast.Assign)]
    rows = {line.split("|")[1].strip().strip("`"): line.split("|")[3].strip()
            for line in page().splitlines() if line.startswith("| `")}
    assert len(names) > 30 and set(names) == set(rows)
    assert [n for n, why in rows.items() if not why] == []
