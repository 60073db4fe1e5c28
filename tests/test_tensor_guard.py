"""The compiled structure guard: accepts exactly the structure it was built from."""
import pytest
import torch

from dsv4ops import tensor_guard

pytestmark = pytest.mark.skipif(not tensor_guard.AVAILABLE, reason="this torch has no usable TensorGuards; "
                                "calls use the Python structure key (tests/test_dispatch.py covers that path)")


def test_guard_accepts_its_structure_and_rejects_every_change():
    q, idx = torch.randn(4, 8, 16), torch.randint(0, 9, (4, 32), dtype=torch.int32)
    check = tensor_guard.guard_for([q, idx, tensor_guard.absent(2)])
    assert check(torch.randn(4, 8, 16), idx.clone(), tensor_guard.absent(2))        # values do not matter
    changed_q = [q.to(torch.bfloat16), torch.randn(5, 8, 16), torch.randn(4, 16, 8).transpose(1, 2),
                 torch.randn(4, 8, 32)[..., :16], q.to("meta"), q.clone().requires_grad_()]
    for other in changed_q:
        assert not check(other, idx, tensor_guard.absent(2))
    assert not check(q, idx, torch.empty(0))                                            # a tensor where None was


def test_absent_placeholders_are_distinct_and_stable():
    assert tensor_guard.absent(0) is tensor_guard.absent(0)
    assert tensor_guard.absent(0) is not tensor_guard.absent(1)
    assert tensor_guard.absent(3).device.type == "meta"
