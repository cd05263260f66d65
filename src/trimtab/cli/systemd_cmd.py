"""`trimtab install-systemd`: render a role's unit from ``deploy/systemd/`` for this trimtab; write or print it."""

from __future__ import annotations

import os
import sys
from importlib import resources
from pathlib import Path
from typing import Optional

import click

ROLES = ("agent", "server", "up")
PLACEHOLDER = "{{TRIMTAB}}"
DEFAULT_UNIT_DIR = Path("/etc/systemd/system")
ENV_FILE = Path("/etc/trimtab/trimtab.env")
# ProtectHome=true hides these from the service: an executable (or its Python) under one of them cannot start.
HOME_DIRS = (Path("/home"), Path("/root"), Path("/run/user"))
# PrivateTmp=true gives the service empty /tmp and /var/tmp of its own: nothing installed there can start.
TMP_DIRS = (Path("/tmp"), Path("/var/tmp"))


def unit_name(role: str) -> str:
    return f"trimtab-{role}.service"


def template_text(role: str) -> str:
    """The unit template: package data ``trimtab.deploy`` when installed from a wheel, else the source tree's
    ``deploy/systemd/`` beside ``cli/`` (editable installs and checkouts)."""
    name = unit_name(role)
    try:  # `deploy` has no __init__.py: one joinpath argument at a time (a namespace package's MultiplexedPath)
        return (resources.files("trimtab.deploy") / "systemd" / name).read_text(encoding="utf-8")
    except (ModuleNotFoundError, OSError):
        pass
    path = Path(__file__).resolve().parent.parent / "deploy" / "systemd" / name
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise click.ClickException(f"the unit template {name} is not installed with trimtab ({path}: {exc.strerror})")


def default_command() -> tuple[list[str], list[Path]]:
    """This trimtab, and the files it runs from: the console script of the running interpreter's environment, else
    the one that was run, else ``python -m trimtab.cli.main``. The interpreter's path is not resolved: a venv's
    python is a link that must stay one."""
    import trimtab

    python = Path(sys.executable).absolute()
    package = Path(trimtab.__file__).resolve().parent
    for script in (python.parent / "trimtab", Path(sys.argv[0])):
        if script.name == "trimtab" and script.is_absolute() and script.is_file() and os.access(script, os.X_OK):
            return [str(script)], [script, python, Path(sys.base_prefix), package]
    return [str(python), "-m", "trimtab.cli.main"], [python, Path(sys.base_prefix), package]


def _systemd_word(word: str) -> str:
    """One ExecStart= argument: systemd expands %specifiers, $VARIABLES and C escapes, and splits on blanks."""
    escaped = word.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%").replace("$", "$$")
    return f'"{escaped}"' if any(c.isspace() or c == "'" for c in word) or '"' in word else escaped


def _interpreter(path: Path) -> Optional[Path]:
    """The ``#!`` interpreter of a script, if it is one."""
    try:
        with path.open("rb") as f:
            first = f.readline(512)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    words = first[2:].decode(errors="replace").split()
    return Path(words[0]) if words else None


def _under(paths: list[Path], dirs: tuple[Path, ...]) -> Optional[Path]:
    """The first of ``paths`` or their ``#!`` interpreters inside one of ``dirs``, also through links (a venv's
    python links to its base interpreter, which may live in ~/.pyenv)."""
    for path in paths + [i for i in map(_interpreter, paths) if i is not None]:
        for p in (path.absolute(), path.resolve()):
            if any(p.is_relative_to(d) for d in dirs):
                return p
    return None


