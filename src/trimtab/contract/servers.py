"""Server URLs as a user gives them, one parser for the agent and the hook: ``--server`` repeated, one string with
several URLs separated by commas or spaces (``$TRIMTAB_SERVER``, ``server_url`` in trimtab.toml), or a list. Several
heads on one PostgreSQL serve ingest alike, so both sides take the list in fail-over order. And how both say what a
server's error answer said (``answer_detail``)."""

from __future__ import annotations

from typing import Sequence, Union


def server_urls(values: Union[str, Sequence[str], None]) -> list[str]:
    """The URLs in ``values``, in order, without repeats, each without its trailing slash; [] for none. A URL
    that does not start with http:// or https:// raises ValueError naming it (a host alone would be posted to as
    a relative path)."""
    if values is None:
        return []
    out: list[str] = []
    for value in [values] if isinstance(values, str) else values:
        for url in str(value).replace(",", " ").split():
            url = url.rstrip("/")
            if not url.startswith(("http://", "https://")) or not url.split("://", 1)[1]:
                raise ValueError(f"server URL {url!r}: it must start with http:// or https://")
            if url not in out:
                out.append(url)
    return out


def answer_detail(resp) -> str:
    """The API's own ``detail`` of an error answer (an httpx response; else the body's start), on one line."""
    try:
        detail = resp.json().get("detail")
    except (ValueError, AttributeError):
        detail = None
    return " ".join(str(detail if detail is not None else resp.text).split())[:200]
