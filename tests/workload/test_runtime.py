import pytest
import torch

from harness.errors import ConfigError
from harness.workload.model import build_chunks, chunk_layouts
from harness.workload.pipeline import pipeline_order
from harness.workload.runtime import build_groups, cuda_device_index, pipeline_channels

from tests.workload.factories import TINY, make_case


def test_single_rank_groups_are_inactive():
    g = build_groups(make_case().layout, 0, torch.device("cpu"))
    assert not g.world.active and not g.pool.active and not g.cp_group(1).active
    assert g.p2p == {}
    with pytest.raises(ValueError, match="no CP group of size 2"):
        g.cp_group(2)


def test_pipeline_channels_are_one_way_and_cover_the_wrap():
    assert pipeline_channels(1) == []
    assert pipeline_channels(2) == [(0, 1, "act"), (1, 0, "grad"), (1, 0, "act"), (0, 1, "grad")]
    assert (3, 0, "act") in pipeline_channels(4) and (0, 3, "grad") in pipeline_channels(4)


def test_chunks_interleave_layers_over_virtual_stages():
    lay = chunk_layouts(8, pp=2, vpp=2, pp_rank=1)
    assert [(list(c.layers), c.first, c.last) for c in lay] == [([2, 3], False, False), ([6, 7], False, True)]
    with pytest.raises(ValueError, match="divisible by pp\\*vpp"):
        chunk_layouts(6, 2, 2, 0)


def test_weights_do_not_depend_on_the_layout():
    m = make_case().model
    whole = build_chunks(m, seed=5)[0]
    part = build_chunks(m, seed=5, pp=2, vpp=2, pp_rank=1, ep_size=2, ep_rank=1)
    ref = dict(whole.named_parameters())
    layer = part[1].layer_ids[0]  # layer 3
    for name, p in part[1].layers[0].named_parameters():
        full = ref[f"layers.{layer}.{name}"]
        if "experts." in name:
            full = full[TINY["experts"] // 2 :]
        assert torch.equal(p, full), name


def test_unschedulable_microbatch_count_is_a_config_error():
    assert pipeline_order(1, 1, 1, 0, 2) == (1, -1, 1, -1)
    with pytest.raises(ConfigError, match="pipeline schedule"):
        pipeline_order(2, 2, 2, 0, 3)


def test_each_rank_gets_its_own_gpu_or_a_clear_error():
    assert [cuda_device_index(k, 4) for k in range(4)] == [0, 1, 2, 3]
    assert cuda_device_index(3, 1) == 0  # Slurm bound one GPU to this task
    # 4 ranks per node on 2 visible GPUs: an error naming the cause, not two ranks on one GPU
    with pytest.raises(ConfigError, match="LOCAL_RANK=3 but this process sees only 2 CUDA GPU"):
        cuda_device_index(3, 2)
