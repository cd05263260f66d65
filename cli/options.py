"""Options shared by several commands, declared once so their names, env variables and help stay identical."""

from __future__ import annotations

import click

from trimtab.paths import default_db_url


def env_option(*decls: str, **kw):
    """A click option whose value may also come from ``TRIMTAB_<NAME>`` (shown in --help)."""
    name = next(d for d in decls if d.startswith("--"))[2:].replace("-", "_").upper()
    kw.setdefault("envvar", f"TRIMTAB_{name}")
    kw.setdefault("show_envvar", True)
    return click.option(*decls, **kw)


def db_option(f):
    return env_option("--db", "db_url", default=None, metavar="URL",
                      help=f"SQLAlchemy URL of the store, e.g. postgresql+psycopg://user@host/db "
                           f"[default: {default_db_url()}]")(f)


def simulate_options(f):
    from trimtab.agent.simulated import SCENARIOS

    f = env_option("--seed", type=int, default=0, show_default=True, help="Seed of the simulated node (deterministic readings).")(f)
    f = env_option("--scenario", type=click.Choice(sorted(SCENARIOS)), default="balanced", show_default=True,
                   help="What the simulated node shows (seed §4: actor-hot = scenario 1, reward-memory = scenario 2).")(f)
    f = env_option("--simulate", type=click.IntRange(1, 64), default=None, metavar="N",
                   help="Run a simulated node of N GPUs instead of reading NVML (for machines without a driver).")(f)
    return f
