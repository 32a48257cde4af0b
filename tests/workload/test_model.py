"""Model construction: the keyed initialisation writes every parameter, the same bits however the
chunk is built (meta then CPU storage, any number of threads)."""

import pytest
import torch

from harness.spec.presets import resolve_model
from harness.spec.schema import ModelSpec
from harness.workload.model import ModelChunk, build_chunk, chunk_layouts, init_chunk


def _model():
    return resolve_model(ModelSpec(preset="tiny", layers=4))


def test_a_chunk_built_on_meta_holds_bitwise_the_weights_of_a_cpu_built_one():
    m = _model()
    for pp_rank in (0, 1):
        for index, lay in enumerate(chunk_layouts(m.layers, 2, 1, pp_rank)):
            want = ModelChunk(m, lay.layers, lay.first, lay.last, 2, 1, index)  # default init, then keyed
            init_chunk(want, m, 7, first_expert=m.experts // 2)
            got = build_chunk(m, 7, lay, index, ep_size=2, ep_rank=1)
            sw, sg = want.state_dict(), got.state_dict()
            assert sw.keys() == sg.keys()
            for k in sw:
                assert torch.equal(sw[k], sg[k]), k
            assert all(p.requires_grad and p.device.type == "cpu" for p in got.parameters())


def test_threads_give_the_same_bits():
    m = _model()
    lay = chunk_layouts(m.layers, 1, 1, 0)[0]
    one, many = (ModelChunk(m, lay.layers, True, True) for _ in range(2))
    init_chunk(one, m, 3, threads=1)
    init_chunk(many, m, 3, threads=4)
    for (k, a), b in zip(one.state_dict().items(), many.state_dict().values()):
        assert torch.equal(a, b), k


def test_a_parameter_init_chunk_does_not_know_is_refused_by_name():
    m = _model()
    lay = chunk_layouts(m.layers, 1, 1, 0)[0]
    chunk = ModelChunk(m, lay.layers, True, True)
    chunk.layers[0].extra = torch.nn.Parameter(torch.zeros(3))
    with pytest.raises(RuntimeError, match=r"layers\.0\.extra"):
        init_chunk(chunk, m, 3)
