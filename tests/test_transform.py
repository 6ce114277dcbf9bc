"""The typed role Transform: one parser, one composition rule, the on-disk spelling of docs/formats.md."""

from __future__ import annotations

import numpy as np
import pytest

from torchlean_bridge.errors import BridgeError
from torchlean_bridge.roles import Binding, Step, Transform, apply_transform

SPELLINGS = ["transpose", "permute:2,0,1", "reshape:3,1,1", "cast:float32", "permute:1,0,2;reshape:6,4;cast:float64"]


@pytest.mark.parametrize("text", SPELLINGS)
def test_parse_and_text_round_trip(text: str) -> None:
    assert Transform.parse(text).text == text


@pytest.mark.parametrize("text", ["transpose:1", "permute:0,0", "reshape:-1,2", "cast:object", "flip", "permute:a"])
def test_invalid_steps_are_refused_naming_the_binding(text: str) -> None:
    with pytest.raises(BridgeError, match=r"role map: binding `w` has an invalid transform step"):
        Binding("w", 0, "weight", text)


def test_composition_is_one_rule() -> None:
    t = Transform()
    assert t.then("transpose").then("transpose").text is None  # two swaps cancel
    assert t.then(Step("permute", (1, 2, 0))).then(Step("permute", (1, 2, 0))).text == "permute:2,0,1"
    assert t.then(Step("permute", (1, 0))).text == "transpose"  # the 2-D swap has one spelling
    assert t.then(Step("reshape", (6,))).then(Step("reshape", (2, 3))).text == "reshape:2,3"  # last reshape wins
    assert t.then(Step("reshape", (2, 3)), shape=(2, 3)).text is None  # a reshape to the same shape is nothing
    assert t.then("cast:float32").then("cast:float64").text == "cast:float32;cast:float64"  # casts stay


def test_of_layout_composes_a_traced_chain() -> None:
    chain = [("permute", (1, 0)), ("reshape", (2, 3)), ("permute", (1, 0)), ("permute", (1, 0))]
    assert Transform.of_layout(chain, (3, 2)).text == "transpose"  # reshape to the current shape drops


@pytest.mark.parametrize("text", SPELLINGS[:3] + [SPELLINGS[4]])
def test_composed_steps_apply_like_the_steps_one_by_one(text: str) -> None:
    rng = np.random.default_rng(0)
    shape = {"transpose": (3, 4), "reshape:3,1,1": (3,)}.get(text, (4, 2, 3) if "2,0,1" in text else (2, 4, 3))
    a = rng.normal(size=shape)
    composed = Transform()
    for step in Transform.parse(text).steps:
        composed = composed.then(step)
    expected = a
    for step in text.split(";"):
        expected = apply_transform(step, expected)
    np.testing.assert_array_equal(composed.apply(a), expected)
    assert composed.shape(shape) == expected.shape
