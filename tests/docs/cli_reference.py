"""docs/reference/cli.md, written from the typer app itself (click's view of it).

Regenerate after changing a command or an option:

    .venv/bin/python tests/docs/cli_reference.py

tests/docs/test_cli_reference.py fails while the committed page misses a command or an option of the app.
"""

from __future__ import annotations

import sys
from pathlib import Path

PAGE = Path(__file__).resolve().parents[2] / "docs" / "reference" / "cli.md"

HEADER = """# CLI reference

Generated from the `trtbuild` typer app (`engine_builder/cli/commands.py`) by
`.venv/bin/python tests/docs/cli_reference.py`; `tests/docs/test_cli_reference.py` fails when a command or
an option of the app is missing here. The user guide explains what each command is for:
[convert](../guide/convert.md), [build](../guide/build.md), [run](../guide/run.md), [chat](../guide/chat.md),
[serve](../guide/serve.md), [eval](../guide/eval.md), [route and Triton](../guide/scaling-out.md).
"""


# typer 0.29 vendors click (typer._click): parameters are told apart by their kind, not by click's classes
def is_option(param) -> bool:
    return param.param_type_name == "option" and param.name != "help"


def is_argument(param) -> bool:
    return param.param_type_name == "argument"


def root_command():
    import typer.main

    from engine_builder.cli import app
    return typer.main.get_command(app)


def option_names(param) -> list[str]:
    return [*param.opts, *getattr(param, "secondary_opts", [])]


def _cell(text: str | None) -> str:
    return " ".join((text or "").replace("\b", "").split()).replace("|", "\\|")


def _default(param) -> str:
    if param.is_flag and not param.secondary_opts:
        return ""
    default = param.default
    if default is None or callable(default) or repr(default).startswith("<") or default == ():
        return ""
    if isinstance(default, (list, tuple)):
        default = " ".join(map(str, default))
    return f"`{default}`"


def _type(param) -> str:
    if is_option(param) and param.is_flag:
        return "flag"
    annotation = param.type_descriptor.annotation
    name = getattr(annotation, "__name__", str(annotation)).lower()
    return name + (", repeatable" if param.multiple else "")


def _usage(name: str, command) -> str:
    args = " ".join(p.name.upper() if p.required else f"[{p.name.upper()}]"
                    for p in command.params if is_argument(p))
    return f"trtbuild {name} [OPTIONS] {args}".rstrip()


def _options_table(command) -> list[str]:
    options = [p for p in command.params if is_option(p)]
    if not options:
        return []
    rows = ["| option | type | default | |", "|---|---|---|---|"]
    for p in options:
        rows.append(f"| {' / '.join(f'`{o}`' for o in option_names(p))} | {_type(p)} | {_default(p)} | "
                    f"{_cell(p.help)} |")
    return rows + [""]


def render() -> str:
    root = root_command()
    out = [HEADER, "## Global options", "", "`trtbuild [GLOBAL OPTIONS] COMMAND ...`", ""]
    out += _options_table(root)
    out += ["## Commands", ""]
    out += [f"- [`{n}`](#trtbuild-{n}): {_cell((c.help or '').split(chr(10) * 2)[0])}" for n, c in root.commands.items()]
    out.append("")
    for name, command in root.commands.items():
        out += [f"## trtbuild {name}", "", _cell((command.help or "").split("\n\n")[0]), "",
                "```", _usage(name, command), "```", ""]
        arguments = [p for p in command.params if is_argument(p)]
        if arguments:
            out += ["Arguments: " + ", ".join(f"`{p.name.upper()}`" for p in arguments), ""]
        out += _options_table(command)
    return "\n".join(out).rstrip() + "\n"


if __name__ == "__main__":
    PAGE.parent.mkdir(parents=True, exist_ok=True)
    PAGE.write_text(render())
    print(f"wrote {PAGE.relative_to(Path.cwd()) if PAGE.is_relative_to(Path.cwd()) else PAGE}", file=sys.stderr)
