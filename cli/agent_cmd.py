"""`trimtab agent`: sample this node's GPUs and host into a store until stopped."""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path
from typing import Optional

import click

from trimtab.cli.options import db_option, env_option, simulate_options
from trimtab.paths import default_db_url, default_spool_dir

log = logging.getLogger("trimtab.agent")


def install_stop_handlers(stop: threading.Event) -> None:
    """SIGINT/SIGTERM stop the loop; the agent then flushes (queued batches written or spooled) and exits 0."""

    def handler(signum, _frame):
        if stop.is_set():
            return
        log.info("%s received: flushing and stopping", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)


def parse_gpu_list(value: Optional[str]) -> Optional[list[int]]:
    if not value:
        return None
    try:
        return [int(x) for x in value.split(",") if x.strip()]
    except ValueError as exc:
        raise click.BadParameter(f"expected GPU indices like 0,1,3 — got {value!r}") from exc


@click.command()
@db_option
@env_option("--interval", type=click.FloatRange(0.05, 3600), default=1.0, show_default=True, metavar="SECONDS",
            help="Sampling period. GPM metrics need ≥ 0.1 s between samples.")
@simulate_options
@env_option("--gpus", default=None, metavar="LIST", help="Only these GPU indices, e.g. 0,1 (default: all).")
@env_option("--hostname", default=None, help="Name of this node in the store (default: the host name; '<host>-sim' when simulated).")
@env_option("--spool-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
            help=f"Where batches wait while the store is unreachable [default: {default_spool_dir()}]")
@env_option("--spool-max-mb", type=click.IntRange(1, 1_000_000), default=256, show_default=True,
            help="Bound of the spool; beyond it the oldest batches are dropped, logged and recorded as a health event.")
@env_option("--status-every", type=click.FloatRange(0.1, 86400), default=10.0, show_default=True, metavar="SECONDS",
            help="Period of the one-line status log.")
@env_option("--duration", type=click.FloatRange(0, None, min_open=True), default=None, metavar="SECONDS",
            help="Stop after this long (default: run until SIGINT/SIGTERM).")
def agent(db_url, interval, simulate, scenario, seed, gpus, hostname, spool_dir, spool_max_mb, status_every, duration):
    """Sample every GPU of this node (NVML + GPM) and the host (psutil) into the store.

    Without an NVIDIA driver use --simulate N for a simulated node, labelled "simulated" in the store and in
    every output. When the store is unreachable, batches are spooled on disk and replayed in order later.
    """
    from trimtab.agent.runner import Agent, SourceUnavailable, make_sources
    from trimtab.agent.sinks import StoreSink

    try:
        sources = make_sources(simulate=simulate, scenario=scenario, seed=seed, gpu_indices=parse_gpu_list(gpus))
    except SourceUnavailable as exc:
        raise click.ClickException(str(exc)) from exc
    except ValueError as exc:
        raise click.ClickException(str(exc)) from exc
    runner = Agent(sources, StoreSink(db_url or default_db_url()), spool_dir or default_spool_dir(),
                   interval_s=interval, hostname=hostname, status_every_s=status_every,
                   spool_max_bytes=spool_max_mb * 1024 * 1024)
    stop = threading.Event()
    install_stop_handlers(stop)
    click.echo(runner.banner(), err=True)
    runner.run(stop, duration_s=duration)
