"""Every TRTBUILD_* variable the code reads (engine_builder/util/environment.py's table) has its row in the run
guide's table of environment variables, so a variable added to the code cannot be missing from the docs."""

from __future__ import annotations

from pathlib import Path

from engine_builder.util.environment import VARIABLES

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guide" / "run.md"


def test_every_variable_has_a_row_in_the_run_guide():
    rows = {line.split("`")[1].split("=")[0] for line in GUIDE.read_text().splitlines()
            if line.startswith("| `TRTBUILD_")}
    assert set(VARIABLES) - rows == set()
