"""grafana/ as provisioning input: the YAML and JSON parse, uids are unique, every datasource a dashboard names is
provisioned, every variable is defined (before the variables that use it), the JSON is what generate.py writes,
and the bands drawn are the rebalancer's thresholds."""

from __future__ import annotations

import re
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

import pytest

from .dashboards import (DASHBOARDS, GRAFANA, ROOT, all_panels, datasources, env_defaults, env_references,
                         load_dashboards, organize_columns, provisioning_yaml, queries)
from .grafana_expand import GLOBALS, referenced_variables

DASHES = load_dashboards()
GPU_DASHBOARDS = ("balance", "interconnect", "memory")


def test_every_dashboard_is_there_and_uids_are_unique():
    names = {n.removesuffix(".json") for n in DASHES}
    assert names == {*GPU_DASHBOARDS, *(f"{n}-prometheus" for n in GPU_DASHBOARDS), "job", "rebalancer"}
    uids = [d["uid"] for d in DASHES.values()]
    assert len(set(uids)) == len(uids), uids
    assert all(re.fullmatch(r"[a-zA-Z0-9_-]{1,40}", u) for u in uids), uids
    titles = [d["title"] for d in DASHES.values()]
    assert len(set(titles)) == len(titles)


def test_provisioning_files_parse_and_point_at_the_dashboards():
    ds_docs, dash_docs = provisioning_yaml("datasources"), provisioning_yaml("dashboards")
    assert ds_docs and dash_docs
    for _, doc in ds_docs + dash_docs:
        assert doc["apiVersion"] == 1
    sources = [ds for _, doc in ds_docs for ds in doc["datasources"]]
    assert len({ds["uid"] for ds in sources}) == len(sources)
    assert {ds["type"] for ds in sources} == {"postgres", "prometheus"}
    assert not any(ds.get("isDefault") for ds in sources), "a second default datasource breaks provisioning"
    providers = [p for _, doc in dash_docs for p in doc["providers"]]
    assert [p["type"] for p in providers] == ["file"]
    # The provider's path comes from the environment: pointed at grafana/dashboards it finds every dashboard.
    path = providers[0]["options"]["path"]
    assert env_references(path) == {"TRIMTAB_GRAFANA_DASHBOARDS"}
    from .dashboards import expand_env

    resolved = expand_env(path, {"TRIMTAB_GRAFANA_DASHBOARDS": str(DASHBOARDS)})
    assert sorted(p.name for p in Path(resolved).glob("*.json")) == sorted(DASHES)


def test_every_environment_variable_is_documented_with_a_default():
    used = set()
    for _, doc in provisioning_yaml("datasources") + provisioning_yaml("dashboards"):
        used |= env_references(doc)
    defaults = env_defaults()
    assert used == set(defaults), (used, set(defaults))
    readme = (GRAFANA / "README.md").read_text()
    for name, value in defaults.items():
        assert name in readme, f"{name} is not in grafana/README.md"
    # With the defaults the datasources are complete: nothing expands to empty except an empty password.
    pg = datasources()["trimtab-postgres"]
    assert pg["url"] == "127.0.0.1:5432" and pg["jsonData"]["database"] == "trimtab"
    assert datasources()["trimtab-prometheus"]["url"].startswith("http://")


@pytest.mark.parametrize("name", sorted(DASHES))
def test_panels_resolve_to_provisioned_datasources(name):
    dash = DASHES[name]
    provisioned = {uid: ds["type"] for uid, ds in datasources().items()}
    ds_vars = {v["name"]: v for v in dash["templating"]["list"] if v["type"] == "datasource"}

    def resolve(ref: dict) -> str:
        uid = ref["uid"]
        m = re.fullmatch(r"\$\{(\w+)\}|\$(\w+)", uid)
        if m:  # a datasource variable: its default must be a provisioned datasource of its plugin type
            var = ds_vars[m.group(1) or m.group(2)]
            uid = var["current"]["value"]
            assert provisioned.get(uid) == var["query"], (var, provisioned)
        assert uid in provisioned, f"{name}: datasource {ref} is not provisioned"
        assert provisioned[uid] == ref["type"], (ref, provisioned[uid])
        return uid

    panels = [p for p in all_panels(dash) if p["type"] != "row"]
    assert panels
    ids = [p["id"] for p in all_panels(dash)]
    assert len(set(ids)) == len(ids)
    for panel in panels:
        used = {resolve(panel["datasource"])}
        assert panel["targets"], panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert len(set(refs)) == len(refs)
        for t in panel["targets"]:
            used.add(resolve(t.get("datasource", panel["datasource"])))
            if t["datasource"]["type"] == "postgres":
                assert t["rawQuery"] is True and t["format"] in ("time_series", "table"), t
            else:
                assert t["expr"].strip(), t
        assert len(used) == 1, f"{panel['title']}: one datasource per panel"
        grid = panel["gridPos"]
        assert 0 <= grid["x"] and grid["x"] + grid["w"] <= 24 and grid["h"] > 0
    for ann in dash["annotations"]["list"]:
        resolve(ann["datasource"])
        assert set(ann["filter"]["ids"]) <= set(ids)
    for var in dash["templating"]["list"]:
        if var["type"] == "query":
            resolve(var["datasource"])


