"""trimtab's Grafana dashboards as code: ``python3 -m grafana.generate`` writes ``grafana/dashboards/*.json``."""
