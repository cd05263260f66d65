"""Clocks that lie (issue 39, item 4): what is stored and shown when a node's wall clock steps.

A live API (mode server) on loopback over a fresh SQLite store; simulated nodes, each a real Sampler whose wall
clock is the true time plus an offset the bench steps (its monotonic clock is the real one), shipping every tick:

* ``in-time``      — a correct clock (the reference).
* ``back-1h``      — correct, then steps back 1 h halfway (it is then 1 h behind).
* ``fixed-back``   — 1 h ahead, then set right halfway (a step back of 1 h: NTP fixing it).
* ``fwd-1h``       — correct, then steps forward 1 h halfway (it is then 1 h ahead).
* ``ahead-1h``     — 1 h ahead throughout.
* ``behind-1h``    — 1 h behind throughout.
* ``direct-back``  — ``back-1h`` writing the store itself (`agent --db`'s StoreSink; the store's clock, here the
                     machine's as PostgreSQL's would be, stays right); half its batches from before the step are
                     replayed after it, as its spool would after an outage.
* ``old-fixed``    — ``fixed-back`` stamped by the former rule ``max(clock, last + 1 ms)``: the baseline.
* ``old-back``     — ``back-1h`` stamped by the former rule.
* ``ntp-2m``       — 2 min ahead, then set right halfway (a step back of 2 min, inside /v1/gpus' 300 s).
* ``ntp-2m-old``   — the same, its batches without ``sent_ms``: the server cannot tell its skew, so its latest
                     reading follows the stamps alone — the rule the code before followed for every node: the
                     baseline of the /v1/gpus column.
* ``back-1h-old``  — ``back-1h`` without ``sent_ms`` (the same baseline).

During the second half /v1/gpus is read after every tick: "pre-step for" is how long after the step it still
showed a reading the node took before the step (the latest row and the live view held it: its stamp is newer than
the node's readings of now); "at the end" is what it shows then (follows: the node's last reading; null: none in
the last 300 s by its stamp — a node behind is stale; pre-step; other).

Then prints, per node: HTTP batches taken/refused, what the store holds (samples, newest stamp against the true
time), /v1/nodes (skew, clock_off, refused), /v1/balance (listed? stale? note), and /healthz, `check --server`
and the clock events. ``python bench/clock_steps.py [--ticks N] [--interval S]`` (~10 s at the defaults).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import httpx

HOUR_MS = 3_600_000
TWO_MIN_MS = 120_000


class SteppedClock:
    """The true wall clock plus an offset the bench changes (a step), in epoch ms."""

    def __init__(self, offset_ms: int = 0):
        self.offset_ms = offset_ms

    def __call__(self) -> int:
        return time.time_ns() // 1_000_000 + self.offset_ms


def old_rule(clock):
    """The agent's former stamp, ``max(clock, last + 1 ms)``, as a wall clock for the new sampler."""
    last = [0]

    def stamp() -> int:
        last[0] = max(clock(), last[0] + 1)
        return last[0]

    return stamp


