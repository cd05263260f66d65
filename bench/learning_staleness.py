"""A job that really learns, under the rebalancer: is a staleness raise kept only when learning keeps up (issue 41)?

The job is a small policy-gradient learner (a softmax policy over 8 actions in 4 contexts, one action right per
context, trained with PPO's clipped objective on importance ratios against the policy that generated each sample) —
its reward, clip fraction, KL and effective sample size come from its own maths, not a script. Generation and
training take simulated seconds (0.6 s and 0.4 s a step); with ``prefetch`` ≥ 1 generation runs ahead beside
training (the step is the longer of the two), so the knob buys samples/s — and each sample comes from a policy
``prefetch`` updates old. It reports every step to a live API (real store, real Rebalancer in ``auto``) with
``learning={reward, clip_fraction, kl, eff_sample_size}``; its generation share (60 %) makes the
generation-bound rule raise prefetch 0 → 2.

Two twins, the same but for the learning rate:

* **stale-hurts** (learning rate 6): the policy moves far in one update, so samples 2 updates old are far
  off-policy — most of their ratios leave PPO's clip range and teach nothing: learning per second falls although
  samples/s rises. The raise must be rolled back, citing a learning signal.
* **stale-harmless** (learning rate 0.4): the policy moves little per update; 2-update-old samples are nearly
  on-policy, and the raise's extra samples/s is extra learning. The raise must be kept.

Per twin over the seeds: the raise's outcome and the signal named, and the reward per simulated second of the
rebalanced run against each static setting (0 and 2), measured on the same seed over the same simulated time: the
mean reward over that time (the area under the reward curve, per second — a run that learns faster sooner reads
higher).

    python3 bench/learning_staleness.py [--seeds 1-10] [--budget-s 100] [--without-learning [--throughput-alone]]

``--without-learning``: the same jobs report no learning signal; under the shipped rules (``[learning]
without_signals = "advise"``) the raise is then advice, not made, in both twins (its reason says no learning signal
is reported). ``--throughput-alone`` adds the job's rules override ``without_signals = "throughput"``: the baseline
judged on samples/s alone, the raise kept in both twins.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository's bench/
from bench.live_api import _seeds, local_api  # noqa: E402

CONTEXTS, ACTIONS, BATCH = 4, 8, 64
GEN_S, TRAIN_S, OVERLAP_S = 0.6, 0.4, 0.02
CLIP = 0.2
TWINS = {"stale-hurts": 6.0, "stale-harmless": 0.4}


def _softmax(row: list[float]) -> list[float]:
    m = max(row)
    e = [math.exp(x - m) for x in row]
    s = sum(e)
    return [x / s for x in e]


@dataclass
class Learner:
    """The policy (a logit table), its history of versions (what a stale generator sampled from) and the task."""

    lr: float
    rng: random.Random
    logits: list = field(default_factory=lambda: [[0.0] * ACTIONS for _ in range(CONTEXTS)])
    versions: list = field(default_factory=list)

    def __post_init__(self):
        self.target = [self.rng.randrange(ACTIONS) for _ in range(CONTEXTS)]
        self.versions.append([row[:] for row in self.logits])

    def generate(self, staleness: int) -> list[tuple[int, int, float, float]]:
        """A batch from the policy ``staleness`` updates old: (context, action, reward, its log-probability)."""
        old = self.versions[max(0, len(self.versions) - 1 - staleness)]
        out = []
        for _ in range(BATCH):
            c = self.rng.randrange(CONTEXTS)
            p = _softmax(old[c])
            a = self.rng.choices(range(ACTIONS), weights=p)[0]
            r = 1.0 if a == self.target[c] else 0.0
            out.append((c, a, r, math.log(p[a])))
        return out

    def train(self, batch) -> dict[str, float]:
        """One PPO-clip gradient step; the step's learning signals from its own ratios."""
        baseline = statistics.fmean(r for _, _, r, _ in batch)
        grad = [[0.0] * ACTIONS for _ in range(CONTEXTS)]
        clipped = kl = 0.0
        ratios = []
        for c, a, r, logp_b in batch:
            p = _softmax(self.logits[c])
            ratio = math.exp(math.log(p[a]) - logp_b)
            ratios.append(ratio)
            kl += logp_b - math.log(p[a])
            adv = r - baseline
            if (adv > 0 and ratio > 1 + CLIP) or (adv < 0 and ratio < 1 - CLIP):
                clipped += 1
                continue
            for k in range(ACTIONS):
                grad[c][k] += ratio * adv * ((1.0 if k == a else 0.0) - p[k]) / len(batch)
        for c in range(CONTEXTS):
            for k in range(ACTIONS):
                self.logits[c][k] += self.lr * grad[c][k]
        self.versions.append([row[:] for row in self.logits])
        del self.versions[:-8]
        mean_w = statistics.fmean(ratios)
        ess = mean_w ** 2 / statistics.fmean(w * w for w in ratios)
        return {"reward": baseline, "clip_fraction": clipped / len(batch), "kl": kl / len(batch),
                "eff_sample_size": ess}


def step_time_s(prefetch: int, rng: random.Random) -> float:
    noise = 1 + rng.uniform(-0.03, 0.03)
    return (GEN_S + TRAIN_S if prefetch == 0 else max(GEN_S, TRAIN_S) + OVERLAP_S) * noise


def run_static(lr: float, seed: int, prefetch: int, budget_s: float) -> list[tuple[float, float]]:
    """(simulated seconds, reward) per step at a fixed prefetch, for ``budget_s`` simulated seconds."""
    rng = random.Random(seed)
    learner = Learner(lr, random.Random(seed * 7919))
    out, spent = [], 0.0
    while spent < budget_s:
        signals = learner.train(learner.generate(prefetch))
        out.append((step_time_s(prefetch, rng), signals["reward"]))
        spent += out[-1][0]
    return out


