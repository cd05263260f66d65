"""verl, with no change to verl: follow its ``file`` logger's JSONL and post one step report per line.

Run verl with ``trainer.logger=['console','file']``; it writes ``{"step": N, "data": {"timing_s/gen": …}}`` one
line per step, unbuffered, to ``$VERL_FILE_LOGGER_PATH`` (or ``$VERL_FILE_LOGGER_ROOT/<project>/<experiment>.jsonl``)
— see NOTES_VERL.md. Then, on the node where the verl driver runs::

    python -m trimtab.trainer.adapters.verl --job grpo-7b --server http://head:9460 --token $TOKEN \\
        --device-map actor=0,1 --device-map critic=2 path/to/experiment.jsonl

Phases: generation ← gen; evaluation ← reward + ref + values + old_log_prob; update ← update_actor +
update_critic + adv; communication ← update_weights; other = step − the rest. (In verl's V1 trainer ``gen`` is the
time spent *waiting* for a trainable batch; in the legacy trainer it is generation itself.) verl logs no sample
count: it is derived exactly from ``perf/total_num_tokens`` / (``prompt_length/mean`` + ``response_length/mean``)
(each sample's tokens are its prompt plus its response), unless ``samples_per_step`` is given. Knobs are applied
from inside verl by :mod:`trimtab.trainer.adapters.verl_knobs`.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import socket
import threading
from typing import Any, Mapping, Optional

from trimtab.trainer.adapters.follow import FileFollower
from trimtab.trainer.report import StepReport
from trimtab.trainer.reporter import Reporter

log = logging.getLogger("trimtab.trainer")

VERL_PHASES: dict[str, tuple[str, ...]] = {
    "generation": ("gen",),
    "evaluation": ("reward", "ref", "values", "old_log_prob"),
    "update": ("update_actor", "update_critic", "adv"),
    "communication": ("update_weights",),
}


def _number(x: Any) -> Optional[float]:
    ok = isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
    return float(x) if ok else None


def verl_phases(timing_s: Mapping[str, Any]) -> dict[str, float]:
    """verl's timers (names without the ``timing_s/`` prefix, as in ``trainer.timing_raw``) → named phases, s."""
    phases: dict[str, float] = {}
    for phase, timers in VERL_PHASES.items():
        values = [v for v in (_number(timing_s.get(t)) for t in timers) if v is not None]
        if values:
            phases[phase] = sum(values)
    return phases


def record_to_report(record: Mapping[str, Any], *, rank: int = 0, hostname: Optional[str] = None,
                     samples_per_step: Optional[int] = None, n_gpus: Optional[int] = None) -> Optional[StepReport]:
    """One verl JSONL record → a step report, or None for a line that is not a training step (e.g. the
    validation-only line verl writes before training, which has no ``timing_s/step``)."""
    data, step = record.get("data"), record.get("step")
    if not isinstance(data, Mapping) or not isinstance(step, int) or isinstance(step, bool) or step < 0:
        return None
    timing = {k[len("timing_s/"):]: v for k, v in data.items() if isinstance(k, str) and k.startswith("timing_s/")}
    step_time_s = _number(timing.get("step")) or _number(data.get("perf/time_per_step"))
    if step_time_s is None:
        return None
    phases = verl_phases(timing)
    phases["other"] = max(0.0, step_time_s - sum(phases.values()))
    tokens = _number(data.get("perf/total_num_tokens"))
    throughput = _number(data.get("perf/throughput"))  # tokens/s per GPU
    if tokens is None and throughput is not None and n_gpus:
        tokens = throughput * step_time_s * n_gpus
    samples: Optional[float] = samples_per_step
    per_sample = [_number(data.get("prompt_length/mean")), _number(data.get("response_length/mean"))]
    if samples is None and tokens is not None and None not in per_sample and sum(per_sample) > 0:
        samples = tokens / sum(per_sample)
    return StepReport(step=step, rank=rank, step_time_s=step_time_s, phases_s=phases,
                      samples=None if samples is None else round(samples),
                      tokens=None if tokens is None else round(tokens), hostname=hostname)


class VerlTailer:
    """Follows one verl JSONL file and posts a report per new step line through ``reporter`` (None: dry run)."""

    def __init__(self, path: os.PathLike | str, reporter: Optional[Reporter] = None, *,
                 samples_per_step: Optional[int] = None, n_gpus: Optional[int] = None, from_start: bool = True):
        self.follower = FileFollower(path, from_start=from_start)
        self.reporter = reporter
        self._options = {"samples_per_step": samples_per_step, "n_gpus": n_gpus, "hostname": socket.gethostname()}
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
              stop: Optional[threading.Event] = None) -> int:
    """Tails ``path`` and reports to ``server`` until ``stop`` is set (or Ctrl-C); returns 0. The job is
    registered (one rank, the device map, no knobs) only if the server does not know it yet, so a hook inside
    the job keeps its own declaration. The CLI's ``trimtab verl-tail`` calls this."""
    registration = {"name": job, "ranks": 1, "device_map": dict(device_map or {}),
                    "hostnames": [socket.gethostname()], "knobs": {}, "mode": None}
    reporter = Reporter(server, job, token or os.environ.get("TRIMTAB_TOKEN"), registration=registration,
                        register_if_missing=True)
    tailer = VerlTailer(path, reporter, samples_per_step=samples_per_step, n_gpus=n_gpus, from_start=from_start)
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
    parser.add_argument("--server", required=True)
    parser.add_argument("--token", default=None, help="job token (default: $TRIMTAB_TOKEN)")
    parser.add_argument("--device-map", action="append", default=[], metavar="COMPONENT=GPU[,GPU…]")
    parser.add_argument("--samples-per-step", type=int, default=None)
    parser.add_argument("--n-gpus", type=int, default=None, help="for tokens from perf/throughput")
    parser.add_argument("--from-end", action="store_true", help="skip the lines already in the file")
    parser.add_argument("--poll-s", type=float, default=0.5)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    return tail_verl(args.path, args.job, args.server, args.token, device_map=parse_device_map(args.device_map),
                     samples_per_step=args.samples_per_step, n_gpus=args.n_gpus, from_start=not args.from_end,
                     poll_s=args.poll_s)


if __name__ == "__main__":
    raise SystemExit(main())
