"""mindguard._util.names: two collections keyed by name compared, for the messages about a kept state, a capture
or saved parameters that do not fit the network at hand."""
from __future__ import annotations

import pytest

from mindguard._util.names import compare_by_name

pytestmark = pytest.mark.fast


def test_what_only_one_side_has_and_what_differs_in_each_sides_order() -> None:
    before = {"head.weight": [1, 6], "norm.x": [1], "embedding.table": [60, 16]}
    after = {"embedding.table": [60, 8], "head.weight": [1, 6], "proj.bias": [1]}
    differ = compare_by_name(before, after)
    assert differ.only_before == ["norm.x"] and differ.only_after == ["proj.bias"]
    assert differ.changed == ["embedding.table"]
    assert differ


def test_the_same_names_and_values_in_another_order_are_no_difference() -> None:
    differ = compare_by_name({"a": 1, "b": [2]}, {"b": [2], "a": 1})
    assert not differ and differ.only_before == differ.only_after == differ.changed == []