def reward_per_s(curve: list[tuple[float, float]]) -> float:
    """The mean reward over the run's simulated time: the area under its reward curve per second."""
    return sum(t * r for t, r in curve) / sum(t for t, _ in curve)


def run_auto(http, token: str, lr: float, seed: int, budget_s: float, job: str, report_learning: bool = True,
             throughput_alone: bool = False) -> dict:
    auth = {"Authorization": f"Bearer {token}"}
    knobs = {"prefetch": {"value": 0, "min": 0, "max": 2}}
    rules = {"rules": {"learning": {"without_signals": "throughput"}}} if throughput_alone else {}
    r = http.post("/v1/jobs", json={"name": job, "ranks": 1, "device_map": {}, "hostnames": ["cpu"],
                                    "knobs": knobs, "mode": "auto", **rules}, headers=auth)
    assert r.status_code == 201, r.text
    rng = random.Random(seed)
    learner = Learner(lr, random.Random(seed * 7919))
    prefetch, curve, i = 0, [], 0
    while sum(t for t, _ in curve) < budget_s:
        signals = learner.train(learner.generate(prefetch))
        t = step_time_s(prefetch, rng)
        curve.append((t, signals["reward"]))
        gen = GEN_S / (GEN_S + TRAIN_S) * t if prefetch == 0 else t - TRAIN_S
        body = {"step": i, "rank": 0, "step_time_s": t, "samples": BATCH, "knobs": {"prefetch": prefetch},
                "phases": {"generation": gen, "update": t - gen}, **({"learning": signals} if report_learning else {})}
        r = http.post(f"/v1/jobs/{job}/reports", json=body, headers=auth)
        assert r.status_code == 200, r.text
        for c in r.json()["pending_changes"]:
            prefetch = int(c["value"])
            http.post(f"/v1/jobs/{job}/acks", json={"change_id": c["change_id"], "applied_at_step": i + 1,
                                                    "rank": 0}, headers=auth)
        i += 1
    decisions = http.get("/v1/decisions", params={"job": job, "limit": 50}).json()["decisions"]
    raises = [d for d in decisions if d["knob"] == "prefetch" and d["new_value"] > d["old_value"]
              and (d["change_id"] is not None or d["outcome"] == "advised")]
    first = min(raises, key=lambda d: d["id"]) if raises else None
    return {"curve": curve, "raise": first, "final_prefetch": prefetch}


def expected_outcome(hurts: bool, without_learning: bool, throughput_alone: bool) -> tuple[str, str]:
    """(the raise's outcome each run must show, in words): rolled back citing a signal where staleness hurts and the
    job reports learning; advised (not made) where it reports none under the shipped rules; kept otherwise."""
    if without_learning and not throughput_alone:
        return "advised", "advised, not made (no learning signal reported)"
    if hurts and not without_learning:
        return "rolled_back", "rolled back citing a signal"
    return "kept", "kept"


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="1-10", help="seeds, e.g. 1-10 or 1,3,5")
    ap.add_argument("--budget-s", type=float, default=100.0, help="simulated seconds of each run")
    ap.add_argument("--twins", default=",".join(TWINS), help="which twins, comma-separated")
    ap.add_argument("--without-learning", action="store_true",
                    help="the job reports no learning signal: under the shipped rules the raise is advice only")
    ap.add_argument("--throughput-alone", action="store_true",
                    help="with --without-learning: the job's rules say without_signals = throughput, the baseline "
                         "judged on samples/s alone")
    args = ap.parse_args(argv)
    if args.throughput_alone and not args.without_learning:
        ap.error("--throughput-alone goes with --without-learning")
    seeds = _seeds(args.seeds)
    failed = False
    with local_api("learner") as (http, token):
        for twin in args.twins.split(","):
            lr, hurts = TWINS[twin], twin == "stale-hurts"
            met, rows = 0, []
            for seed in seeds:
                out = run_auto(http, token, lr, seed, args.budget_s, f"{twin}-{seed}", not args.without_learning,
                               args.throughput_alone)
                auto = reward_per_s(out["curve"])
                static = {p: reward_per_s(run_static(lr, seed, p, args.budget_s)) for p in (0, 2)}
                d = out["raise"]
                outcome = d["outcome"] if d else "no raise"
                signal = ((d or {}).get("evidence") or {}).get("learning_broken", {}).get("signal")
                want, expected = expected_outcome(hurts, args.without_learning, args.throughput_alone)
                ok = outcome == want and (signal is not None or want != "rolled_back")
                if want == "advised":
                    ok = ok and "reports no learning signal" in (d.get("advice") or "")
                met += ok
                rows.append((seed, outcome, signal, auto, static))
                print(f"{twin} seed {seed}: prefetch raise {outcome}" + (f" ({signal})" if signal else "") +
                      f"; reward per simulated second: auto {auto:.3f}, static prefetch 0 {static[0]:.3f}, "
                      f"prefetch 2 {static[2]:.3f}", flush=True)
            gains = [s[2] / s[0] - 1 for _, _, _, _, s in rows]
            alone = " (no learning reported: judged on samples/s alone)" if args.throughput_alone else ""
            print(f"{twin}: {met}/{len(seeds)} {expected}{alone}; "
                  f"static prefetch 2 against 0: reward per second {statistics.median(gains):+.1%} (median); "
                  f"auto against the better static: "
                  f"{statistics.median(a / max(s.values()) for _, _, _, a, s in rows):.1%} (median)", flush=True)
            failed |= met < math.ceil(0.9 * len(seeds))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
