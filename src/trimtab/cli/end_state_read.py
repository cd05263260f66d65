"""The end state of the jobs `trimtab check` shows (trimtab.grading.end_state), read from the store or from a running
server's ``GET /v1/jobs/{name}`` (its ``end_state``; a server without it: none)."""

from __future__ import annotations

import time
from typing import Callable, Iterable


def each_stored_job(db_url: str, names: Iterable[str], read: Callable) -> dict:
    """Job name → ``read(engine, job, now_ms)`` for each named job in the store at ``db_url`` (unknown names: none)."""
    from trimtab.store import jobs as job_store
    from trimtab.store.engine import open_engine

    engine = open_engine(db_url)
    out = {}
    try:
        now_ms = int(time.time() * 1000)
        for name in names:
            job = job_store.get_job(engine, name)
            if job is not None:
                out[name] = read(engine, job, now_ms)
    finally:
        engine.dispose()
    return out


def end_states_from_store(db_url: str, names: Iterable[str], rules) -> dict:
    """Job name → its end state (as :meth:`EndState.to_dict`)."""
    from trimtab.grading.end_state import job_end_state
    from trimtab.grading.rules import default_rules

    return each_stored_job(db_url, names, lambda engine, job, now_ms:
                           job_end_state(engine, job, rules or default_rules(), now_ms).to_dict())


def end_states_from_server(server_url: str, names: Iterable[str], get: Callable) -> dict:
    """The same from the server (``get(url, params)`` answers an httpx response)."""
    out = {}
    for name in names:
        resp = get(f"{server_url.rstrip('/')}/v1/jobs/{name}", {})
        if resp.status_code == 200 and resp.json().get("end_state"):
            out[name] = resp.json()["end_state"]
    return out
