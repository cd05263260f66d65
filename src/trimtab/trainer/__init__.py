"""The hook a training job uses to report itself to trimtab and receive knob changes (``attach``), and the
framework adapters (``trimtab.trainer.adapters``). Imports torch and httpx only: a training environment needs
neither the server's web stack nor its database drivers. The names below load on first use, so a tailer of a
framework's logs (`trimtab verl-tail`, :mod:`trimtab.trainer.adapters.verl`) imports no torch at all."""

from importlib import import_module

_WHERE = {"Hook": "hook", "OomEvent": "hook", "attach": "hook", "StepReport": "step_record", "Reporter": "server_link"}
__all__ = ["Hook", "OomEvent", "Reporter", "StepReport", "attach"]


def __getattr__(name: str):
    if name in _WHERE:
        value = getattr(import_module(f"trimtab.trainer.{_WHERE[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'trimtab.trainer' has no attribute {name!r}")
