"""`hf_msv.evaluation.records.Record`: the one JSON ↔ dataclass conversion of the evaluation's and the
reproduction's typed results (their committed files round-trip in tests/test_study_results.py and
tests/test_reproduction_results.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import ClassVar

from hf_msv.evaluation.records import MISSING, Record, coded, list_of, mapping_of, record, rest


@dataclass
class Point(Record):
    x: float | None = None
    y: float | None = MISSING


@dataclass
class Row(Record):
    name: str = ""
    lam: float | None = coded(key="lambda")
    points: list[Point] = coded(list_of(record(Point)), default_factory=list)
    by_method: dict[str, Point] = rest(record(Point), accepts=lambda value: isinstance(value, dict))


@dataclass
class Quiet(Record):
    WRITE_NONE: ClassVar[bool] = False

    a: int | None = None
    b: dict[str, Point] | None = coded(mapping_of(record(Point)))
    c: list = field(default_factory=list)


def test_a_record_writes_back_what_it_read_keys_in_order():
    data = {"MSV": {"x": 1.0}, "lambda": None, "future": 3, "points": [{"y": 2.0, "x": 0.5}, None], "name": "r"}
    row = Row.from_json(data)
    assert row.lam is None and row.name == "r" and row.extra == {"future": 3}
    assert row.points[0] == Point(0.5, 2.0) and row.points[1] is None and row.by_method["MSV"].y is MISSING
    assert json.dumps(row.to_json()) == json.dumps(data)
    assert Row.from_dict(data).to_dict() == data  # the evaluation's names for the same conversion


def test_a_key_the_json_lacks_is_not_written_back_unless_set_since():
    row = Row.from_json({"name": "r"})
    assert row.to_json() == {"name": "r"} and not row.has("lambda") and not row.has("points")
    row.lam = 0.9
    assert row.to_json() == {"name": "r", "lambda": 0.9} and row.has("lambda")


def test_a_record_built_in_code_writes_its_fields_in_declaration_order():
    row = Row("r", None, [Point(1.0)], {"MSV": Point(2.0, 3.0)})
    assert row.to_json() == {"name": "r", "lambda": None, "points": [{"x": 1.0}], "MSV": {"x": 2.0, "y": 3.0}}
    assert list(row.to_json()) == ["name", "lambda", "points", "MSV"]
    # without WRITE_NONE, None fields are left out
    assert Quiet(b={"p": Point(None)}).to_json() == {"b": {"p": {"x": None}}, "c": []}
    assert not Quiet().has("a") and Quiet(a=1).has("a")


def test_rest_takes_only_the_values_it_accepts():
    row = Row.from_json({"MSV": {"x": 1.0}, "note": "kept as is"})
    assert set(row.by_method) == {"MSV"} and row.extra == {"note": "kept as is"}
    assert row.to_json() == {"MSV": {"x": 1.0}, "note": "kept as is"}
