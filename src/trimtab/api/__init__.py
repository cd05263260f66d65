"""The REST API, Prometheus /metrics and /healthz around the store, the agent's live view and the rebalancer.

``create_app`` and ``ApiContext`` load on first use: importing a part of the API (its schemas, the live view)
does not build the web app."""

from importlib import import_module

_WHERE = {"ApiContext": "context", "create_app": "app"}
__all__ = ["ApiContext", "create_app"]


def __getattr__(name: str):
    if name in _WHERE:
        value = getattr(import_module(f"trimtab.api.{_WHERE[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'trimtab.api' has no attribute {name!r}")
