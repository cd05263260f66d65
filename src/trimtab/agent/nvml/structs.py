"""Reading fields of pynvml's ctypes structs in one C call.

pynvml's structs override ``__getattribute__`` in Python, so every field read costs ~0.4 µs; the tick reads ~20 a
GPU (memory, and a return code and a value per GPM metric), as much as the NVML calls' own Python. A
``struct.Struct`` laid out from the ctypes field descriptors reads them all at once (~0.1–0.3 µs). The layout is
checked against the struct itself when it is built; where it does not hold, plain attribute reads are used.
"""

from __future__ import annotations

import ctypes
import struct
from operator import attrgetter
from typing import Any, Callable, Sequence

# ctypes type code → struct code of the same size in standard ("=") mode, by (signedness or float, size).
_CODES = {("u", 1): "B", ("u", 2): "H", ("u", 4): "I", ("u", 8): "Q",
          ("s", 1): "b", ("s", 2): "h", ("s", 4): "i", ("s", 8): "q", ("f", 4): "f", ("f", 8): "d"}


def _code(ctype: Any) -> str:
    kind = "f" if ctype._type_ in "fd" else "s" if ctype._type_.islower() else "u"
    return _CODES[(kind, ctypes.sizeof(ctype))]


def field_reader(ctype: Any, names: Sequence[str], *, offset: int = 0, count: int = 1,
                 stride: int = 0) -> Callable[[Any], tuple]:
    """A function of a ``ctype`` instance (or of a struct holding ``count`` of them from byte ``offset``, every
    ``stride`` bytes) returning the ``names`` fields, in that order, of each one after the other."""
    try:
        reader = _unpacker(ctype, names, offset, count, stride)
        if _agrees(reader, ctype, names, offset, count, stride):
            return reader
    except (AttributeError, KeyError, TypeError, ValueError, struct.error):
        pass
    return _attribute_reader(ctype, names, offset, count, stride)


def _unpacker(ctype: Any, names: Sequence[str], offset: int, count: int, stride: int) -> Callable[[Any], tuple]:
    types = dict(ctype._fields_)
    fmt, pos = "=", 0
    for i in range(count):
        for name in names:
            descriptor = getattr(ctype, name)
            start = offset + i * stride + descriptor.offset
            if start < pos:
                raise ValueError(f"{name} is not after the previous field")
            fmt += f"{start - pos}x" + _code(types[name])
            pos = start + descriptor.size
    return struct.Struct(fmt).unpack_from


def _attribute_reader(ctype: Any, names: Sequence[str], offset: int, count: int,
                      stride: int) -> Callable[[Any], tuple]:
    getters = [attrgetter(name) for name in names]

    def read(holder: Any) -> tuple:
        base = ctypes.addressof(holder) + offset
        return tuple(get(ctype.from_address(base + i * stride)) for i in range(count) for get in getters)

    return read


def _agrees(reader: Callable[[Any], tuple], ctype: Any, names: Sequence[str], offset: int, count: int,
            stride: int) -> bool:
    """Whether ``reader`` reads what attribute access reads, on a buffer with distinct values in every field."""
    size = max(ctypes.sizeof(ctype), offset + count * stride)
    buffer = (ctypes.c_ubyte * size)()
    expected = []
    for i in range(count):
        item = ctype.from_buffer(buffer, offset + i * stride)
        for j, name in enumerate(names):
            value = 7 + 11 * i + j
            setattr(item, name, float(value) if _code(dict(ctype._fields_)[name]) in "fd" else value)
            expected.append(getattr(item, name))
    return tuple(reader(buffer)) == tuple(expected)
