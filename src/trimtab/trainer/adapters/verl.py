"""verl, with no change to verl: follow its ``file`` logger's JSONL and post one step report per line.

Run verl with ``trainer.logger=['console','file']``; it writes ``{"step": N, "data": {"timing_s/gen": …}}`` one
line per step, unbuffered, to ``$VERL_FILE_LOGGER_PATH`` (or ``$VERL_FILE_LOGGER_ROOT/<project>/<experiment>.jsonl``).
Then, on the node where the verl driver runs::

    python -m trimtab.trainer.adapters.verl --job grpo-7b --server http://head:9460 --token-file job.token \\
        --device-map actor=0,1 --device-map critic=2 path/to/experiment.jsonl

The mapping of verl's timers to phases (validation and checkpointing as their own phases, V1's wait for rollout as a
wait, the step time including validation) is :mod:`~trimtab.trainer.adapters.verl_metrics`, shared with the
in-process plugin (:mod:`~trimtab.trainer.adapters.verl_plugin`, which also applies knobs). verl logs no sample
count: it is derived exactly from ``perf/total_num_tokens`` / (``prompt_length/mean`` + ``response_length/mean``),
unless ``samples_per_step`` is given.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import threading
from typing import Any, Mapping, Optional

from trimtab.trainer.adapters.follow import FileFollower
from trimtab.trainer.adapters.learning_names import LearningNames
from trimtab.trainer.adapters.verl_metrics import TRAINERS, V1, verl_step
from trimtab.trainer.server_link import Reporter
from trimtab.trainer.step_record import StepReport

log = logging.getLogger("trimtab.trainer")

def record_to_report(record: Mapping[str, Any], *, rank: int = 0, hostname: Optional[str] = None,
                     samples_per_step: Optional[int] = None, n_gpus: Optional[int] = None,
                     trainer: str = V1, names: Optional[LearningNames] = None) -> Optional[StepReport]:
    """One verl JSONL record → a step report (see :mod:`~trimtab.trainer.adapters.verl_metrics`), or None for a
    line that is not a training step. ``names``: the run's learning-signal mapper (one per file followed)."""
    step = verl_step(record.get("step"), record.get("data"), trainer=trainer, samples_per_step=samples_per_step,
                     n_gpus=n_gpus, names=names)
    return None if step is None else step_to_report(step, rank=rank, hostname=hostname)


def step_to_report(step, *, rank: int, hostname: Optional[str] = None, pid: Optional[int] = None) -> StepReport:
    """One verl step (:class:`~trimtab.trainer.adapters.verl_metrics.VerlStep`) as a step report; its phases as
    verl timed them ("other" included: no hook timer adds it)."""
    slowest, mean = step.rollout_s or (None, None)
    return StepReport(step=step.step, rank=rank, step_time_s=step.step_time_s, phases_s=dict(step.phases_s),
                      samples=step.samples, tokens=step.tokens, hostname=hostname, pid=pid, memory=step.memory,
                      rollout_slowest_s=slowest, rollout_mean_s=mean, queue_high_water=step.queue_high_water,
                      learning=step.learning)


class VerlTailer:
    """Follows one verl JSONL file and posts a report per new step line through ``reporter`` (None: dry run)."""

    def __init__(self, path: os.PathLike | str, reporter: Optional[Reporter] = None, *,
                 samples_per_step: Optional[int] = None, n_gpus: Optional[int] = None, from_start: bool = True,
                 trainer: str = V1):
        self.follower = FileFollower(path, from_start=from_start)
        self.reporter = reporter
        self._options = {"samples_per_step": samples_per_step, "n_gpus": n_gpus, "hostname": socket.gethostname(),
                         "trainer": trainer, "names": LearningNames("verl")}
        self.bad_lines = 0

    def poll(self) -> list[StepReport]:
        """Reports for the step lines written since the last call (already handed to the reporter)."""
        reports = []
        for line in self.follower.poll():
            try:
                record = json.loads(line)
            except ValueError:
                self.bad_lines += 1
                log.warning("trimtab: %s: skipped a line that is not JSON: %.120s", self.follower.path, line)
                continue
            report = record_to_report(record, **self._options) if isinstance(record, dict) else None
            if report is not None:
                reports.append(report)
                if self.reporter is not None:
                    self.reporter.submit(report.to_wire())
        return reports

    def run(self, stop: threading.Event, poll_s: float = 0.5) -> None:
        while not stop.is_set():
            self.poll()
            stop.wait(poll_s)
        self.poll()


