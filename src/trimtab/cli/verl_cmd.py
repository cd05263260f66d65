"""`trimtab verl-tail`: follow a verl job's file-logger JSONL and post its steps as trimtab step reports.

A thin door to ``trimtab.trainer.adapters.verl``, which needs httpx only (no torch: tailing a file trains
nothing); the arguments are that module's, passed through unchanged.
"""

from __future__ import annotations

import sys

import click


@click.command("verl-tail", context_settings={"ignore_unknown_options": True, "allow_extra_args": True,
                                              "help_option_names": []})
@click.pass_context
def verl_tail(ctx: click.Context) -> None:
    """Tail verl's `trainer.logger=['console','file']` JSONL and report each step to a trimtab server, with no
    change to verl. Usage: trimtab verl-tail PATH --job NAME --server URL [--token-file FILE | --token T]
    [--trainer v1|legacy|fully_async|one_step_off] [--device-map actor=0,1 …]
    (--help shows all options)."""
    try:
        from trimtab.trainer.adapters.verl import main
    except ImportError as exc:
        raise click.ClickException(f"verl-tail cannot load its tailer (a broken install?): {exc}") from exc
    sys.exit(main(list(ctx.args)))
