"""What the hook's tests share: the knobs a test job declares, and the reports the live API stored for a job."""

from __future__ import annotations

KNOBS = {"batch_size": (8, 1, 64), "prefetch": (0, 0, 4), "sync_every": (1, 1, 4)}  # (start, min, max)


def reports_of(api, job: str) -> list[dict]:
    r = api.get(f"/v1/jobs/{job}/reports", limit=500)
    return r.json()["reports"] if r.status_code == 200 else []
