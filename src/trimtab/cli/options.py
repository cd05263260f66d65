"""Options shared by several commands, declared once so their names, env variables and help stay identical."""

from __future__ import annotations

from pathlib import Path

import click

from trimtab.paths import state_dir


def env_option(*decls: str, **kw):
    """A click option whose value may also come from ``TRIMTAB_<NAME>`` (shown in --help)."""
    name = next(d for d in decls if d.startswith("--"))[2:].replace("-", "_").upper()
    kw.setdefault("envvar", f"TRIMTAB_{name}")
    kw.setdefault("show_envvar", True)
    return click.option(*decls, **kw)


def misconfigured(message: str) -> click.ClickException:
    """An error that waiting cannot fix: one line, and exit 78 (EX_CONFIG), so systemd does not restart the unit
    in a loop (``RestartPreventExitStatus=78``)."""
    from trimtab.paths import EXIT_MISCONFIGURED

    error = click.ClickException(message)
    error.exit_code = EXIT_MISCONFIGURED
    return error


def configured_rules(rules_file):
    """The rules the daemon grades jobs by: the shipped file, ``--rules-file``, then trimtab.toml's ``[controller]``
    and ``[rules.<name>]`` tables — one reading for ``serve``/``up`` and ``check``, so the two grade alike. Raises
    :class:`trimtab.grading.rules_parse.RulesError`; each command says it its own way."""
    from trimtab.grading.rules import load_rules

    obj = click.get_current_context().find_root().obj or {}
    return load_rules(rules_file, obj.get("rules_overrides"),
                      overrides_source=str(obj.get("config_path") or "trimtab.toml"))


def checked_token(token, token_file, what: str = "--token (or TRIMTAB_TOKEN)"):
    """``token_from`` for a command: a token that cannot be one stops it with :func:`misconfigured`."""
    from trimtab.paths import BadToken, token_from

    try:
        return token_from(token, token_file, what)
    except BadToken as exc:
        raise misconfigured(str(exc)) from None


def _use_state_dir(_ctx, _param, value):
    from trimtab.paths import use_state_dir

    if value is not None:
        use_state_dir(value)


def _resolve_db(_ctx, _param, value):
    """``postgres://…`` and ``postgresql://…`` name no driver trimtab has: use psycopg 3, and say so."""
    from trimtab.store.engine import resolve_url
    from trimtab.store.errors import mask_url

    if value is None or resolve_url(value) == value:
        return value
    resolved = resolve_url(value)
    click.echo(f"trimtab: --db {mask_url(value)} read as {mask_url(resolved)} (the psycopg driver trimtab installs)",
               err=True)
    return resolved


def db_option(f):
    """``--db`` and, with it, ``--state-dir``: every command that can use the default store knows where it is."""
    f = env_option("--db", "db_url", default=None, metavar="URL", callback=_resolve_db,
                   help="SQLAlchemy URL of the store, e.g. postgresql+psycopg://user@host/db (postgres:// and "
                        "postgresql:// mean that too) [default: sqlite:///<state dir>/trimtab.db]")(f)
    return env_option("--state-dir", type=click.Path(file_okay=False, path_type=Path), default=None, metavar="DIR",
                      is_eager=True, expose_value=False, callback=_use_state_dir,
                      help="The one directory for the admin token, the spool and the default SQLite store "
                           "(created 0700) [default: $STATE_DIRECTORY under systemd, else ~/.local/share/trimtab; "
                           f"now {state_dir()}]")(f)


def simulate_options(f):
    from trimtab.agent.simulated import SCENARIOS

    f = env_option("--seed", type=int, default=0, show_default=True, help="Seed of the simulated node (deterministic readings).")(f)
    f = env_option("--scenario", type=click.Choice(sorted(SCENARIOS)), default="balanced", show_default=True,
                   help="What the simulated node shows: balanced; actor-hot (actor GPUs busy, critic idle); reward-memory (the "
                        "reward GPU's memory full); pcie-saturated (the reward GPU's PCIe link above 90 %).")(f)
    f = env_option("--simulate", type=click.IntRange(1, 64), default=None, metavar="N",
                   help="Run a simulated node of N GPUs instead of reading NVML (for machines without a driver).")(f)
    return f


def interval_option(f):
    return env_option("--interval", type=click.FloatRange(0.05, 3600), default=1.0, show_default=True, metavar="SECONDS",
                      help="Sampling period. GPM metrics need ≥ 0.1 s between samples.")(f)


def agent_options(f):
    """Options of every command that runs a local agent (agent, up)."""
    from trimtab.paths import default_spool_dir

    f = env_option("--duration", type=click.FloatRange(0, None, min_open=True), default=None, metavar="SECONDS",
                   help="Stop after this long (default: run until SIGINT/SIGTERM).")(f)
    f = env_option("--status-every", type=click.FloatRange(0.1, 86400), default=10.0, show_default=True, metavar="SECONDS",
                   help="Period of the one-line status log.")(f)
    f = env_option("--spool-max-mb", type=click.IntRange(1, 1_000_000), default=256, show_default=True,
                   help="Bound of the spool; beyond it the oldest batches are dropped, logged and recorded as a health event.")(f)
    f = env_option("--spool-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
                   help=f"Where batches wait while the store is unreachable [default: <state dir>/spool, now "
                        f"{default_spool_dir()}]")(f)
    f = env_option("--hostname", default=None,
                   help="Name of this node in the store (default: the host name; '<host>-sim' when simulated).")(f)
    f = env_option("--gpus", default=None, metavar="LIST", help="Only these GPU indices, e.g. 0,1 (default: all).")(f)
    return f