def tail_verl(path: os.PathLike | str, job: str, server: str, token: Optional[str] = None, *,
              device_map: Optional[Mapping[str, list[int]]] = None, samples_per_step: Optional[int] = None,
              n_gpus: Optional[int] = None, from_start: bool = True, poll_s: float = 0.5,
              stop: Optional[threading.Event] = None, trainer: str = V1) -> int:
    """Tails ``path`` and reports to ``server`` until ``stop`` is set (or Ctrl-C); returns 0. The job is
    registered (one rank, the device map, no knobs) only if the server does not know it yet, so a hook inside
    the job keeps its own declaration. The CLI's ``trimtab verl-tail`` calls this."""
    registration = {"name": job, "ranks": 1, "device_map": dict(device_map or {}),
                    "hostnames": [socket.gethostname()], "knobs": {}, "mode": None}
    reporter = Reporter(server, job, token or os.environ.get("TRIMTAB_TOKEN"), registration=registration,
                        register_if_missing=True)
    tailer = VerlTailer(path, reporter, samples_per_step=samples_per_step, n_gpus=n_gpus, from_start=from_start,
                        trainer=trainer)
    stop = stop or threading.Event()
    try:
        tailer.run(stop, poll_s)
    except KeyboardInterrupt:
        pass
    finally:
        tailer.follower.close()
        reporter.close()
    return 0


def parse_device_map(items: list[str]) -> dict[str, list[int]]:
    """``["actor=0,1", "critic=2"]`` → ``{"actor": [0, 1], "critic": [2]}``."""
    out: dict[str, list[int]] = {}
    for item in items:
        component, _, gpus = item.partition("=")
        if not component or not gpus:
            raise ValueError(f"--device-map wants COMPONENT=GPU[,GPU…], got {item!r}")
        out[component] = [int(g) for g in gpus.split(",")]
    return out


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="trimtab verl-tail", description=__doc__.split("\n\n")[0])
    parser.add_argument("path", help="verl's file-logger JSONL ($VERL_FILE_LOGGER_PATH)")
    parser.add_argument("--job", required=True)
    parser.add_argument("--server", required=True,
                        help="the trimtab server's URL; several separated by commas fail over in that order")
    parser.add_argument("--token", default=None, help="job token (default: $TRIMTAB_TOKEN)")
    parser.add_argument("--token-file", default=None,
                        help="read the job token from this file, one line (default: $TRIMTAB_TOKEN_FILE)")
    parser.add_argument("--device-map", action="append", default=[], metavar="COMPONENT=GPU[,GPU…]")
    parser.add_argument("--samples-per-step", type=int, default=None)
    parser.add_argument("--n-gpus", type=int, default=None, help="for tokens from perf/throughput")
    parser.add_argument("--from-end", action="store_true", help="skip the lines already in the file")
    parser.add_argument("--poll-s", type=float, default=0.5)
    parser.add_argument("--trainer", choices=TRAINERS, default=V1,
                        help="which verl fit loop writes the file: v1 (verl's default, trainer.use_v1=true; "
                             "timing_s/gen is the wait for rollout), legacy (timing_s/gen is generation), "
                             "fully_async (the FullyAsyncTrainer's log: one line per parameter version) or "
                             "one_step_off")
    args = parser.parse_args(argv)
    from trimtab.paths import EXIT_MISCONFIGURED, BadToken, token_from

    try:
        token = token_from(args.token or os.environ.get("TRIMTAB_TOKEN"),
                           args.token_file or os.environ.get("TRIMTAB_TOKEN_FILE"))
    except BadToken as exc:  # waiting cannot fix it: one line and exit 78, as `trimtab agent` does
        parser.exit(EXIT_MISCONFIGURED, f"{parser.prog}: error: {exc}\n")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    return tail_verl(args.path, args.job, args.server, token, device_map=parse_device_map(args.device_map),
                     samples_per_step=args.samples_per_step, n_gpus=args.n_gpus, from_start=not args.from_end,
                     poll_s=args.poll_s, trainer=args.trainer)


if __name__ == "__main__":
    raise SystemExit(main())
