"""One upload per microbatch: host tensors to the device as views of one buffer, same bits."""

from __future__ import annotations

import pytest
import torch

from harness.workload.transfer import to_device


def _host() -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    return (
        torch.randint(0, 1000, (37,), generator=g),  # token ids
        torch.rand(37, generator=g) < 0.7,  # valid (bool)
        torch.tensor([0.125, 3.0e-4], dtype=torch.float32),  # scalars
        torch.tensor([0, 5, 9, 9], dtype=torch.int32),  # cu_seqlens
        torch.zeros(1, dtype=torch.int64),  # a one-element placeholder
        torch.tensor(2.5),  # 0-dim
        torch.randn(3, 4, generator=g)[:, 1:],  # not contiguous
    )


def test_on_the_cpu_the_tensors_stay_as_they_are() -> None:
    host = _host()
    got = to_device(host, torch.device("cpu"))
    assert all(a is b for a, b in zip(got, host))


@pytest.mark.cuda
def test_one_buffer_one_copy_same_bits_on_cuda() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    host = _host()
    got = to_device(host, torch.device("cuda"))
    torch.cuda.synchronize()
    base = got[0].untyped_storage().data_ptr()
    for h, d in zip(host, got):
        assert d.is_cuda and d.dtype == h.dtype and d.shape == h.shape
        assert d.untyped_storage().data_ptr() == base  # every tensor is a view of the one upload
        assert torch.equal(d.cpu(), h)
        assert d.data_ptr() % 16 == 0


@pytest.mark.cuda
def test_device_tensors_are_refused() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU to have a device tensor")
    with pytest.raises(ValueError, match="uploads host tensors"):
        to_device((torch.zeros(2, device="cuda"),), torch.device("cuda"))
