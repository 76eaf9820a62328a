"""With one CUDA device in the process, the ops' memo keys hold ``is_cuda`` for a tensor's device
(``ops/_common.SOLE_GPU``): a tensor off the GPU, in a configuration stored for CUDA tensors, still
gets the device error, through the generated key and through the hand-written pair keys alike."""

from __future__ import annotations

import pytest


def test_a_stored_configuration_refuses_a_tensor_off_the_gpu():
    import torch

    from tilebin.ops import _common, moe, quant
    from tilebin.runtime import ArgumentError

    if torch.cuda.device_count() != 1:
        pytest.skip(f"{torch.cuda.device_count()} CUDA devices visible: keys hold t.device (the multi-device tests)")
    x = torch.randn(4, 256, device="cuda", dtype=torch.bfloat16)
    for _ in range(2):  # the second call replays the stored configuration
        out, sf = quant.per_token_cast(x, "e4m3", 128)
    assert _common.SOLE_GPU.on
    with pytest.raises(ArgumentError, match="x is on cpu, not a CUDA device"):
        quant.per_token_cast(x.cpu(), "e4m3", 128)
    for _ in range(2):
        back = quant.cast_back((out, sf), "bf16", (1, 128))
    with pytest.raises(ArgumentError, match="sf is on cpu, not a CUDA device"):
        quant.cast_back((out, sf.cpu()), "bf16", (1, 128))
    assert torch.equal(quant.cast_back((out, sf), "bf16", (1, 128)), back)  # the good call is unchanged
    scores = torch.randn(4, 64, device="cuda")
    for _ in range(2):
        moe.topk_gate(scores, 4)
    with pytest.raises(ArgumentError, match="must be on a CUDA device, got cpu"):
        moe.topk_gate(scores.cpu(), 4)