@pytest.mark.parametrize("name", sorted(DASHES))
def test_variables_are_defined_before_use(name):
    dash = DASHES[name]
    defined: list[str] = []
    for var in dash["templating"]["list"]:
        assert var["name"] not in defined, f"variable {var['name']} defined twice"
        if var["type"] == "query":
            text = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            for ref in referenced_variables(text) + referenced_variables(var["datasource"]["uid"]):
                assert ref in defined or ref in GLOBALS, f"{name}: variable {var['name']} uses ${ref} before it is defined"
        defined.append(var["name"])
    for q in queries(name, dash):
        for ref in referenced_variables(q.text):
            assert ref in defined or ref in GLOBALS, f"{name} {q.where}: ${ref} is not defined"
    # Every GPU dashboard (PostgreSQL or Prometheus) has host and GPU variables; the PostgreSQL ones a job too.
    stem = name.removesuffix(".json")
    if stem.split("-")[0] in GPU_DASHBOARDS:
        assert {"host", "gpu"} <= set(defined)
    if not stem.endswith("prometheus"):
        assert "job" in defined


@pytest.mark.parametrize("name", sorted(DASHES))
def test_tables_pin_their_columns_and_unsupported_is_mapped(name):
    for panel in all_panels(DASHES[name]):
        if panel["type"] == "table":
            assert organize_columns(panel), f"{panel['title']}: a table names its columns"
        for o in panel.get("fieldConfig", {}).get("overrides", []):
            for prop in o["properties"]:
                if prop["id"] == "mappings":
                    assert prop["value"], panel["title"]
    if name.startswith("interconnect"):
        nvlink = [p for p in all_panels(DASHES[name]) if "NVLink" in p["title"]]
        assert nvlink
        for p in nvlink:  # each NVLink panel says "unsupported": as its no-value text, or through a mapping
            fc = p["fieldConfig"]
            mappings = fc["defaults"].get("mappings", []) + [
                m for o in fc["overrides"] if o["matcher"]["options"].startswith("NVLink")
                for prop in o["properties"] if prop["id"] == "mappings" for m in prop["value"]]
            assert "unsupported" in fc["defaults"].get("noValue", "") or "unsupported" in _mapped_texts(mappings), \
                p["title"]


def _mapped_texts(mappings: list[dict]) -> list[str]:
    texts = []
    for m in mappings:
        if m["type"] == "special":
            texts.append(m["options"]["result"]["text"])
        elif m["type"] == "value":
            texts += [r["text"] for r in m["options"].values()]
    return texts


def test_the_json_is_what_generate_py_writes():
    from grafana import generate as gen

    for name, build in gen.DASHBOARDS.items():
        assert (DASHBOARDS / name).read_text() == gen.render(build), f"{name} is stale: run python3 -m grafana.generate"


def _rules() -> dict[str, dict]:
    """Each rule's thresholds as the rebalancer ships them (src/trimtab/grading/rules.toml)."""
    data = tomllib.loads((ROOT / "src" / "trimtab" / "grading" / "rules.toml").read_text())
    return {**data["rules"], "controller": data.get("controller", {})}


def test_bands_are_the_rebalancers_thresholds():
    from grafana import panels as gen

    rules = _rules()

    def pair(rule):
        return (rules[rule]["healthy_below"], rules[rule]["act_above"])

    assert gen.SPREAD == pair("utilization_spread")
    assert gen.PCIE == pair("pcie")
    assert gen.MEMORY == pair("memory")
    assert gen.FRAGMENTATION == pair("fragmentation")
    assert gen.LATENCY == pair("collective_latency")
    for phase, rule in (("generation", "generation_bound"), ("evaluation", "evaluation_bound"),
                        ("communication", "communication_bound")):
        assert gen.GUIDES[phase] == rules[rule]["healthy_below"]
    assert gen.PROBE_BASELINE_STEPS == rules["controller"]["probe_baseline_steps"]
    from trimtab.store.queries import AUTO_1M_MAX_MS, AUTO_RAW_MAX_MS

    assert (gen.RAW_MAX_MS, gen.ROLLUP_1M_MAX_MS) == (AUTO_RAW_MAX_MS, AUTO_1M_MAX_MS)
    # …and the panels draw those numbers.
    balance = {p["title"]: p for p in all_panels(DASHES["balance.json"])}
    steps = balance["Utilization spread (max − min across GPUs, points)"]["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert [s["value"] for s in steps] == [None, *gen.SPREAD]
