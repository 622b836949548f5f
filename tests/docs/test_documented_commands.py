"""Every `trtbuild COMMAND --option` written in README.md and docs/ names a command and options the app has, so
a renamed or removed option cannot live on in an example. In-process: the commands are parsed from the Markdown's
code blocks and checked against click's view of the typer app (no command runs)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from cli_reference import is_option, option_names, root_command

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
SKIP = {ROOT / "docs" / "reference" / "cli.md", ROOT / "docs" / "design.md"}  # generated / historical notes
ENDS = {"|", "||", "&&", ";", "&", ">", ">>", "2>&1", "<"}


def _code_lines(text: str):
    """Lines inside fenced code blocks, with backslash continuations joined."""
    inside, pending = False, ""
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            inside, pending = not inside, ""
            continue
        if not inside:
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        yield pending + line
        pending = ""


def _invocations(line: str):
    """(command, [options]) for each `trtbuild COMMAND ...` on a shell line."""
    line = line.split(" #", 1)[0]
    for match in re.finditer(r"(?:^|[\s/(])trtbuild((?:\s+-{1,2}[a-z-]+)*)\s+([a-z][a-z-]*)(.*)", line):
        globals_, command, rest = match.group(1).split(), match.group(2), match.group(3)
        try:
            tokens = shlex.split(rest, posix=True)
        except ValueError:
            tokens = rest.split()
        options = []
        for token in tokens:
            if token in ENDS or token.startswith(("|", ">")):
                break
            token = token.strip("[](),")
            if re.fullmatch(r"-{1,2}[a-zA-Z][\w-]*(=.*)?", token):
                options.append(token.split("=", 1)[0])
        yield command, globals_, options


def test_documented_commands_and_options_exist():
    root = root_command()
    global_options = {o for p in root.params if is_option(p) for o in option_names(p)} | {"--help"}
    unknown, seen = [], 0
    for page in PAGES:
        if page in SKIP:
            continue
        for line in _code_lines(page.read_text()):
            for command, globals_, options in _invocations(line):
                seen += 1
                where = f"{page.relative_to(ROOT)}: trtbuild {command}"
                unknown += [f"{where}: global {g}" for g in globals_ if g not in global_options]
                if command not in root.commands:
                    unknown.append(f"{where}: no such command")
                    continue
                known = {o for p in root.commands[command].params if is_option(p) for o in option_names(p)}
                unknown += [f"{where} {o}" for o in options if o not in known | {"--help"}]
    assert seen > 50, f"only {seen} `trtbuild ...` lines found in the docs: the parser lost them"
    assert not unknown, "documented but not in the app:\n" + "\n".join(unknown)
