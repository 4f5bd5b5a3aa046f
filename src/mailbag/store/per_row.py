"""Per-row values in one set-based UPDATE: the outcomes of a worker's batch of messages,
or of a deliverer's hook deliveries, each row given its own values by its id."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Column, ColumnElement, any_, bindparam, case, cast, func, literal
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.sql.elements import Grouping

from mailbag.store.transition import NOW


class PerRow:
    """Per-row values in one set-based UPDATE of the rows `ids` (by the table's `id`
    column): each `value` takes one value per id, in the order of `ids`.

    On PostgreSQL (`arrays`) every value is a named parameter, gathered in `params`: the
    ids and each column's values go as arrays (the row's value is
    `(values)[array_position(ids, id)]`), so the statement is the same for every batch of
    the same kind of decision: built and compiled once, prepared once by psycopg.
    Elsewhere literals: a `CASE id WHEN ... THEN ... END` and an IN list."""

    def __init__(
        self, ids: list[uuid.UUID], id_column: Column[Any], *, arrays: bool, now: datetime
    ) -> None:
        self.ids, self.id_column, self.arrays = ids, id_column, arrays
        self.params: dict[str, Any] = {}
        self.now: Any = NOW if arrays else now  # apply_transition gives NOW its value
        if arrays:
            self._ids = self._array("ids", ids, id_column.type)
            self._position = func.array_position(self._ids, id_column)

    def match(self) -> ColumnElement[bool]:
        """The rows of `ids`."""
        return self.id_column == any_(self._ids) if self.arrays else self.id_column.in_(self.ids)

    def bind(self, name: str, value: Any, type_: Any) -> ColumnElement[Any]:
        """One value for every row."""
        if not self.arrays:
            return literal(value, type_)
        self.params[name] = value
        return bindparam(name, type_=type_)

    def value(self, name: str, values: Sequence[Any], type_: Any, keep: Any = None) -> Any:
        """Each row's value; a row whose value is None keeps `keep` (the column's current
        value) when it is given."""
        if self.arrays:
            picked = Grouping(self._array(name, list(values), type_))[self._position]
            return picked if keep is None else func.coalesce(picked, keep)
        if len({repr(value) for value in values}) == 1:  # one value for the whole batch
            if keep is not None and values[0] is None:
                return keep
            return literal(values[0], type_)
        whens = {
            key: literal(value, type_)
            for key, value in zip(self.ids, values, strict=True)
            if keep is None or value is not None
        }
        otherwise = keep if keep is not None else literal(None, type_)
        return case(whens, value=self.id_column, else_=otherwise)

    def _array(self, name: str, values: list[Any], type_: Any) -> ColumnElement[Any]:
        array_type = ARRAY(type_)
        self.params[name] = values
        return cast(bindparam(name, type_=array_type), array_type)
