"""GPU and NPU: the same export compiled and run on the device, against the CPU device in f32. These run
only where OpenVINO reports the device (ov.Core().available_devices); elsewhere they are skipped with
the reason, never counted as passed. The NPU needs static shapes (the whole point of the export) and
may refuse integer weights (NITRO's finding), so it is tested with f16 weights as well as int8."""
import numpy as np
import pytest

from lowbit.openvino import available_devices
from lowbit.openvino.backend import OpenVINOModel
from lowbit.openvino.export import export
from tests.cli.test_api import write_hf_folder

DEVICES = available_devices()


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    return write_hf_folder(tmp_path_factory.mktemp("ovdev") / "hf")


@pytest.mark.parametrize("weights", ["f16", "int8"])
@pytest.mark.parametrize("device", ["GPU", "NPU"])
def test_device_matches_cpu(device, weights, hf_dir, tmp_path):
    if not any(d.split(".")[0] == device for d in DEVICES):
        pytest.skip(f"no OpenVINO {device} device on this machine (available: {', '.join(DEVICES)})")
    out = export(hf_dir, tmp_path / f"ov-{device}", weights=weights, max_seq_len=32, device=device, progress=False)
    cpu = OpenVINOModel(out, device="CPU", precision="f32")
    dev = OpenVINOModel(out, device=device)  # the device's own precision (f16 on GPU and NPU)
    ids = list(range(3, 19))
    want, got = cpu.logits(ids), dev.logits(ids)
    assert np.abs(got - want).max() < 0.02 * np.abs(want).max()  # f16 compute
    # prefill then decode (the T = 1 pipeline, after the state hand-over) along the CPU's greedy path
    cpu.reset()
    dev.reset()
    a, b = cpu.prefill(ids), dev.prefill(ids)
    for _ in range(4):
        assert np.abs(b - a).max() < 0.02 * np.abs(a).max()
        tok = int(a.argmax())
        a, b = cpu.decode(tok), dev.decode(tok)
    assert any((out / "cache").iterdir()), "nothing was cached for the device"
