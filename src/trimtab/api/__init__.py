"""The REST API, Prometheus /metrics and /healthz around the store, the agent snapshot and the rebalancer."""
