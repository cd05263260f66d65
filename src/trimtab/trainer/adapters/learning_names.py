"""Each framework's logged names → trimtab's learning signals (:mod:`trimtab.contract.learning`), as data
(``learning_names.toml``), so a change to a knob that changes what is learned is judged on the signals the framework
already logs, whatever it calls them.

``LearningNames(framework)`` reads one step's logged scalars and gives ``{signal: value}``: the first of the
signal's names present wins; a count kept since the start (verl's stale trajectories) becomes the step's increase
over the step's samples, so the mapper keeps the previous count (one mapper per run). Imports neither torch nor a
framework.
"""

from __future__ import annotations

import math
import tomllib
from pathlib import Path
from typing import Any, Mapping, Optional

from trimtab.contract.learning import SIGNAL_NAMES

NAMES_FILE = Path(__file__).with_name("learning_names.toml")
FRAMEWORKS = ("verl", "trl", "user")
PREFIXES = ("", "train/", "train_")  # Lightning's and W&B's spellings of a user's own names


def _load() -> dict[str, dict[str, Any]]:
    with NAMES_FILE.open("rb") as f:
        table = tomllib.load(f)
    for framework, entry in table.items():
        for signal in [*entry.get("names", {}), *entry.get("per_sample_increase", {})]:
            if signal not in SIGNAL_NAMES:
                raise ValueError(f"{NAMES_FILE.name}: [{framework}] names {signal!r}, not a learning signal "
                                 f"(known: {', '.join(SIGNAL_NAMES)})")
    return table


TABLE = _load()


def _number(x: Any) -> Optional[float]:
    if hasattr(x, "item") and callable(x.item):  # a 0-d tensor or numpy scalar
        try:
            x = x.item()
        except (TypeError, ValueError, RuntimeError):
            return None
    ok = isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
    return float(x) if ok else None


def logged_names(framework: str) -> dict[str, list[str]]:
    """Signal → the framework's names for it (a per-sample count's name included), for documentation."""
    entry = TABLE[framework]
    out = {s: list(names) for s, names in entry.get("names", {}).items()}
    for s, name in entry.get("per_sample_increase", {}).items():
        out.setdefault(s, []).append(f"Δ{name} / samples")
    return out


class LearningNames:
    """One run's mapper from a framework's logged scalars to trimtab's learning signals."""

    def __init__(self, framework: str):
        if framework not in TABLE:
            raise ValueError(f"framework must be one of {', '.join(TABLE)}, got {framework!r}")
        entry = TABLE[framework]
        self.framework = framework
        self._names: dict[str, list[str]] = entry.get("names", {})
        self._counts: dict[str, str] = entry.get("per_sample_increase", {})
        self._prefixes = PREFIXES if framework == "user" else ("",)
        self._last_count: dict[str, float] = {}

    def signals(self, logged: Mapping[str, Any], samples: Optional[float] = None) -> dict[str, float]:
        """The step's learning signals from what the framework logged for it (``samples``: the step's samples,
        for a count's share); absent where the framework logged none."""
        out: dict[str, float] = {}
        for signal, names in self._names.items():
            value = self._first(logged, names)
            if value is not None:
                out[signal] = value
        for signal, name in self._counts.items():
            count = _number(logged.get(name))
            if count is None:
                continue
            last = self._last_count.get(signal)
            self._last_count[signal] = count
            if last is not None and samples and samples > 0 and count >= last:
                out[signal] = min(1.0, (count - last) / samples)
        return out

    def _first(self, logged: Mapping[str, Any], names: list[str]) -> Optional[float]:
        for name in names:
            for prefix in self._prefixes:
                value = _number(logged.get(prefix + name))
                if value is not None:
                    return value
        return None


COLUMN_TITLES = {"verl": "verl (adapter, `verl-tail`)", "trl": "TRL",
                 "user": "what your code logs (your loop, HF `Trainer`, Lightning)"}


def markdown_table() -> str:
    """The frameworks × signals table as docs/hook.md shows it: which name each framework logs a signal under, or
    that it logs none (that page's copy is checked against this)."""
    frameworks = list(TABLE)
    rows = ["| signal | " + " | ".join(COLUMN_TITLES.get(f, f) for f in frameworks) + " |",
            "|---|" + "---|" * len(frameworks)]
    for signal in SIGNAL_NAMES:
        cells = [", ".join(f"`{n}`" for n in logged_names(f).get(signal, [])) or "— (not logged)"
                 for f in frameworks]
        rows.append(f"| `{signal}` | " + " | ".join(cells) + " |")
    return "\n".join(rows)
