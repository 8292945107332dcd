"""gradd.torch's device rules (gradd/_cuda.py) that need no GPU: one device
per module, torch's device_ids / output_device rules, inputs moved to the
module's device."""
import pytest
import torch
from torch import nn

from gradd import _cuda


def test_a_cpu_module_takes_no_device_ids():
    assert _cuda.check_device_ids(torch.device("cpu"), None, None) == (None, None)
    with pytest.raises(ValueError, match="device_ids and output_device must be None"):
        _cuda.check_device_ids(torch.device("cpu"), [0], None)


def test_a_cuda_module_takes_exactly_its_device():
    dev = torch.device("cuda", 1)
    assert _cuda.check_device_ids(dev, None, None) == ([1], 1)
    assert _cuda.check_device_ids(dev, [1], 1) == ([1], 1)
    assert _cuda.check_device_ids(dev, [torch.device("cuda", 1)], "cuda:1") == ([1], 1)
    with pytest.raises(ValueError, match=r"the module is on cuda:1"):
        _cuda.check_device_ids(dev, [0], None)
    with pytest.raises(ValueError, match=r"the module is on cuda:1"):
        _cuda.check_device_ids(dev, [0, 1], None)
    with pytest.raises(ValueError, match=r"output_device=0"):
        _cuda.check_device_ids(dev, [1], 0)


def test_module_device_needs_one_device():
    assert _cuda.module_device(nn.Linear(2, 2)) == torch.device("cpu")
    mixed = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2, device="meta"))
    with pytest.raises(NotImplementedError, match=r"'0.weight' is on cpu but '1.weight' is on meta"):
        _cuda.module_device(mixed)
    with pytest.raises(NotImplementedError, match="supports cpu and cuda tensors, not meta"):
        _cuda.module_device(nn.Linear(2, 2, device="meta"))


def test_to_device_moves_nested_inputs():
    x = {"a": [torch.ones(1), (torch.zeros(2), 3)], "b": "text"}
    y = _cuda.to_device(x, torch.device("meta"))
    assert y["a"][0].device.type == "meta"
    assert y["a"][1][0].device.type == "meta" and y["a"][1][1] == 3
    assert y["b"] == "text"


def test_cpu_streams_are_zero():
    assert _cuda.stream_handle(torch.device("cpu")) == 0
