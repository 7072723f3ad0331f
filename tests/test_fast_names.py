"""A long list of names in a one-line message (issue 52: a 301-name Parameter list was printed on one 17 kB line):
the first few and a count; the record keeps every name."""
from __future__ import annotations

import pytest

from mindguard._util.names import SHOWN_NAMES, summarized


@pytest.mark.fast
def test_a_few_names_are_shown_whole_and_many_are_cut_to_the_first_few_and_a_count():
    assert summarized(["a"]) == "a"
    few = [f"p{i}" for i in range(SHOWN_NAMES + 1)]
    assert summarized(few) == ", ".join(few)   # "and 1 more" would be no shorter
    many = [f"layer{i}.weight" for i in range(301)]
    text = summarized(many)
    assert text == "layer0.weight, layer1.weight, layer2.weight, layer3.weight, layer4.weight and 296 more", text
    assert len(text) < 120


def test_the_step_verdict_says_the_first_names_and_keeps_them_all():
    from mindguard.training.checks.finite import StepVerdict

    names = [f"layer{i}.weight" for i in range(301)]
    verdict = StepVerdict().add_nonfinite_params(names)
    assert verdict.kind == "nonfinite_params" and verdict.nonfinite == names
    assert verdict.message == f"parameters became non-finite: {summarized(names)}", verdict.message
