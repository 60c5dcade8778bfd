"""ggml RPC without a server: host:port lists, and where llama.cpp puts each layer
(engine/rpc/split.py restates llama_model_base::load_tensors; tests/engine/test_rpc.py
checks the restatement against what the real load reports)."""

from __future__ import annotations

import pytest

from engine.errors import RpcError
from engine.rpc import parse_endpoints, split


def test_endpoints_need_a_port_and_are_named_once():
    assert [str(e) for e in parse_endpoints("10.0.0.2:50052, [::1]:50053")] == ["10.0.0.2:50052", "[::1]:50053"]
    for bad in ("10.0.0.2", "host:", "host:99999", ":50052"):
        with pytest.raises(RpcError, match="host:port"):
            parse_endpoints(bad)
    with pytest.raises(RpcError, match="twice"):
        parse_endpoints("a:1,a:1")
    with pytest.raises(RpcError, match="at most 16"):
        parse_endpoints([f"h{i}:1" for i in range(17)])


def test_layers_go_in_order_by_share_and_the_output_layer_with_the_last():
    assert split.layer_devices(5, [1, 1, 1]) == [0, 0, 1, 1, 2, 2]
    assert split.layer_devices(5, [1, 0, 0]) == [0, 0, 0, 0, 0, 0]
    assert split.layer_devices(5, [1, 1], n_gpu_layers=2) == [split.CPU] * 4 + [0, 1]  # offload takes the last


def test_the_tail_is_kept_on_the_last_device_whatever_the_shares():
    for shares in ([10, 10, 1], [1, 0, 0], [5, 0.001], [1, 1, 1, 1]):
        kept = split.keep_tail_local(shares, 9, 2)
        placed = split.layer_devices(9, kept)
        assert placed[7:] == [len(shares) - 1] * 3, (shares, kept, placed)  # blocks 7-8 and the output
        assert placed[0] == 0  # the first device still gets the first block
    assert split.keep_tail_local([1, 1, 10], 9, 2) == [1, 1, 10]  # already so: unchanged
