"""Rank placement and per-rank memory plans on recorded multi-socket machines.

No processes: ``plan_ranks`` is what each rank computes before loading, for every
rank at once, on the sysfs trees in ``fixtures/sysfs``.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest
import torch
from glowlm.config import EngineConfig
from glowlm.engine.memory import GIB, plan_memory, plan_ranks
from glowlm.errors import ConfigError, MemoryPlanError
from glowlm.model_loader.loader import read_model_dir
from glowlm.runtime import topology
from glowlm.testing.tiny_models import make_tiny_model

SYSFS = Path(__file__).parent / "fixtures" / "sysfs"
BIG = "MemTotal: 999999999 kB\nMemAvailable: 999999999 kB\n"  # the node is the limit


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model("llama", tmp_path_factory.mktemp("m") / "llama")


def cfg(tiny: Path, **kw: object) -> EngineConfig:
    return dataclasses.replace(EngineConfig(model=str(tiny)), **kw)  # type: ignore[arg-type]


def test_two_sockets_tp2_one_rank_per_node(tiny: Path) -> None:
    t = topology.read(SYSFS / "two-socket-skylake-smt")
    info = read_model_dir(tiny)
    plans = plan_ranks(info, torch.float32, cfg(tiny, tensor_parallel_size=2), 1024, t,
                       meminfo=BIG)
    assert [p.available_source for p in plans] == ["NUMA node 0 free memory",
                                                   "NUMA node 1 free memory"]
    single = plan_memory(info, torch.float32, cfg(tiny), 1024, topo=t, node=0, meminfo=BIG)
    # Layers split in two; the vocab-parallel embedding and LM head too.
    assert abs(plans[0].weights_bytes * 2 - single.weights_bytes) <= 2
    assert plans[0].kv_bytes_per_token * 2 == single.kv_bytes_per_token  # KV heads / TP


def test_four_nodes_tp2_pp2_one_rank_per_node(tiny: Path) -> None:
    from glowlm.runtime import binding

    t = topology.read(SYSFS / "two-socket-snc2")
    placement = binding.plan(t, num_ranks=4)
    assert [r.node for r in placement.ranks] == [0, 1, 2, 3]
    plans = plan_ranks(read_model_dir(tiny), torch.float32,
                       cfg(tiny, tensor_parallel_size=2, pipeline_parallel_size=2), 1024, t,
                       meminfo=BIG)
    assert [p.available_bytes for p in plans] == [n.available_bytes for n in t.nodes]
    # Each stage caches its own layer only: a quarter of one rank's TP=1 KV per token.
    single = plan_memory(read_model_dir(tiny), torch.float32, cfg(tiny), 1024, topo=t, node=0,
                         meminfo=BIG)
    assert plans[0].kv_bytes_per_token * 4 == single.kv_bytes_per_token


def test_a_node_without_cpus_gets_no_rank(tiny: Path, tmp_path: Path) -> None:
    """A memory-only node (CXL, HBM in flat mode): ranks go to the nodes with CPUs."""
    root = tmp_path / "sysfs"
    shutil.copytree(SYSFS / "two-socket-snc2", root)
    node = root / "devices/system/node/node4"
    shutil.copytree(root / "devices/system/node/node3", node)
    (node / "cpulist").write_text("\n")
    meminfo = (node / "meminfo").read_text().replace("Node 3", "Node 4")
    (node / "meminfo").write_text(meminfo)
    t = topology.read(root)
    assert len(t.nodes) == 5
    plans = plan_ranks(read_model_dir(tiny), torch.float32, cfg(tiny, tensor_parallel_size=4),
                       1024, t, meminfo=BIG)
    assert [p.available_source for p in plans] == [f"NUMA node {i} free memory"
                                                   for i in range(4)]


def test_a_plan_that_does_not_fit_its_node_names_rank_node_and_numbers(tiny: Path) -> None:
    t = topology.read(SYSFS / "two-socket-skylake-smt")
    node1 = t.nodes[1].available_bytes
    with pytest.raises(MemoryPlanError) as err:
        plan_ranks(read_model_dir(tiny), torch.float32,
                   cfg(tiny, tensor_parallel_size=2, kv_cache_space_gib=node1 / GIB + 1), 1024,
                   t, meminfo=BIG)
    msg = str(err.value)
    assert "does not fit in memory: rank 0 of 2 (NUMA node 0) needs" in msg
    assert "NUMA node 0 free memory" in msg and "GLOWLM_CPU_KVCACHE_SPACE to at most" in msg


def test_more_ranks_than_cores_is_refused_with_auto_binding(tiny: Path) -> None:
    t = topology.read(SYSFS / "kvm-epyc-2vcpu")
    with pytest.raises(ConfigError, match="share NUMA node 0, which has only 2"):
        plan_ranks(read_model_dir(tiny), torch.float32, cfg(tiny, tensor_parallel_size=4),
                   1024, t, meminfo=BIG)


def test_ranks_sharing_a_node_share_its_memory(tiny: Path) -> None:
    t = topology.read(SYSFS / "two-socket-snc2")
    plans = plan_ranks(read_model_dir(tiny), torch.float32, cfg(tiny, tensor_parallel_size=8),
                       1024, t, meminfo=BIG)  # 8 ranks on 4 nodes: two per node
    assert plans[0].available_bytes == t.nodes[0].available_bytes // 2
    assert "shared by 2 ranks" in plans[0].available_source


def test_explicit_lists_are_validated_per_rank(tiny: Path) -> None:
    t = topology.read(SYSFS / "two-socket-skylake-smt")
    info = read_model_dir(tiny)
    plans = plan_ranks(info, torch.float32, cfg(tiny, tensor_parallel_size=2), 1024, t,
                       bind="0-15|16-31", meminfo=BIG)
    assert [p.available_source for p in plans] == ["NUMA node 0 free memory",
                                                   "NUMA node 1 free memory"]
    with pytest.raises(ConfigError, match="has 1 CPU list"):
        plan_ranks(info, torch.float32, cfg(tiny, tensor_parallel_size=2), 1024, t,
                   bind="0-31", meminfo=BIG)
