"""Trusted constructors: build frozen attrs records from values already checked elsewhere.

A record read back from a store row or decoded from a wire frame has had every field checked
by its reader; running the attrs validators and converters again would check each field a
second time on the hottest paths (every transition, every inbound frame).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import attrs

_T = TypeVar("_T")


def trusted_constructor(cls: type[_T]) -> Callable[..., _T]:
    """Return a constructor of the slotted attrs class ``cls`` taking every field positionally,
    in declaration order, and skipping its validators and converters.

    The caller must pass values that already have their field's type and normal form: only
    readers that checked them (a store's row decoder, a wire frame reader) may use it.  The
    constructor is generated straight-line (one slot store per field) because a generic loop
    costs more than the validators it saves (see benchmarks/README.md); the generated source
    contains nothing but the class's own field names.  Raises ``TypeError`` for a class that
    is not a slotted attrs class.
    """
    if not attrs.has(cls) or "__slots__" not in vars(cls):
        raise TypeError(f"{cls.__name__} is not a slotted attrs class")
    names = [field.name for field in attrs.fields(cls)]
    lines = [f"def make({', '.join(names)}):", "    instance = new(cls)"]
    lines += [f"    set_{name}(instance, {name})" for name in names]
    lines.append("    return instance")
    namespace: dict[str, Any] = {"new": object.__new__, "cls": cls}
    for name in names:
        # The slot's member descriptor stores the value without the frozen __setattr__.
        namespace[f"set_{name}"] = getattr(cls, name).__set__
    exec("\n".join(lines), namespace)
    make: Callable[..., _T] = namespace["make"]
    return make
