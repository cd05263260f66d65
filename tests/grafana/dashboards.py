"""Reading grafana/: the provisioning files (with Grafana's environment expansion) and the dashboards, and walking a
dashboard's queries (panel targets, annotation queries, variable queries) as Grafana would find them."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional

ROOT = Path(__file__).resolve().parents[2]
GRAFANA = ROOT / "grafana"
DASHBOARDS = GRAFANA / "dashboards"
PROVISIONING = GRAFANA / "provisioning"
ENV_FILE = GRAFANA / "trimtab-grafana.env"

# Grafana's provisioning expansion: $VAR or ${VAR}, an unset variable becomes "".
ENV_RE = re.compile(r"\$(?:\{(\w+)\}|(\w+))")


def env_defaults() -> dict[str, str]:
    out = {}
    for line in ENV_FILE.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip()
    return out


def env_references(value: Any) -> set[str]:
    """Environment variables a parsed provisioning document refers to (Grafana expands values, not comments)."""
    if isinstance(value, str):
        return {a or b for a, b in ENV_RE.findall(value)}
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else []
    return set().union(*(env_references(v) for v in items)) if items else set()


def expand_env(value: Any, env: Mapping[str, str]) -> Any:
    """Grafana's interpolation of provisioning values (strings inside the parsed YAML)."""
    if isinstance(value, str):
        return ENV_RE.sub(lambda m: env.get(m.group(1) or m.group(2), ""), value)
    if isinstance(value, list):
        return [expand_env(v, env) for v in value]
    if isinstance(value, dict):
        return {k: expand_env(v, env) for k, v in value.items()}
    return value


def provisioning_yaml(kind: str) -> list[tuple[Path, dict]]:
    import yaml

    return [(p, yaml.safe_load(p.read_text())) for p in sorted((PROVISIONING / kind).glob("*.y*ml"))]


def datasources(env: Optional[Mapping[str, str]] = None) -> dict[str, dict]:
    """Provisioned datasources by uid, expanded with ``env`` (default: the documented defaults)."""
    env = env_defaults() if env is None else env
    out = {}
    for _, doc in provisioning_yaml("datasources"):
        for ds in doc.get("datasources", []):
            out[ds["uid"]] = expand_env(ds, env)
    return out


def load_dashboards() -> dict[str, dict]:
    return {p.name: json.loads(p.read_text()) for p in sorted(DASHBOARDS.glob("*.json"))}


def all_panels(dash: dict) -> Iterator[dict]:
    for p in dash.get("panels", []):
        yield p
        yield from p.get("panels", [])  # a collapsed row's panels


@dataclass(frozen=True)
class Query:
    """One query of a dashboard: a panel target, an annotation query or a variable query."""

    dashboard: str
    where: str  # "panel <title> / <refId>", "annotation <name>", "variable <name>"
    datasource: dict
    text: str
    fmt: str  # time_series | table | annotation | variable | promql
    panel: Optional[dict] = None
    target: Optional[dict] = None
    instant: bool = False

    @property
    def kind(self) -> str:
        return "prometheus" if self.datasource.get("type") == "prometheus" else "sql"


def _variable_query_text(var: dict) -> str:
    q = var.get("query", "")
    return q.get("query", "") if isinstance(q, dict) else q


def queries(name: str, dash: dict) -> Iterator[Query]:
    for var in dash.get("templating", {}).get("list", []):
        if var.get("type") == "query":
            yield Query(name, f"variable {var['name']}", var["datasource"], _variable_query_text(var), "variable")
    for ann in dash.get("annotations", {}).get("list", []):
        if ann.get("builtIn"):
            continue
        target = ann.get("target", {})
        yield Query(name, f"annotation {ann['name']}", ann.get("datasource", target.get("datasource")),
                    target.get("rawSql") or target.get("expr") or ann.get("rawQuery", ""), "annotation")
    for panel in all_panels(dash):
        for t in panel.get("targets", []):
            ds = t.get("datasource") or panel.get("datasource")
            where = f"panel {panel['title']!r} / {t['refId']}"
            if ds.get("type") == "prometheus":
                yield Query(name, where, ds, t["expr"], "promql", panel, t, bool(t.get("instant")))
            else:
                yield Query(name, where, ds, t["rawSql"], t.get("format", "time_series"), panel, t)


def organize_columns(panel: dict) -> Optional[list[str]]:
    for tr in panel.get("transformations", []):
        if tr["id"] == "organize" and tr["options"].get("indexByName"):
            idx = tr["options"]["indexByName"]
            return sorted(idx, key=idx.get)
    return None


def override_names(panel: dict) -> list[str]:
    return [o["matcher"]["options"] for o in panel.get("fieldConfig", {}).get("overrides", [])
            if o["matcher"]["id"] == "byName"]


def pg_connect_kwargs(ds: dict) -> dict:
    """psycopg connection arguments from a provisioned PostgreSQL datasource, read the way Grafana reads them."""
    host, _, port = ds["url"].rpartition(":") if ":" in ds["url"] else (ds["url"], "", "5432")
    json_data = ds.get("jsonData", {})
    return {"host": host, "port": int(port or 5432), "dbname": json_data.get("database") or ds.get("database"),
            "user": ds["user"], "password": ds.get("secureJsonData", {}).get("password") or None,
            "sslmode": json_data.get("sslmode") or "require"}


def env_for_tests(**overrides: str) -> dict[str, str]:
    """The documented defaults, overridden."""
    env = env_defaults()
    env.update(overrides)
    return env


__all__ = ["DASHBOARDS", "GRAFANA", "Query", "ROOT", "all_panels", "datasources", "env_defaults", "env_for_tests",
           "env_references", "expand_env", "load_dashboards", "organize_columns", "override_names",
           "pg_connect_kwargs", "provisioning_yaml", "queries"]
