"""Configuration: flags > ``TRIMTAB_*`` environment > ``trimtab.toml`` > defaults.

Flags and environment variables are click's job (every option names its ``TRIMTAB_*`` variable). The TOML file
becomes click's ``default_map``: top-level keys apply to every command that has that option, a ``[agent]`` (or
``[check]``, …) table overrides them for one command. Keys are option names with ``_`` or ``-``. A key that no
command knows is an error that names the file and the key, so a typo never silently does nothing.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Mapping, Optional

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib


class ConfigError(ValueError):
    """The configuration file cannot be used; the message says which file, where, and why."""


def candidate_paths() -> list[Path]:
    paths = [Path.cwd() / "trimtab.toml", Path.home() / ".config" / "trimtab" / "trimtab.toml"]
    paths.append(Path("/etc/trimtab/trimtab.toml"))
    return paths


def find_config_file(explicit: Optional[str]) -> Optional[Path]:
    """The file to read: ``--config``, else ``$TRIMTAB_CONFIG``, else the first of :func:`candidate_paths`."""
    chosen = explicit or os.environ.get("TRIMTAB_CONFIG")
    if chosen:
        path = Path(chosen)
        if not path.is_file():
            raise ConfigError(f"config file {path} does not exist")
        return path
    for path in candidate_paths():
        if path.is_file():
            return path
    return None


def parse_toml(text: str, source: str) -> dict[str, Any]:
    """``text`` as TOML; :class:`ConfigError` "``source``: reason (at line N, column M)" otherwise — also where
    tomllib says only "at end of document" (a value left unfinished on the last line): that is the file's last line."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        reason = str(exc).replace("(at end of document)",
                                  f"(at line {max(1, len(text.splitlines()))}, the end of the file)")
        raise ConfigError(f"{source}: {reason}") from None


def read_toml_text(path: Path) -> str:
    """The text of the TOML file at ``path``; :class:`ConfigError` naming it for a file that cannot be read or is
    not UTF-8 text."""
    try:
        return Path(path).read_bytes().decode("utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not a TOML file (not UTF-8 text: byte {exc.start} is 0x{exc.object[exc.start]:02x})") \
            from None


def load_toml(path: Path) -> dict[str, Any]:
    return parse_toml(read_toml_text(path), str(path))


def build_default_map(data: Mapping[str, Any], commands: Mapping[str, set[str]], source: str) -> dict[str, dict]:
    """Turn a parsed TOML document into click's default_map for the given commands and their option names."""
    result: dict[str, dict] = {name: {} for name in commands}
    known_everywhere = set().union(*commands.values()) if commands else set()
    for key, value in data.items():
        if isinstance(value, dict) and key in commands:
            continue
        norm = key.replace("-", "_")
        if norm not in known_everywhere:
            raise ConfigError(f"{source}: unknown key {key!r}; known keys: {', '.join(sorted(known_everywhere))}")
        for name, params in commands.items():
            if norm in params:
                result[name][norm] = value
    for name, params in commands.items():
        section = data.get(name)
        if section is None:
            continue
        if not isinstance(section, dict):
            raise ConfigError(f"{source}: [{name}] must be a table")
        for key, value in section.items():
            norm = key.replace("-", "_")
            if norm not in params:
                raise ConfigError(f"{source}: [{name}] unknown key {key!r}; known keys: {', '.join(sorted(params))}")
            result[name][norm] = value
    return result
