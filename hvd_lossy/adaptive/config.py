"""Configuration pieces of the controller: table specs and argument checks."""

import dataclasses

import numpy as np

__all__ = ["TableSpec", "table_specs", "check_int"]


@dataclasses.dataclass(frozen=True)
class TableSpec:
    """One embedding table: its name, rows (cardinality) and the rank that holds it."""

    name: str
    cardinality: int
    owner: int


def check_int(name, value, minimum):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def table_specs(tables, size):
    """Normalise the ``tables`` argument to a list of TableSpec (owners round-robin if absent)."""
    if isinstance(tables, dict):
        items = []
        for name, v in tables.items():
            card, owner = (v if isinstance(v, (tuple, list)) else (v, None))
            items.append((name, card, owner))
    elif isinstance(tables, (list, tuple)):
        items = []
        for t in tables:
            if isinstance(t, TableSpec):
                items.append((t.name, t.cardinality, t.owner))
            elif isinstance(t, dict):
                unknown = set(t) - {"name", "cardinality", "owner"}
                if unknown or "name" not in t or "cardinality" not in t:
                    raise ValueError(f"a table dict needs 'name' and 'cardinality' (and optionally "
                                     f"'owner'), got {t!r}")
                items.append((t["name"], t["cardinality"], t.get("owner")))
            elif isinstance(t, (tuple, list)) and len(t) in (2, 3):
                items.append((t[0], t[1], t[2] if len(t) == 3 else None))
            else:
                raise TypeError(f"a table must be a TableSpec, a dict or a (name, cardinality"
                                f"[, owner]) tuple, got {t!r}")
    else:
        raise TypeError(f"tables must be a dict name -> cardinality or a list of TableSpec, got "
                        f"{type(tables).__name__}")
    if not items:
        raise ValueError("tables must name at least one table, got none")
    specs, seen = [], set()
    for i, (name, card, owner) in enumerate(items):
        if not isinstance(name, str) or not name:
            raise ValueError(f"table names must be non-empty strings, got {name!r}")
        if name in seen:
            raise ValueError(f"table {name!r} is listed twice")
        seen.add(name)
        card = check_int(f"cardinality of table {name!r}", card, 1)
        owner = i % size if owner is None else check_int(f"owner of table {name!r}", owner, 0)
        if owner >= size:
            raise ValueError(f"owner of table {name!r} must be a rank < {size}, got {owner}")
        specs.append(TableSpec(name, card, owner))
    return specs
