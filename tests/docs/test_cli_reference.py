"""The CLI reference page cannot drift from the app: every command and every option of `trtbuild` appears
in docs/reference/cli.md (in-process: click's view of the typer app, no subprocess)."""

from __future__ import annotations

import re

from cli_reference import PAGE, is_argument, is_option, option_names, root_command

FIX = "regenerate it: .venv/bin/python tests/docs/cli_reference.py"


def _sections(text: str) -> dict[str, str]:
    parts = re.split(r"^## ", text, flags=re.M)
    return {part.split("\n", 1)[0].strip(): part for part in parts[1:]}


def test_every_command_and_option_is_documented():
    root = root_command()
    sections = _sections(PAGE.read_text())
    assert sum(is_option(p) for c in root.commands.values() for p in c.params) > 100, "no options seen: the app changed shape"
    missing = []
    for option in (p for p in root.params if is_option(p)):
        missing += [f"global {o}" for o in option_names(option) if f"`{o}`" not in sections.get("Global options", "")]
    for name, command in root.commands.items():
        section = sections.get(f"trtbuild {name}")
        if section is None:
            missing.append(f"command {name}")
            continue
        for param in command.params:
            if is_option(param):
                missing += [f"{name} {o}" for o in option_names(param) if f"`{o}`" not in section]
            elif is_argument(param) and f"`{param.name.upper()}`" not in section:
                missing.append(f"{name} argument {param.name.upper()}")
    assert not missing, f"{PAGE.name} misses {', '.join(missing)}; {FIX}"


def test_no_command_documented_that_the_app_lacks():
    documented = {title.removeprefix("trtbuild ") for title in _sections(PAGE.read_text()) if title.startswith("trtbuild ")}
    assert documented <= set(root_command().commands), f"stale commands {documented - set(root_command().commands)}; {FIX}"
