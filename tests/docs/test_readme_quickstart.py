"""README.md's "Your first hour" runs as written: its shell and Python blocks, in order, as one script on a
fresh build dir (convert the bundled GGUF, build the TensorRT engine and its twin, inspect, run, chat, serve and
the openai client, the Python API). The only edit: the server's port, 8000 in the text, becomes a free one."""

from __future__ import annotations

import os
import re
import socket
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def quickstart_script(text: str, port: int) -> str:
    """The section's ```bash blocks verbatim, then its ```python block through .venv/bin/python."""
    section = text.split("## Your first hour", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```(bash|python)\n(.*?)```", section, re.S)
    assert [kind for kind, _ in blocks].count("bash") >= 4 and any(kind == "python" for kind, _ in blocks), blocks
    parts = ["set -euo pipefail"]
    for kind, body in blocks:
        if kind == "python":
            body = f".venv/bin/python - <<'PYEOF'\n{body}PYEOF\n"
        parts.append(body.replace("8000", str(port)))
    return "\n".join(parts)


def test_the_first_hour_runs_as_written(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (tmp_path / ".venv").symlink_to(ROOT / ".venv")  # "from the repository root": its venv, a fresh build/
    script = quickstart_script(README.read_text(), port)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=1500,
                          env=env, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    out = proc.stdout
    assert out.count("Paris") >= 3, out  # run, chat's first turn, the openai client (and the API's greedy answer)
    assert "Rome" in out, out  # chat's second turn ("And of Italy?") answered from the kept conversation
    assert (tmp_path / "build" / "smollm2" / "rank0.engine").is_file()
