"""Records written out: equality and repr from the fields `__match_args__` names.

`dataclasses` compiles each class's methods from source at import, about 1 ms of CPU each
even in compiled modules, and a start imports dozens (packets, Raft messages): the first
CONNACK of a node waits for them (issue 42). A record class names its fields in
`__match_args__` (and `__slots__ = __match_args__`: mypyc refuses `a = b = ...` in a class
body) and writes its `__init__`; it compares equal to a record
of the same class with equal fields and prints as a dataclass does, and like a mutable
dataclass it is unhashable. Compiled (broker/native.json) so that compiled records derive
from it natively; in broker/mqtt, which imports nothing else of the broker, so that the
packets can use it (Raft's messages do too).
"""

from typing import Any, ClassVar, TypeVar

R = TypeVar("R", bound="Record")


class Record:
    __slots__ = ()
    __match_args__: ClassVar[tuple[str, ...]] = ()

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return all(getattr(self, name) == getattr(other, name)
                   for name in type(self).__match_args__)

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}"
                           for name in type(self).__match_args__)
        return f"{type(self).__qualname__}({fields})"


def replaced(record: R, **changes: Any) -> R:
    """A copy of `record` with `changes`, as `dataclasses.replace` makes one (the fuzzer
    marks packets' properties so). Every record's `__init__` takes its fields by name."""
    fields = {name: getattr(record, name) for name in type(record).__match_args__}
    fields.update(changes)
    return type(record)(**fields)
