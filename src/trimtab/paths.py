"""Where trimtab keeps its state: the admin token, the spool and the default SQLite store, all in one directory.

The state directory is ``--state-dir`` (any command with ``--db``), else ``$TRIMTAB_STATE_DIR``, else systemd's
``$STATE_DIRECTORY`` (the unit's ``StateDirectory=``, ``/var/lib/trimtab``), else the user's data dir
(``$XDG_DATA_HOME/trimtab``, default ``~/.local/share/trimtab``). ``--db`` moves only the store and
``--spool-dir`` only the spool; the admin token always goes to the state directory.

What trimtab creates there is private from the first byte: the directory 0700, the SQLite file 0600 (its WAL
and shared-memory files inherit that), token files 0600 — by explicit modes, not by whatever umask the caller
had, and a secret is never written through a symlink or into an older, wider file.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Optional

# The exit status of a process whose configuration (store, server, token file) is refused (sysexits' EX_CONFIG);
# the units set RestartPreventExitStatus= to it: a restart cannot fix a configuration. Here, not in the daemon, so
# the trainer side (verl-tail) can use it without importing daemon code.
EXIT_MISCONFIGURED = 78

_chosen: Optional[Path] = None  # --state-dir, set once by the command line


def use_state_dir(path: Optional[Path]) -> None:
    """Make ``path`` the state directory of this process (``--state-dir``); None keeps the environment's."""
    global _chosen
    _chosen = Path(path) if path is not None else None


def state_dir() -> Path:
    if _chosen is not None:
        return _chosen
    explicit = os.environ.get("TRIMTAB_STATE_DIR")
    if explicit:
        return Path(explicit)
    systemd = os.environ.get("STATE_DIRECTORY")
    if systemd:
        # systemd may pass several colon-separated directories; the first is ours.
        return Path(systemd.split(":")[0])
    xdg = os.environ.get("XDG_DATA_HOME")
    base = Path(xdg) if xdg else Path.home() / ".local" / "share"
    return base / "trimtab"


def default_db_url() -> str:
    return f"sqlite:///{state_dir() / 'trimtab.db'}"


def default_spool_dir() -> Path:
    return state_dir() / "spool"


def private_dir(path: Path) -> Path:
    """Create ``path`` (and missing parents) with the last component 0700; an existing directory is left as it is
    (its owner chose its mode, e.g. systemd's ``StateDirectoryMode=``)."""
    path = Path(path)
    if not path.is_dir():
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            path.mkdir(mode=0o700)
            os.chmod(path, 0o700)  # mkdir's mode is filtered by the umask; this is not
        except FileExistsError:
            pass
    return path


def write_private_file(path: Path, text: str, before_replace: Callable[[], None] = lambda: None) -> None:
    """Write ``text`` to ``path`` as a 0600 file: into a new temporary file beside it (O_EXCL | O_NOFOLLOW,
    fchmod 0600, fsync), then renamed over ``path``. A symlink at ``path`` is replaced, never followed, and an
    existing file's mode (0644) never carries over. ``before_replace`` runs between the two (the admin token is
    stored then: a crash leaves an unused file, never a stored secret that nobody has); if it raises, the
    temporary file is removed and ``path`` is untouched."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        try:
            os.fchmod(fd, 0o600)
            os.write(fd, text.encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        before_replace()
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


class BadToken(ValueError):
    """A token (or token file) that cannot be a trimtab secret; the message names the file and what is wrong."""


def check_token(token: str, source: str = "the token") -> str:
    """``token`` without surrounding whitespace, if it can be sent as a bearer token: one line of printable ASCII
    without spaces (what ``trimtab token create`` writes). Else :class:`BadToken` saying what ``source`` holds."""
    text = token.strip()
    if not text:
        raise BadToken(f"{source} is empty: put the secret that `trimtab token create` printed in it")
    if "\n" in text or "\r" in text:
        raise BadToken(f"{source} holds {len(text.splitlines())} lines; a token is one line (the secret that "
                       f"`trimtab token create` printed, or its --out file as written)")
    bad = next((c for c in text if not (c.isascii() and c.isprintable()) or c.isspace()), None)
    if bad is not None:
        raise BadToken(f"{source} is not a token: it contains {bad!r}; a token is one line of letters, digits, "
                       f"'_' and '-' (the secret that `trimtab token create` printed)")
    return text


def read_token_file(path: os.PathLike | str) -> str:
    """The token in ``path`` (see :func:`check_token`); :class:`BadToken` for an unreadable, binary or
    multi-line file, naming it."""
    try:
        raw = Path(path).expanduser().read_bytes()
    except OSError as exc:
        raise BadToken(f"cannot read the token file {path}: {exc.strerror or exc}") from exc
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError:
        raise BadToken(f"the token file {path} is not a token: it holds binary or non-ASCII bytes "
                       f"({len(raw)} bytes); write the secret that `trimtab token create` printed into it, or "
                       f"make it with `trimtab token create --out {path}`") from None
    return check_token(text, f"the token file {path}")


def token_from(token: Optional[str], token_file: Optional[os.PathLike | str],
               what: str = "--token (or TRIMTAB_TOKEN)") -> Optional[str]:
    """The token a command or adapter was given, checked: read from ``token_file`` when one is named, else
    ``token`` (``what`` names where it came from); None when neither is. :class:`BadToken` — naming the file or
    ``what`` and what is wrong — for anything that cannot be one token. Every reader of a token file uses this."""
    if token_file is not None and str(token_file) != "":
        return read_token_file(token_file)
    if token is not None and token != "":
        return check_token(token, what)
    return None
