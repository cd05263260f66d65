"""`trimtab agent`: sample this node's GPUs and host into a store until stopped."""

from __future__ import annotations

import logging
import signal
import sys
import threading
from pathlib import Path
from typing import Optional

import click

from trimtab.cli.options import (agent_options, checked_token, db_option, env_option, interval_option,
                                  misconfigured, simulate_options)
from trimtab.paths import default_db_url, default_spool_dir  # noqa: F401 (documented defaults)

log = logging.getLogger("trimtab.agent")


def install_stop_handlers(stop: threading.Event, on_stop=None) -> None:
    """SIGINT/SIGTERM stop the loop; the agent then flushes (queued batches written or spooled) and exits 0."""

    def handler(signum, _frame):
        if stop.is_set():
            return
        log.info("%s received: flushing and stopping", signal.Signals(signum).name)
        if on_stop is not None:
            on_stop()
        stop.set()

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)


class UrlListOption(click.Option):
    """A repeatable option whose value may also be one string (trimtab.toml's ``server = "http://a, http://b"``):
    click would take a string given to a repeatable option for a list of its characters."""

    def type_cast_value(self, ctx, value):
        return super().type_cast_value(ctx, [value] if isinstance(value, str) else value)


def parse_gpu_list(value: Optional[str]) -> Optional[list[int]]:
    if not value:
        return None
    try:
        return [int(x) for x in value.split(",") if x.strip()]
    except ValueError as exc:
        raise click.BadParameter(f"expected GPU indices like 0,1,3 — got {value!r}") from exc


@click.command()
@db_option
@env_option("--server", "server_url", cls=UrlListOption, multiple=True, metavar="URL[,URL…]",
            help="Ship batches to a `trimtab server` at URL (e.g. http://head:9460) instead of writing a store. "
                 "Several servers (comma-separated or the flag repeated; the env var and config key alike): a batch "
                 "the first cannot take goes to the next, and shipping returns to the first once it answers.")
@env_option("--token", default=None, help="Bearer token of scope 'agent' for --server.")
@env_option("--token-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
            help="Read the --server token from this file (one line: the secret `trimtab token create` printed).")
@interval_option
@simulate_options
@agent_options
def agent(db_url, server_url, token, token_file, interval, simulate, scenario, seed, gpus, hostname, spool_dir,
          spool_max_mb, status_every, duration):
    """Sample every GPU of this node (NVML + GPM) and the host (psutil) into the store.

    Without an NVIDIA driver use --simulate N for a simulated node, labelled "simulated" in the store and in
    every output. When the store (or the server) is unreachable, batches are spooled on disk and replayed in
    order later. With --server the agent ships to a head node over HTTP instead of writing a store itself.
    """
    from trimtab.agent.runner import Agent, SourceUnavailable, make_sources
    from trimtab.contract.servers import server_urls

    try:
        server_url = server_urls(server_url)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--server") from exc
    if server_url and db_url:
        raise click.UsageError("give --db (write a store) or --server (ship to a server), not both")
    token = checked_token(token, token_file)
    if server_url and not token:
        raise click.UsageError("--server needs a token of scope 'agent' (--token, --token-file or TRIMTAB_TOKEN)")

    try:
        sources = make_sources(simulate=simulate, scenario=scenario, seed=seed, gpu_indices=parse_gpu_list(gpus),
                               hostname=hostname)
    except SourceUnavailable as exc:
        raise click.ClickException(str(exc)) from exc
    except ValueError as exc:
        raise click.ClickException(str(exc)) from exc
    sink = _sink(db_url=db_url or default_db_url(), server_url=server_url, token=token)
    if not server_url:
        _open_store_now(sink)
    runner = Agent(sources, sink, spool_dir or default_spool_dir(),
                   interval_s=interval, hostname=hostname, status_every_s=status_every,
                   spool_max_bytes=spool_max_mb * 1024 * 1024)
    from trimtab.daemon import StatusPinger
    from trimtab.sdnotify import Notifier

    notifier = Notifier()  # systemd Type=notify: READY, watchdog pings from the sampling loop, STOPPING
    stop = threading.Event()
    install_stop_handlers(stop, on_stop=notifier.stopping)
    click.echo(runner.banner(), err=True)
    notifier.ready(f"agent: {len(runner.sampler.gpus)} GPUs into {sink.description}")
    try:
        runner.run(stop, duration_s=duration,
                   on_tick=StatusPinger(notifier, runner.status_line, every_s=status_every, log_it=False))
        report_failure(runner, notifier)
    finally:
        notifier.stopping()
    exit_if_failed(runner)


def _sink(db_url: str, server_url: list[str], token: Optional[str]):
    """Where the agent's batches go: `--server URL[,URL…]` ships them over HTTP, else `--db URL` writes the store."""
    if server_url:
        from trimtab.agent.sinks import HttpSink

        return HttpSink(server_url, token)
    from trimtab.store.sink import StoreSink

    return StoreSink(db_url)


def _open_store_now(sink) -> None:
    """A store this agent can never write (a damaged SQLite file) is a configuration error: one line, exit 78,
    before anything is sampled or spooled, as `up` and `server` do."""
    from trimtab.contract.sink import SinkMisconfigured

    try:
        sink.open_now()
    except SinkMisconfigured as exc:
        raise misconfigured(str(exc)) from None


def report_failure(runner, notifier) -> None:
    """Before STOPPING: systemd's STATUS says why a refused configuration stopped the agent."""
    if runner.failed is not None:
        notifier.status(f"failed: {runner.failed}")


def exit_if_failed(runner) -> None:
    """A store or server that refuses this configuration ends the process: say so and exit EXIT_MISCONFIGURED,
    which the units do not restart on (restarting cannot fix a configuration)."""
    from trimtab.paths import EXIT_MISCONFIGURED

    if runner.failed is None:
        return
    click.echo(f"trimtab: stopped (exit {EXIT_MISCONFIGURED}): fix the configuration as said above; what was sampled "
               f"is kept in {runner.spool.directory} and sent once trimtab runs with the corrected one.", err=True)
    sys.exit(EXIT_MISCONFIGURED)
