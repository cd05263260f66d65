"""The REST API, Prometheus /metrics and /healthz around the store, the agent's live view and the rebalancer."""

from trimtab.api.app import create_app
from trimtab.api.context import ApiContext

__all__ = ["ApiContext", "create_app"]
