"""The `trimtab` command: a click group whose subcommands live one per module.

Every option can also come from a ``TRIMTAB_<OPTION>`` environment variable or from ``trimtab.toml``
(see ``trimtab.config``); flags win over the environment, which wins over the file.
"""

from __future__ import annotations

import logging
import sys

import click

from trimtab import __version__
from trimtab.config import ConfigError, build_default_map, find_config_file, load_toml


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.option("--config", "config_path", type=click.Path(dir_okay=False), envvar="TRIMTAB_CONFIG", show_envvar=True,
              help="trimtab.toml to read (default: ./trimtab.toml, ~/.config/trimtab/trimtab.toml, /etc/trimtab/trimtab.toml).")
@click.option("--log-level", default="info", envvar="TRIMTAB_LOG_LEVEL", show_envvar=True, show_default=True,
              type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False))
@click.version_option(__version__, prog_name="trimtab")
@click.pass_context
def cli(ctx: click.Context, config_path: str | None, log_level: str) -> None:
    """trimtab keeps multi-GPU RL post-training jobs balanced.

    `trimtab up` runs this node's daemon (agent + REST API + /metrics, SQLite). A cluster runs `trimtab server`
    on a head node and `trimtab agent --server URL` on every GPU node (or agents writing PostgreSQL directly).
    `trimtab check` grades a node's balance (and each job's step composition) against the thresholds of rules.toml and
    exits 0 / 1 / 2. `trimtab demo` shows the rebalancer fixing a badly configured job on this CPU.
    """
    logging.basicConfig(level=log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s", datefmt="%H:%M:%S")
    if log_level.lower() != "debug":
        logging.getLogger("alembic").setLevel(logging.WARNING)  # its per-start plugin chatter says nothing useful
        logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per request drowns what matters
    try:
        path = find_config_file(config_path)
        ctx.obj = {"rules_overrides": None, "config_path": path}
        if path is not None:
            params = {name: {p.name for p in cmd.params if p.name} for name, cmd in cli.commands.items()}
            data = load_toml(path)
            # [controller] and [rules.<name>] override the rules file (trimtab.grading.rules), not options.
            overrides = {k: data.pop(k) for k in ("controller", "rules") if k in data}
            ctx.obj["rules_overrides"] = overrides or None
            ctx.default_map = build_default_map(data, params, str(path))
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from exc


def _register() -> None:
    from trimtab.cli import agent_cmd, check_cmd, demo_cmd, serve_cmd, systemd_cmd, token_cmd, verl_cmd

    cli.add_command(agent_cmd.agent)
    cli.add_command(check_cmd.check)
    cli.add_command(demo_cmd.demo)
    cli.add_command(serve_cmd.up)
    cli.add_command(serve_cmd.server)
    cli.add_command(systemd_cmd.install_systemd)
    cli.add_command(token_cmd.token)
    cli.add_command(verl_cmd.verl_tail)


_register()


def main() -> None:
    cli(prog_name="trimtab")


if __name__ == "__main__":
    main()
