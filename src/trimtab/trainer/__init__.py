"""The hook a training job uses to report itself to trimtab and receive knob changes (``attach``), and the
framework adapters (``trimtab.trainer.adapters``). Imports torch and httpx only: a training environment needs
neither the server's web stack nor its database drivers. The names below load on first use, so a tailer of a
framework's logs (`trimtab verl-tail`, :mod:`trimtab.trainer.adapters.verl`) imports no torch at all.

The public surface: :func:`attach` and the :class:`Hook` it returns, the :class:`OomEvent` ``hook.last_oom`` holds,
the applier contract a framework adapter implements (:class:`KnobApplier`, handed a :class:`KnobChange`), the
record of a step (:class:`StepReport`) and the link that ships it to the server (:class:`Reporter`)."""

from importlib import import_module

_WHERE = {"Hook": "hook", "attach": "hook", "OomEvent": "oom", "KnobApplier": "apply", "KnobChange": "apply",
          "StepReport": "step_record", "Reporter": "server_link"}
__all__ = ["Hook", "KnobApplier", "KnobChange", "OomEvent", "Reporter", "StepReport", "attach"]


def __getattr__(name: str):
    if name in _WHERE:
        value = getattr(import_module(f"trimtab.trainer.{_WHERE[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'trimtab.trainer' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
