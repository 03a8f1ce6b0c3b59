"""The real SGLang server split over 2 CPU ranks with a profile: --pp-size 2, --tp-size 2 and
--tp-size 2 over two launchers (--nnodes 2), on loopback. Greedy output equals the
single-process server's; every rank logs its layer range; different profiles on the two nodes
make both refuse at start-up. The model is SmolLM2-135M rewritten to split
(``parallel_model.py``: same function, 12/4 heads, untied lm_head)."""

from __future__ import annotations

import json
import re
import urllib.request

import pytest
from tiny_profiles import model_profile

from kvtuner.profile import save_profile
from kvtuner.quant import QuantSpec

pytestmark = pytest.mark.sglang
pytest.importorskip("sglang")

PROMPTS = ("The capital of France is", "def fibonacci(n):")
BIND = {"SGLANG_CPU_OMP_THREADS_BIND": "0|1"}  # 2 ranks, 1 NUMA node: one core per rank
REFUSE_TIMEOUT = 300


@pytest.fixture(scope="module")
def model_dir():
    from parallel_model import splittable_copy
    from sglang_server import CACHE, smollm2_hf_dir

    return splittable_copy(smollm2_hf_dir(), CACHE / "smollm2-135m-split2")


@pytest.fixture(scope="module")
def profiles(model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("profiles")
    paths = {}
    for bits in (4, 8):
        paths[bits] = out / f"kv{bits}.json"
        save_profile(model_profile(model_dir, QuantSpec(bits), QuantSpec(bits)), paths[bits])
    return paths


def greedy(url: str) -> list[str]:
    texts = []
    for prompt in PROMPTS:
        body = {"text": prompt, "sampling_params": {"temperature": 0, "max_new_tokens": 16}}
        req = urllib.request.Request(
            url + "/generate", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=300) as r:
            texts.append(json.loads(r.read())["text"])
    return texts


def server(model_dir, profile, *flags, log=None):
    from sglang_server import SGLangServer

    srv = SGLangServer(model_dir, "--kvtuner-profile", str(profile), *flags, log_path=log)
    srv.env.update(BIND)
    return srv


@pytest.fixture(scope="module")
def single_output(model_dir, profiles):
    with server(model_dir, profiles[8]) as srv:
        return greedy(srv.url)


def pool_layers(log: str) -> list[tuple[int, int]]:
    """(first, last) global layer of every rank's pool line."""
    found = re.findall(r"kvtuner pool: profile \w+, layers (\d+)\.\.(\d+) of 30", log)
    return sorted((int(a), int(b)) for a, b in found)


def test_pp2_serves_same_greedy_output_each_stage_its_layers(model_dir, profiles, single_output):
    with server(model_dir, profiles[8], "--pp-size", "2") as srv:
        assert greedy(srv.url) == single_output
        log = srv.log_text()
    assert pool_layers(log) == [(0, 14), (15, 29)]
    assert re.search(r"PP1\] kvtuner pool: .*packed KV bytes: [1-9]", log)


def test_tp2_serves_same_greedy_output(model_dir, profiles, single_output):
    with server(model_dir, profiles[8], "--tp-size", "2") as srv:
        assert greedy(srv.url) == single_output
        log = srv.log_text()
    assert pool_layers(log) == [(0, 29), (0, 29)]  # each TP rank: all layers, its 2 KV heads


def two_nodes(model_dir, profile0, profile1, tmp_path):
    from sglang_server import free_port

    addr = f"127.0.0.1:{free_port()}"
    common = ("--tp-size", "2", "--nnodes", "2", "--dist-init-addr", addr)
    node0 = server(model_dir, profile0, *common, "--node-rank", "0", log=tmp_path / "n0.log")
    node1 = server(model_dir, profile1, *common, "--node-rank", "1", log=tmp_path / "n1.log")
    return node0, node1


def test_tp2_over_two_launchers_serves_same_greedy_output(
    model_dir, profiles, single_output, tmp_path
):
    node0, node1 = two_nodes(model_dir, profiles[8], profiles[8], tmp_path)
    try:
        node1.launch()
        node0.start(attempts=1)
        assert greedy(node0.url) == single_output
        logs = node0.log_text() + node1.log_text()
    finally:
        node0.stop()
        node1.stop()
    assert pool_layers(logs) == [(0, 29), (0, 29)]


def test_different_profiles_on_two_nodes_both_refuse(model_dir, profiles, tmp_path):
    node0, node1 = two_nodes(model_dir, profiles[4], profiles[8], tmp_path)
    try:
        for node in (node1, node0):
            node.launch()
        for node in (node0, node1):
            node.proc.wait(timeout=REFUSE_TIMEOUT)  # a hang fails here
            assert node.proc.returncode != 0
            assert "--kvtuner-profile differs across ranks" in node.log_text()
    finally:
        node0.stop()
        node1.stop()
