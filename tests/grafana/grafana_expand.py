"""What Grafana does to a panel's query text before a datasource runs it, re-done here so the tests can run the
queries themselves (Grafana is not installable on these machines).

Two stages, as in Grafana:

1. The frontend's template service replaces variables (``$name``, ``${name}``, ``${name:format}``, ``[[name]]``)
   and the global variables ``$__from`` / ``$__to`` (epoch ms), ``$__interval``, ``$__interval_ms``, ``$__range*``.
   A value is formatted by the datasource unless a format is named: SQL datasources quote each value of a
   multi-value or include-All variable as a literal and join them with commas; Prometheus regex-escapes them and
   joins them as ``(a|b)``. A custom "All" value is inserted as it is (Grafana skips formatting it).
2. For SQL, the backend (``pkg/tsdb/grafana-postgresql-datasource``): ``sqleng.Interpolate`` replaces
   ``$__interval_ms``, ``$__interval``, ``$__unixEpochFrom()``, ``$__unixEpochTo()``; then SQL comments are
   stripped and the PostgreSQL macro engine expands ``$__name(args)``. An unknown macro is an error, as there.

Every expansion below follows Grafana's source and documentation (PostgreSQL data source, "Macros"); the unit
tests in test_expander.py pin the documented examples.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from decimal import Decimal
from typing import Mapping, Optional, Sequence, Union

ALL = "$__all"
Value = Union[str, Sequence[str]]


class MacroError(ValueError):
    """A macro Grafana would refuse (unknown name, bad arguments)."""


# -- time ranges and intervals ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class TimeRange:
    from_ms: int
    to_ms: int

    @property
    def span_ms(self) -> int:
        return self.to_ms - self.from_ms


# Grafana's rangeutil.roundInterval: (upper bound exclusive, rounded interval), in ms.
_ROUND = ((15, 10), (35, 20), (75, 50), (150, 100), (350, 200), (750, 500), (1500, 1000), (3500, 2000),
          (7500, 5000), (12500, 10000), (17500, 15000), (25000, 20000), (45000, 30000), (90000, 60000),
          (210000, 120000), (450000, 300000), (750000, 600000), (1050000, 900000), (1500000, 1200000),
          (2700000, 1800000), (5400000, 3600000), (9000000, 7200000), (16200000, 10800000),
          (32400000, 21600000), (86400000, 43200000), (604800000, 86400000), (1814400000, 604800000),
          (3628800000, 2592000000))
_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}


def parse_interval_ms(text: str) -> int:
    """gtime.ParseInterval for the units a dashboard uses (no months/years: those depend on the date)."""
    m = re.fullmatch(r"(\d+)(ms|s|m|h|d|w)", text.strip().strip("'"))
    if not m:
        raise MacroError(f"error parsing interval {text}")
    return int(m.group(1)) * _UNITS_MS[m.group(2)]


def format_interval(ms: int) -> str:
    """The text Grafana gives ``$__interval`` (largest whole unit)."""
    for unit in ("w", "d", "h", "m", "s"):
        if ms % _UNITS_MS[unit] == 0:
            return f"{ms // _UNITS_MS[unit]}{unit}"
    return f"{ms}ms"


def interval_for(tr: TimeRange, max_data_points: int = 1000, min_interval: str = "1s") -> int:
    """Grafana's panel interval: range / max data points, rounded, and not below the datasource's minimum."""
    raw = tr.span_ms / max_data_points
    rounded = next((r for bound, r in _ROUND if raw < bound), 31_536_000_000)
    return max(rounded, parse_interval_ms(min_interval))


# -- stage 1: variables (the frontend's template service) ------------------------------------------------------

# Grafana's variableRegex: $var | [[var:fmt]] | ${var.field:fmt}
VARIABLE_RE = re.compile(r"\$(\w+)|\[\[(\w+?)(?::(\w+))?\]\]|\$\{(\w+)(?:\.([^:^}]+))?(?::([^}]+))?\}")
GLOBALS = ("__from", "__to", "__interval", "__interval_ms", "__range", "__range_s", "__range_ms", "__rate_interval")


def referenced_variables(text: str) -> list[str]:
    """Names of the variables ``text`` refers to, macros left out (``$__x(`` is a macro, not a variable), and so are
    ``$1``-style capture references (label_replace's replacement): Grafana finds no variable of that name and leaves
    them to Prometheus."""
    names = []
    for m in VARIABLE_RE.finditer(text):
        name = m.group(1) or m.group(2) or m.group(4)
        if m.group(1) and text[m.end():m.end() + 1] == "(":
            continue  # a macro call such as $__timeFilter(...)
        if name.isdigit():
            continue
        names.append(name)
    return names


CAPTURE_REF_RE = re.compile(r"\$\d+")


def unexpanded(expr: str) -> list[str]:
    """The ``$…`` left in an expanded query, capture references (``$1``) aside."""
    return re.findall(r"\$\S*", CAPTURE_REF_RE.sub("", expr))


@dataclass
class Variable:
    """A dashboard variable as the template service sees it, with the options its query returned."""

    name: str
    multi: bool = False
    include_all: bool = False
    all_value: Optional[str] = None
    options: list[str] = field(default_factory=list)  # the values of its options
    current: Value = ALL

    @classmethod
    def from_json(cls, v: Mapping, options: Sequence[str], current: Value) -> "Variable":
        return cls(v["name"], bool(v.get("multi")), bool(v.get("includeAll")), v.get("allValue") or None,
                   list(options), current)


def _sql_quote(value: str) -> str:
    return "'" + str(value).replace("'", "''") + "'"


def _prom_regular_escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("'", "\\\\'").replace('"', '\\"')


def _prom_regex_escape(value: str) -> str:
    value = value.replace("\\", "\\\\\\\\")
    return re.sub(r"[$^*{}\[\]'+?.()|]", lambda m: "\\\\" + m.group(0), value)


def _format_for_datasource(kind: str, value: Value, var: Variable) -> str:
    if kind == "sql":  # SqlDatasource.interpolateVariable
        if isinstance(value, str):
            return _sql_quote(value) if (var.multi or var.include_all) else value.replace("'", "''")
        return ",".join(_sql_quote(v) for v in value)
    if kind == "prometheus":  # PrometheusDatasource.interpolateQueryExpr
        if not var.multi and not var.include_all:
            return _prom_regular_escape(value if isinstance(value, str) else ",".join(value))
        if isinstance(value, str):
            return _prom_regex_escape(value)
        escaped = [_prom_regex_escape(v) for v in value]
        return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"
    raise ValueError(kind)


def _format_named(fmt: str, value: Value) -> str:
    values = [value] if isinstance(value, str) else list(value)
    if fmt == "raw":
        return value if isinstance(value, str) else ",".join(values)
    if fmt == "sqlstring":
        return ",".join(_sql_quote(v) for v in values)
    if fmt == "csv":
        return ",".join(values)
    if fmt == "pipe":
        return "|".join(values)
    if fmt == "regex":
        escaped = [re.sub(r"[\\^$*+?.()|{}\[\]/]", lambda m: "\\" + m.group(0), v) for v in values]
        return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"
    raise ValueError(f"variable format {fmt!r} is not handled by this expander")


def interpolate_variables(text: str, variables: Mapping[str, Variable], tr: TimeRange, interval_ms: int,
                          kind: str) -> str:
    """Stage 1. Unknown names stay as they are (Grafana leaves them for the datasource)."""
    builtins = {"__from": str(tr.from_ms), "__to": str(tr.to_ms), "__interval": format_interval(interval_ms),
                "__interval_ms": str(interval_ms), "__range": format_interval(tr.span_ms),
                "__range_s": str(tr.span_ms // 1000), "__range_ms": str(tr.span_ms),
                "__rate_interval": format_interval(max(4 * interval_ms, interval_ms + 15_000))}

    def replace(m: re.Match) -> str:
        name = m.group(1) or m.group(2) or m.group(4)
        fmt = m.group(3) or m.group(6)
        if m.group(1) and m.string[m.end():m.end() + 1] == "(":
            return m.group(0)  # a macro: the backend's business
        if name in builtins:
            return builtins[name]
        var = variables.get(name)
        if var is None:
            return m.group(0)
        value: Value = var.current
        is_all = value == ALL or (not isinstance(value, str) and list(value) == [ALL])
        if is_all:
            if var.all_value is not None and fmt not in ("text", "percentencode"):
                return interpolate_variables(var.all_value, variables, tr, interval_ms, kind)
            value = list(var.options)
        if fmt:
            return _format_named(fmt, value)
        return _format_for_datasource(kind, value, var)

    return VARIABLE_RE.sub(replace, text)


# -- stage 2: the PostgreSQL backend -----------------------------------------------------------------------------


def go_float(x: float) -> str:
    """Go's ``fmt.Sprintf("%v", float64)`` (``%g``, shortest digits): exponent form when the decimal exponent is
    below -4 or at least 6 (``1e+06``), else plain (``86400``, ``0.5``)."""
    if x == 0:
        return "0"
    d = Decimal(repr(float(x)))
    exp = d.adjusted()
    if exp < -4 or exp >= 6:
        digits = d.as_tuple().digits
        mant = str(digits[0]) + ("." + "".join(map(str, digits[1:])).rstrip("0") if len(digits) > 1 else "")
        mant = mant.rstrip(".")
        return f"{'-' if x < 0 else ''}{mant}e{'+' if exp >= 0 else '-'}{abs(exp):02d}"
    text = format(d, "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


def rfc3339nano(ms: int) -> str:
    """Go's ``time.RFC3339Nano`` of a UTC instant: fraction without trailing zeros, ``Z``."""
    dt = datetime.fromtimestamp(ms // 1000, tz=timezone.utc)
    frac = f"{ms % 1000:03d}".rstrip("0")
    return dt.strftime("%Y-%m-%dT%H:%M:%S") + (f".{frac}" if frac else "") + "Z"


def sqleng_interpolate(sql: str, tr: TimeRange, interval_ms: int) -> str:
    sql = sql.replace("$__interval_ms", str(interval_ms))
    sql = sql.replace("$__interval", format_interval(interval_ms))
    sql = sql.replace("$__unixEpochFrom()", str(tr.from_ms // 1000))
    return sql.replace("$__unixEpochTo()", str(tr.to_ms // 1000))


def strip_sql_comments(sql: str) -> str:
    """Quote-aware removal of ``--`` and ``/* */`` comments (the backend does it before expanding macros)."""
    out, i, n = [], 0, len(sql)
    while i < n:
        c = sql[i]
        if c in "'\"":
            j = i + 1
            while j < n:
                if sql[j] == c:
                    if j + 1 < n and sql[j + 1] == c:
                        j += 2
                        continue
                    break
                j += 1
            out.append(sql[i:j + 1])
            i = j + 1
        elif sql.startswith("--", i):
            while i < n and sql[i] != "\n":
                i += 1
        elif sql.startswith("/*", i):
            end = sql.find("*/", i + 2)
            i = n if end < 0 else end + 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


MACRO_RE = re.compile(r"\$([_a-zA-Z0-9]+)\(([^)]*)\)")


def _postgres_macro(name: str, args: list[str], tr: TimeRange) -> str:
    def need_column():
        if not args or args == [""]:
            raise MacroError(f"missing time column argument for macro {name}")

    def group_seconds() -> str:
        if len(args) < 2:
            raise MacroError(f"macro {name} needs time column and interval and optional fill value")
        if len(args) == 3:
            raise MacroError("fill modes are not used by trimtab's dashboards")
        return go_float(parse_interval_ms(args[1].strip("'")) / 1000)

    if name == "__time":
        need_column()
        return f'{args[0]} AS "time"'
    if name == "__timeEpoch":
        need_column()
        return f'extract(epoch from {args[0]}) as "time"'
    if name == "__timeFilter":
        need_column()
        return f"{args[0]} BETWEEN '{rfc3339nano(tr.from_ms)}' AND '{rfc3339nano(tr.to_ms)}'"
    if name == "__timeFrom":
        return f"'{rfc3339nano(tr.from_ms)}'"
    if name == "__timeTo":
        return f"'{rfc3339nano(tr.to_ms)}'"
    if name == "__timeGroup":
        s = group_seconds()
        return f"floor(extract(epoch from {args[0]})/{s})*{s}"
    if name == "__timeGroupAlias":
        return _postgres_macro("__timeGroup", args, tr) + ' AS "time"'
    if name == "__unixEpochFilter":
        need_column()
        return f"{args[0]} >= {tr.from_ms // 1000} AND {args[0]} <= {tr.to_ms // 1000}"
    if name == "__unixEpochNanoFilter":
        need_column()
        return f"{args[0]} >= {tr.from_ms * 1_000_000} AND {args[0]} <= {tr.to_ms * 1_000_000}"
    if name == "__unixEpochNanoFrom":
        return str(tr.from_ms * 1_000_000)
    if name == "__unixEpochNanoTo":
        return str(tr.to_ms * 1_000_000)
    if name == "__unixEpochGroup":
        s = group_seconds()
        return f"floor(({args[0]})/{s})*{s}"
    if name == "__unixEpochGroupAlias":
        return _postgres_macro("__unixEpochGroup", args, tr) + ' AS "time"'
    raise MacroError(f'unknown macro "{name}"')


def expand_postgres_macros(sql: str, tr: TimeRange) -> str:
    sql = strip_sql_comments(sql)

    def replace(m: re.Match) -> str:
        name = m.group(1)
        if name == "__timeGroup" and sql[m.end():m.end() + 1] == ",":  # pre-5.3 use: alias implied
            name = "__timeGroupAlias"
        args = [a.strip(" ") for a in m.group(2).split(",")]
        return _postgres_macro(name, args, tr)

    return MACRO_RE.sub(replace, sql)


def expand_sql(raw_sql: str, variables: Mapping[str, Variable], tr: TimeRange, interval_ms: int) -> str:
    """What the PostgreSQL datasource sends to the server for ``raw_sql``."""
    text = interpolate_variables(raw_sql, variables, tr, interval_ms, "sql")
    return expand_postgres_macros(sqleng_interpolate(text, tr, interval_ms), tr)


def expand_promql(expr: str, variables: Mapping[str, Variable], tr: TimeRange, interval_ms: int) -> str:
    return interpolate_variables(expr, variables, tr, interval_ms, "prometheus")


# -- how Grafana reads a SQL result's time column ----------------------------------------------------------------


def epoch_to_ms(value: float) -> float:
    """sqleng's epochPrecisionToMS: seconds (…e+09) become ms, nanoseconds (…e+18) become ms, else unchanged."""
    s = f"{float(value):e}"
    exp = int(s.split("e")[1])
    if exp == 9:
        return float(value) * 1e3
    if exp == 18:
        return float(value) / 1e6
    return float(value)
