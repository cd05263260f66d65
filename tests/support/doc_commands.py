"""The commands the README and docs/*.md give a reader, read out of their code blocks and checked against what
trimtab really accepts (tests/test_readme.py): a `trimtab` command line is parsed by the `trimtab` command itself
(an unknown subcommand or option, a missing value, a value outside a choice or range fails), `python -m
trimtab.workload` by its own parser, `pip install '.[x]'` against pyproject's extras, a script of the checkout by
its existence and its ``--help``. A program this repository does not own is accepted only when named in EXTERNAL,
so a new kind of command in the docs needs a check here first."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import click

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL_INFO = {"sh", "bash", "shell", "console"}
# Programs the docs may name that are not this repository's: nothing here can check their arguments.
EXTERNAL = {
    "curl": "HTTP client", "jq": "JSON filter", "systemctl": "systemd", "createdb": "PostgreSQL",
    "psql": "PostgreSQL", "apt-get": "Debian", "export": "the shell's own", "cat": "coreutils",
}
SEPARATORS = {"&&", "||", "|", ";", "&"}


@dataclass(frozen=True)
class Block:
    where: str  # file:line of the opening fence
    info: str  # the fence's info string ("sh", "python", "" …)
    text: str


def code_blocks(path: Path) -> list[Block]:
    """Every fenced block of ``path``, with the line its fence opens on."""
    blocks, lines = [], path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^```(\S*)\s*$", lines[i])
        if m:
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            blocks.append(Block(f"{path.relative_to(ROOT)}:{i + 1}", m.group(1), "\n".join(lines[i + 1:end])))
            i = end
        i += 1
    return blocks


def all_blocks() -> list[Block]:
    return [b for path in DOC_FILES for b in code_blocks(path)]


def script_name(block: Block) -> str | None:
    """The file name a Python block gives itself on its first line (``# my_loop.py``): a script the docs define
    for the reader to save and run; None for a fragment."""
    m = re.fullmatch(r"# (\w+\.py)", block.text.splitlines()[0].strip()) if block.info == "python" else None
    return m.group(1) if m else None


def defined_scripts() -> set[str]:
    return {name for b in all_blocks() if (name := script_name(b))}


def shell_lines(block: Block) -> list[str]:
    """The command lines of a shell block: continuations joined, comment-only and empty lines left out."""
    joined = re.sub(r"\\\n\s*", " ", block.text)
    return [line.strip() for line in joined.splitlines() if line.strip() and not line.strip().startswith("#")]


def inline_trimtab_commands(path: Path) -> list[tuple[str, str]]:
    """Every inline code span of prose that is a `trimtab <command> …` line (spans may wrap), with its file."""
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
    spans = re.findall(r"`(trimtab [a-z][^`]*)`", text)
    return [(str(path.relative_to(ROOT)), " ".join(s.split())) for s in spans]


def commands_of(line: str) -> list[list[str]]:
    """The simple commands of one shell line (split at && || | ; &), each without leading VAR=value words and
    without a trailing comment."""
    lex = shlex.shlex(line, posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    lex.commenters = "#"
    out, cur = [], []
    for token in lex:
        if token in SEPARATORS:
            out.append(cur)
            cur = []
        else:
            cur.append(token)
    out.append(cur)
    return [drop_assignments(c) for c in out if drop_assignments(c)]


def drop_assignments(words: list[str]) -> list[str]:
    i = 0
    while i < len(words) and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[i]):
        i += 1
    return words[i:]


def check_command(words: list[str]) -> None:
    """Raises AssertionError saying what is wrong with one simple command."""
    program, args = words[0], words[1:]
    if program == "sudo":
        return check_command(args)
    if program == "trimtab":
        return check_trimtab(args)
    if program in ("python", "python3"):
        if args and args[0] in defined_scripts():
            return  # a script a Python block of the docs defines (tests/test_readme.py runs those)
        return check_python(args)
    if program == "pip":
        return check_pip(args)
    assert program in EXTERNAL, f"{program!r}: no check knows this program (add one, or name it in EXTERNAL)"


def check_trimtab(args: list[str]) -> None:
    from trimtab.cli.main import cli

    given = list(args)
    cmd: click.Command = cli
    ctx = click.Context(cli, info_name="trimtab")
    while isinstance(cmd, click.Group) and args and not args[0].startswith("-"):
        sub = cmd.get_command(ctx, args[0])
        assert sub is not None, f"`trimtab … {args[0]}`: no such command (has: {', '.join(cmd.list_commands(ctx))})"
        cmd, args = sub, args[1:]
        ctx = click.Context(cmd, info_name=cmd.name, parent=ctx)
    if not cmd.params and cmd.context_settings.get("ignore_unknown_options"):  # passes its arguments on (verl-tail)
        return check_help(("-m", "trimtab.cli.main", *given[:len(given) - len(args)]), args)
    try:
        values, _, _ = cmd.make_parser(ctx).parse_args(list(args))
        for param in cmd.params:
            value = values.get(param.name)
            if value is not None and isinstance(param.type, (click.Choice, click.types.IntParamType,
                                                             click.types.FloatParamType)):
                for v in value if isinstance(value, (list, tuple)) else [value]:
                    param.type.convert(v, param, ctx)
    except click.UsageError as exc:
        raise AssertionError(f"`trimtab {ctx.command_path.split(' ', 1)[-1]}`: {exc.format_message()}") from None
    except click.BadParameter as exc:
        raise AssertionError(f"`{ctx.command_path}`: {exc.format_message()}") from None


def check_python(args: list[str]) -> None:
    if args[:1] == ["-m"]:
        module, rest = args[1], args[2:]
        if module == "pip":
            return check_pip(rest)
        if module == "pytest" or module.startswith("verl."):
            return  # pytest's own; verl's trainers take Hydra overrides (docs/verl.md), verl's to check
        if module == "trimtab.workload":
            return check_workload(rest)
        if module == "trimtab.cli.main":
            return check_trimtab(rest)
        path = ROOT / (module.replace(".", "/") + ".py")
        assert path.is_file(), f"python -m {module}: no {path.relative_to(ROOT)} in the checkout"
        return check_help(("-m", module), rest)
    script = ROOT / args[0]
    assert script.is_file(), f"python {args[0]}: no such file in the checkout"
    check_help((args[0],), args[1:])


def check_workload(args: list[str]) -> None:
    from trimtab.workload.cli import build_parser

    parser = build_parser()
    parser.exit_on_error = False
    try:
        parser.parse_args(args)
    except Exception as exc:  # argparse.ArgumentError
        raise AssertionError(f"python -m trimtab.workload {' '.join(args)}: {exc}") from None


@lru_cache(maxsize=None)
def help_text(target: tuple[str, ...]) -> str:
    done = subprocess.run([sys.executable, *target, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"python {' '.join(target)} --help: {done.stderr[-500:]}"
    return done.stdout


def check_help(target: tuple[str, ...], args: list[str]) -> None:
    """Each ``--option`` of ``args`` is one the program's ``--help`` names."""
    text = help_text(target)
    for arg in args:
        if arg.startswith("--"):
            name = arg.split("=", 1)[0]
            assert re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text), \
                f"python {' '.join(target)}: its --help names no {name}"


def check_pip(args: list[str]) -> None:
    assert args[:1] == ["install"], f"pip {' '.join(args)}: only `pip install` is checked"
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for arg in args[1:]:
        m = re.fullmatch(r"\.\[([\w,-]+)\]", arg)
        if m:
            missing = set(m.group(1).split(",")) - set(extras)
            assert not missing, f"pip install {arg}: pyproject.toml has no extra {', '.join(sorted(missing))}"
