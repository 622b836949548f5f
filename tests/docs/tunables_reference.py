"""docs/reference/tunables.md, written from engine_builder/runner/tunables.py: every constant, its value and the
comment that says why (a `# --- section ---` line starts a table).

Regenerate after changing a tunable:

    .venv/bin/python tests/docs/tunables_reference.py

tests/docs/test_tunables_reference.py fails while the committed page differs from what this writes.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "engine_builder" / "runner" / "tunables.py"
PAGE = ROOT / "docs" / "reference" / "tunables.md"

HEADER = """# Runtime tunables

Generated from `engine_builder/runner/tunables.py` by `.venv/bin/python tests/docs/tunables_reference.py`
(`tests/docs/test_tunables_reference.py` fails when the two differ). These are the runtime's numeric defaults and
policy constants in one place; what a user sets per run is a flag or an argument ([CLI reference](cli.md)), the
`TRTBUILD_*` environment variables are listed in the [run guide](../guide/run.md), and the HTTP server's limits
are `serve`'s flags.
"""


def page() -> str:
    lines = SOURCE.read_text().splitlines()
    values = {node.targets[0].id: ast.get_source_segment(SOURCE.read_text(), node.value)
              for node in ast.parse(SOURCE.read_text()).body
              if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)}
    out, comment = [HEADER], []
    for line in lines:
        stripped = line.strip()
        if stripped.startswith("# ---"):
            title = stripped.strip("# -")
            out += ["", f"## {title}", "", "| name | value | why |", "|---|---|---|"]
            comment = []
        elif stripped.startswith("#"):
            comment.append(stripped.lstrip("# "))
        elif "=" in line and line.split("=")[0].strip() in values:
            name = line.split("=")[0].strip()
            why = " ".join([*comment, line.split("#", 1)[1].strip() if "#" in line else ""]).strip()
            out.append(f"| `{name}` | `{values[name]}` | {why.replace('|', '/')} |")
            comment = []
        else:
            comment = []
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    PAGE.write_text(page())
    sys.stdout.write(f"wrote {PAGE}\n")
