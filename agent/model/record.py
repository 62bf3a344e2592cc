"""Records: what @dataclass generated, written out, for the classes every command builds
(the resolver's and the ELF reader's results, facts, findings, rules, fix plans).

Importing dataclasses imports inspect (with ast, dis, tokenize, linecache), and each
@dataclass compiles its methods with exec(): a noticeable part of the start of every short
command (`seedance ldd`, a `seedance fix` of one library).  A subclass lists its fields in
``_fields`` (__init__ order); when some are left out of == and hash() like
dataclasses.field(compare=False), the others in ``_compared``; when some are left out of
repr() (field(repr=False)), the others in ``_shown``.  It writes its own ``__init__`` (a
default_factory is the NEW marker: a new container per instance, while an explicit None
stays None, as with dataclasses), which ends with ``set_fields(self, {...every field...})``.
The behaviour is the generated one: equality only with the same class over the compared
fields, and the same repr.  FrozenRecord (frozen=True) hashes the compared fields and raises
AttributeError on assignment; Record (a plain @dataclass) is mutable and unhashable.
Instances keep a __dict__, as the dataclasses had.

How an instance gets its fields is this module's business alone: a record's own __init__
calls set_fields(), and code that makes records by the thousand in a loop (the resolver's
version checks, the facts of a closure, the C reader's ElfInfo) calls ``Cls._build(values)``,
which makes the instance without running __init__.
"""
from __future__ import annotations

# the instance's __dict__ set in one step: a frozen record's own __setattr__ refuses
# assignment, and one dict built by the caller is cheaper than a store per field
_new_dict = object.__setattr__
_new_object = object.__new__


def set_fields(record, values: dict) -> None:
    """For a record class's own __init__: ``values`` (every field by name, in ``_fields``
    order) become the fields of ``record``, a frozen one included."""
    _new_dict(record, "__dict__", values)


def _build(cls, values: dict):
    """An instance of ``cls`` whose fields are ``values`` (every field by name, in
    ``_fields`` order, each as __init__ would have made it), made without running __init__:
    for loops that make thousands of records whose fields are already at hand."""
    record = _new_object(cls)
    _new_dict(record, "__dict__", values)
    return record


NEW = object()  # a default meaning "a new empty list/dict for this instance" (default_factory)


class FrozenRecord:
    __slots__ = ()
    _fields: tuple = ()
    _compared: tuple = ()  # set to _fields by __init_subclass__ unless the class names its own
    _shown: tuple = ()  # the same, for repr()

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        _complete(cls)

    _build = classmethod(_build)

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
        inner = ", ".join(f"{name}={values[name]!r}" for name in self._shown)
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
        return self.__class__._build({**self.__dict__, **changes})


def _complete(cls) -> None:
    if "_compared" not in cls.__dict__:
        cls._compared = cls._fields
    if "_shown" not in cls.__dict__:
        cls._shown = cls._fields


class Record:
    """A mutable record: what a plain @dataclass generated (eq over the compared fields with
    the same class only, __hash__ None, the repr of the shown fields)."""
    __slots__ = ()
    _fields: tuple = ()
    _compared: tuple = ()
    _shown: tuple = ()
    __hash__ = None

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        _complete(cls)

    _build = classmethod(_build)

    def __eq__(self, other):
        if other.__class__ is self.__class__:
            return [getattr(self, f) for f in self._compared] == [getattr(other, f) for f in self._compared]
        return NotImplemented

    def __repr__(self) -> str:
        inner = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._shown)
        return f"{self.__class__.__qualname__}({inner})"

    def _asdict(self) -> dict:
        return {name: getattr(self, name) for name in self._fields}

    def _replace(self, **changes):
        """A copy with ``changes`` (dataclasses.replace: a shallow copy, the rest shared)."""
        unknown = set(changes) - set(self._fields)
        if unknown:
            raise TypeError(f"{self.__class__.__name__} has no field {sorted(unknown)[0]!r}")
        copy = object.__new__(self.__class__)
        copy.__dict__.update(self.__dict__)
        copy.__dict__.update(changes)
        return copy
