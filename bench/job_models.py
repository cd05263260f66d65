"""The synthetic jobs ``bench/workloads.py`` runs under the rebalancer, by the name ``--workloads`` takes: issue
15's five, issue 20's jobs unlike the ones the rebalancer was built on, the lent H200 host's two habits (a drift,
regimes), issue 38's jobs that change over time and memory they do not own. What a job is:
``bench/synthetic_job.py``; the jobs: ``bench/job_curve_models.py``, ``job_noise_models.py``, ``job_queue_models.py``,
``job_periodic_models.py``, ``job_memory_models.py``. The order is the order they run and print in.
"""

from __future__ import annotations

from bench.job_curve_models import comm_bound, eval_bound, fast_steps, known_loser, non_monotone, sync_ladder
from bench.job_memory_models import memory_growing, mix, neighbour
from bench.job_noise_models import (comm_bound_noisy, drifting_host, non_monotone_noisy, noisy, regime_host,
                                    slowdown_at_a_move, stalls, warm_up)
from bench.job_periodic_models import generation_every, periodic_heavy
from bench.job_queue_models import bounded_queue, queue_then_sync

WORKLOADS = {
    # issue 15's five, issue 20's, the H200 host's habits, and prefetch through a queue
    "comm": comm_bound, "eval": eval_bound, "non_monotone": non_monotone, "memory": memory_growing,
    "noisy": noisy, "fast": fast_steps, "warm_up": warm_up, "known_loser": known_loser,
    "ladder": sync_ladder, "drift": drifting_host, "regimes": regime_host, "stalls": stalls,
    "queue_sync": queue_then_sync, "queue_bank": lambda: queue_then_sync(bank=True),
    "queue_sync_mark": lambda: queue_then_sync(mark=True),
    "queue_steady": bounded_queue, "queue_bursty": lambda: bounded_queue(bursty=True),
    # issue 38: jobs that change over time (the drifting ones are scored by bench/drifting_jobs.py)
    "eval_10x_20": periodic_heavy, "eval_5x_50": lambda: periodic_heavy(50, 5.0),
    "checkpoint_25x_40": lambda: periodic_heavy(40, 25.0, "checkpoint"),
    "generation_every_4": generation_every,
    # issue 38: memory the job does not own, and searches that must go on past one verdict that cannot tell
    "neighbour": neighbour, "comm_noisy": comm_bound_noisy, "non_monotone_noisy": non_monotone_noisy,
    "slowdown_at_move": slowdown_at_a_move, "mix": mix,
}