def frozen(until_s, at_end, after_s: float) -> str:
    """How long /v1/gpus showed a pre-step reading after the step."""
    if until_s is None:
        return "never"
    return f"the whole {after_s:.1f} s" if at_end == "pre-step" else f"{until_s:.1f} s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ticks", type=int, default=40, help="ticks before and after the step (each)")
    parser.add_argument("--interval", type=float, default=0.2, help="seconds between ticks")
    args = parser.parse_args()

    from click.testing import CliRunner

    from trimtab.agent.sampler import Sampler
    from trimtab.agent.simulated import SimulatedNode
    from trimtab.agent.sinks import HttpSink
    from trimtab.api.app import create_app
    from trimtab.api.auth import ensure_admin_token
    from trimtab.api.context import ApiContext
    from trimtab.cli.main import cli
    from trimtab.contract.sink import BatchRefused
    from trimtab.daemon import ApiServer
    from trimtab.store.engine import shared_engine
    from trimtab.store.migrate import migrate
    from trimtab.store.sink import StoreSink

    class WithoutSentMs(HttpSink):
        """Ships batches without ``sent_ms`` (as agents before it did): the server knows no skew for them."""

        def write(self, batch) -> int:
            return self._post(self.servers[0], batch.to_json())

    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="trimtab-clock-") as tmp:
        url = f"sqlite:///{Path(tmp) / 'trimtab.db'}"
        engine = shared_engine(url)
        migrate(engine)
        admin = ensure_admin_token(engine, Path(tmp)).read_text().strip()
        api = ApiServer(create_app(ApiContext(engine=engine, mode="server", state_dir=Path(tmp))), "127.0.0.1", 0)
        api.start()
        base = f"http://127.0.0.1:{api.port}"
        http = httpx.Client(base_url=base, timeout=30, headers={"Authorization": f"Bearer {admin}"})
        token = http.post("/v1/tokens", json={"name": "agents", "scope": "agent"}).json()["token"]

        plan = {  # node → (offset before, offset after, old rule?, direct?)
            "in-time": (0, 0, False, False), "back-1h": (0, -HOUR_MS, False, False),
            "fixed-back": (HOUR_MS, 0, False, False), "fwd-1h": (0, HOUR_MS, False, False),
            "ahead-1h": (HOUR_MS, HOUR_MS, False, False), "behind-1h": (-HOUR_MS, -HOUR_MS, False, False),
            "direct-back": (0, -HOUR_MS, False, True), "old-fixed": (HOUR_MS, 0, True, False),
            "old-back": (0, -HOUR_MS, True, False), "ntp-2m": (TWO_MIN_MS, 0, False, False),
            "ntp-2m-old": (TWO_MIN_MS, 0, False, False), "back-1h-old": (0, -HOUR_MS, False, False)}
        nodes, counts, held_back = {}, {name: {"taken": 0, "refused": 0, "last": None} for name in plan}, []
        before_step = {name: set() for name in plan}  # the stamps each node took before the step
        shown = {name: {"pre_step_until": None} for name in plan}
        for name, (before, _, old, direct) in plan.items():
            clock = SteppedClock(before)
            sink = (StoreSink(url, clock_ms=clock) if direct else
                    (WithoutSentMs if name.endswith("-old") and not old else HttpSink)(base, token, clock_ms=clock))
            sampler = Sampler([SimulatedNode(2, seed=len(nodes), hostname=name)], lambda b: None, hostname=name,
                              clock_ms=old_rule(clock) if old else clock)
            nodes[name] = (clock, sink, sampler)

        def ship(name, batch, half) -> None:
            try:
                nodes[name][1].write(batch)
                counts[name]["taken"] += 1
                counts[name]["last_taken"] = batch.gpu_samples[0].ts_ms
            except BatchRefused:
                counts[name]["refused"] += 1
            counts[name]["last"] = batch.gpu_samples[0].ts_ms
            if not half:
                before_step[name].update(s.ts_ms for s in batch.gpu_samples)

        def gpus_shown() -> dict[str, str]:
            """What /v1/gpus shows of each node: pre-step, follows, null or other (its GPU 0)."""
            out = {}
            for g in http.get("/v1/gpus").json()["gpus"]:
                name = g["hostname"]
                if g["index"] != 0 or name not in plan:
                    continue
                ts = None if g["latest"] is None else g["latest"]["ts_ms"]
                out[name] = ("null" if ts is None else "pre-step" if ts in before_step[name] else
                             "follows" if ts == counts[name].get("last_taken") else "other")
            return out

        stepped_at = None
        for half in (0, 1):
            if half:
                for name, (clock, _, _) in nodes.items():
                    clock.offset_ms = plan[name][1]
                stepped_at = time.monotonic()
                for batch in held_back:  # the direct node's pre-step batches, replayed after the step
                    ship("direct-back", batch, half)
            for _ in range(args.ticks):
                for name, (_, _, sampler) in nodes.items():
                    batch = sampler.tick()
                    if name == "direct-back" and not half and len(held_back) < args.ticks // 2:
                        held_back.append(batch)  # as if spooled during an outage
                    else:
                        ship(name, batch, half)
                if half:
                    seen = gpus_shown()
                    for name, what in seen.items():
                        if what == "pre-step":
                            shown[name]["pre_step_until"] = time.monotonic() - stepped_at
                time.sleep(args.interval)
        after_s = time.monotonic() - stepped_at
        at_end = gpus_shown()

        true_now = time.time_ns() // 1_000_000
        window_s = max(10.0, 3 * args.ticks * args.interval)
        listed = {n["hostname"]: n for n in http.get("/v1/nodes").json()["nodes"]}
        balance = http.get("/v1/balance", params={"window_s": window_s}).json()
        rows = {r["hostname"]: r for r in balance["reports"]}
        from sqlalchemy import text

        with engine.connect() as conn:
            stored = {r[0]: (r[1], r[2]) for r in conn.execute(text(
                "SELECT n.hostname, count(*), max(s.ts_ms) FROM gpu_samples s JOIN gpus g ON g.id = s.gpu_id "
                "JOIN nodes n ON n.id = g.node_id GROUP BY n.hostname"))}
        print(f"true time {true_now}; {args.ticks} ticks before and after the step, every {args.interval} s "
              f"({after_s:.1f} s after it); 2 GPUs a node; /v1/balance and check over the last {window_s:g} s. "
              f"Stamps are against the true time (the server's clock); skew = server's clock - node's\n")
        head = (f"{'node':<12} {'taken/refused':>13} {'GPU rows':>8} {'last stamp':>10} {'newest row':>10}  "
                f"{'/v1/nodes skew':>14} {'off':>5} {'refused':>7}  {'/v1/gpus: pre-step for':>22} "
                f"{'at the end':>10}  /v1/balance")
        print(head)
        print("-" * len(head))
        for name in plan:
            c, (n_rows, newest) = counts[name], stored.get(name, (0, None))
            last = c["last"]  # the stamp of the node's last batch, taken or refused
            node = listed.get(name)
            row = rows.get(name)
            shown_row = ("absent" if row is None else ("STALE" if row["stale"] else row["status"])
                     + (f" ({row['clock_note'][:60]}…)" if row and row.get("clock_note") else ""))
            print(f"{name:<12} {c['taken']:>6}/{c['refused']:<6} {n_rows:>8} "
                  f"{f'{(last - true_now) / 1000:+.0f} s':>10} "
                  f"{'-' if newest is None else f'{(newest - true_now) / 1000:+.0f} s':>10}  "
                  f"{'absent' if node is None else str(node['clock_skew_s']) + ' s':>14} "
                  f"{'-' if node is None else str(node['clock_off']):>5} "
                  f"{'-' if node is None or node['clock_refused_ms'] is None else 'yes':>7}  "
                  f"{frozen(shown[name]['pre_step_until'], at_end.get(name), after_s):>22} "
                  f"{at_end.get(name, 'absent'):>10}  {shown_row}")
        health = http.get("/healthz")
        print(f"\n/healthz: HTTP {health.status_code}, status {health.json()['status']}")
        for line in health.json()["clocks"]:
            print(f"  {line}")
        events = http.get("/v1/events", params={"limit": 100}).json()["events"]
        print("\nevents (clock_step from the agents, clock_skew from the receivers):")
        for e in sorted((e for e in events if e["kind"].startswith("clock_")), key=lambda e: e["hostname"]):
            print(f"  {e['hostname']:<12} {e['kind']:<10} {e['detail'][:150]}")
        res = CliRunner().invoke(cli, ["check", "--server", base, "--window", str(window_s), "--json"])
        verdicts = {n["hostname"]: ("STALE" if n["stale"] else n["status"]) for n in json.loads(res.stdout)["nodes"]}
        print(f"\ntrimtab check --server: exit {res.exit_code}; nodes {verdicts}")
        for line in res.stderr.strip().splitlines():
            print(f"  {line[:200]}")
        http.close()
        api.stop()
        for _, sink, _ in nodes.values():
            sink.close()
    print(f"\n({time.monotonic() - started:.1f} s)")


if __name__ == "__main__":
    main()
