"""Frozen records: what @dataclass(frozen=True) generated for the resolver's and the ELF
reader's results, written out.

Importing dataclasses imports inspect (with ast, dis, tokenize, linecache), and each
@dataclass compiles its methods with exec(): together ~15 ms of each `seedance ldd` start
(-X importtime), whose whole budget is 5x ldd's 7-11 ms (issue 13).  A subclass lists its fields in
``_fields`` (repr order) and, when some are left out of == and hash() like
dataclasses.field(compare=False), the others in ``_compared``; it writes its own
``__init__`` (one dict, set at once: as fast as the generated one).  The behaviour is the
generated one: equality only with the same class, a hash of the compared fields, the same
repr, and AttributeError on assignment.  Instances keep a __dict__, as the dataclasses had.
"""
from __future__ import annotations

_new_dict = object.__setattr__


class FrozenRecord:
    __slots__ = ()
    _fields: tuple = ()
    _compared: tuple = ()  # set to _fields by __init_subclass__ unless the class names its own

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "_compared" not in cls.__dict__:
            cls._compared = cls._fields

    def _key(self) -> tuple:
        values = self.__dict__
        return tuple([values[name] for name in self._compared])

    def __eq__(self, other):
        if other.__class__ is self.__class__:
            return self._key() == other._key()
        return NotImplemented

    def __hash__(self):
        return hash(self._key())

    def __repr__(self) -> str:
        values = self.__dict__
        inner = ", ".join(f"{name}={values[name]!r}" for name in self._fields)
        return f"{self.__class__.__qualname__}({inner})"

    def __setattr__(self, name, value):
        raise AttributeError(f"cannot assign to field {name!r}")

    def __delattr__(self, name):
        raise AttributeError(f"cannot delete field {name!r}")

    def _asdict(self) -> dict:
        """field -> value, in field order (what dataclasses.asdict gives, one level deep;
        model._plain converts what the values hold)."""
        values = self.__dict__
        return {name: values[name] for name in self._fields}

    def _replace(self, **changes):
        """A copy with ``changes`` (dataclasses.replace)."""
        unknown = set(changes) - set(self._fields)
        if unknown:
            raise TypeError(f"{self.__class__.__name__} has no field {sorted(unknown)[0]!r}")
        copy = object.__new__(self.__class__)
        _new_dict(copy, "__dict__", {**self.__dict__, **changes})
        return copy