def render_unit(role: str, command: list[str], needs: list[Path]) -> tuple[str, list[str]]:
    """The unit text for ``role`` running ``command`` (which runs from the files ``needs``), and notes for the
    person installing it."""
    text = template_text(role)
    if PLACEHOLDER not in text:
        raise click.ClickException(f"{unit_name(role)} has no {PLACEHOLDER} in its ExecStart=: a broken template")
    notes = []
    in_tmp = _under(needs, TMP_DIRS)
    if in_tmp is not None:
        notes.append(f"WARNING: {in_tmp} is under {next(d for d in TMP_DIRS if in_tmp.is_relative_to(d))}, which "
                     f"the unit's PrivateTmp=true replaces by an empty directory: the service could not start. "
                     f"Install trimtab outside /tmp and /var/tmp (e.g. a venv in /opt/trimtab) and pass its path "
                     f"with --exec")
    in_home = _under(needs, HOME_DIRS)
    if in_home is not None:
        text = text.replace("\nProtectHome=true\n", "\nProtectHome=read-only\n")
        notes.append(f"{in_home} is under a home directory, which ProtectHome=true would hide from the service: "
                     f"rendered ProtectHome=read-only instead (a system-wide install, e.g. a venv in /opt, keeps "
                     f"homes hidden)")
    return text.replace(PLACEHOLDER, " ".join(_systemd_word(w) for w in command)), notes


def _executable(value: Optional[str]) -> tuple[list[str], list[Path]]:
    if value is None:
        return default_command()
    path = Path(value)
    if not path.is_absolute():
        raise click.BadParameter(f"{value!r} is not an absolute path (systemd needs one)", param_hint="--exec")
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise click.BadParameter(f"{value} is not an executable file", param_hint="--exec")
    return [str(path)], [path]


def write_unit(path: Path, text: str) -> None:
    """Write ``path`` (mode 0644) all at once: a half-written unit is never left for systemd to load."""
    if not path.parent.is_dir():
        raise click.ClickException(f"{path.parent} is not a directory: create it, or pass --unit-dir")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        tmp.chmod(0o644)
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise click.ClickException(f"cannot write {path}: {exc.strerror or exc}. Installing into {path.parent} "
                                   f"needs root (sudo); or pass --unit-dir") from exc


@click.command("install-systemd")
@click.option("--role", type=click.Choice(ROLES), required=True,
              help="agent: sample this node's GPUs; server: API for many agents; up: agent + API on one node.")
@click.option("--dry-run", is_flag=True, help="Print the unit instead of writing it.")
@click.option("--unit-dir", type=click.Path(file_okay=False, path_type=Path), default=DEFAULT_UNIT_DIR,
              show_default=True, help="Where to write trimtab-<role>.service.")
@click.option("--exec", "exec_path", default=None, metavar="PATH",
              help="The trimtab executable the unit runs [default: this trimtab]")
def install_systemd(role: str, dry_run: bool, unit_dir: Path, exec_path: Optional[str]) -> None:
    """Write the systemd unit of ROLE (Type=notify, watchdog, restart on failure, state in /var/lib/trimtab,
    sandboxed) and print the systemctl line to start it. Nothing is started here.

    Settings come from /etc/trimtab/trimtab.env (TRIMTAB_DB, TRIMTAB_SERVER, TRIMTAB_TOKEN, ...) if it exists.
    """
    command, needs = _executable(exec_path)
    text, notes = render_unit(role, command, needs)
    for note in notes:
        click.echo(note if note.startswith("WARNING") else f"note: {note}", err=True)
    if dry_run:
        click.echo(text, nl=False)
        return
    in_tmp = _under(needs, TMP_DIRS)
    if in_tmp is not None:
        raise click.ClickException(f"not writing {unit_name(role)}: it would run {in_tmp}, which the service cannot "
                                   f"see (PrivateTmp=true). Install trimtab outside /tmp and /var/tmp and pass --exec")
    path = unit_dir / unit_name(role)
    write_unit(path, text)
    click.echo(f"wrote {path}")
    if not ENV_FILE.exists():
        click.echo(f"settings (optional): {ENV_FILE}, mode 0600, one TRIMTAB_<OPTION>=value a line "
                   f"(TRIMTAB_DB, TRIMTAB_SERVER, TRIMTAB_TOKEN, ...)")
    click.echo(f"next: systemctl daemon-reload && systemctl enable --now trimtab-{role}")
