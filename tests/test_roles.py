"""Role transforms: the grammar is checked when a binding is made, and applying one never leaks numpy errors."""

import numpy as np
import pytest

import torchlean_bridge as tlb
from torchlean_bridge.roles import Binding, RoleMap, apply_transform, transform_shape


@pytest.mark.parametrize("transform", ["flip", "permute:0,0", "reshape:a", "cast:bogus", "transpose:1"])
def test_invalid_transforms_are_refused_naming_the_key(transform):
    expected = (f"role map: binding `w` has an invalid transform step `{transform}` "
                "(allowed: transpose, permute:<axes>, reshape:<dims>, cast:<numpy dtype>)")
    for make in (lambda: Binding("w", 1, "weight", transform),
                 lambda: RoleMap.from_json([{"key": "w", "node": 1, "role": "weight", "transform": transform}])):
        with pytest.raises(tlb.BridgeError) as e:
            make()
        assert str(e.value) == expected


def test_transforms_apply_left_to_right_and_agree_with_their_shape():
    a = np.arange(6.0).reshape(2, 3)
    t = "transpose;reshape:3,1,2;cast:float32"
    out = apply_transform(t, a)
    assert out.dtype == np.float32 and out.shape == transform_shape(t, a.shape) == (3, 1, 2)
    assert np.array_equal(out.reshape(3, 2), a.T)


def test_a_transform_that_does_not_fit_the_tensor_is_a_bridge_error():
    with pytest.raises(tlb.BridgeError, match="cannot apply to a tensor of shape"):
        apply_transform("reshape:4,4", np.zeros(6))
