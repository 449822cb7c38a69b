"""The last-level cache size the metrics pass reads to decide whether it fetches each
next block ahead (verify.comparator.cache_size, metrics._fetches_ahead)."""
from __future__ import annotations

import torch

from verify.comparator import cache_size, metrics


def _index(root, name, level, kind, size):
    d = root / name
    d.mkdir()
    (d / "level").write_text(f"{level}\n")
    (d / "type").write_text(f"{kind}\n")
    (d / "size").write_text(f"{size}\n")


def test_the_largest_data_cache_is_read_from_sysfs(tmp_path):
    _index(tmp_path, "index0", 1, "Data", "48K")
    _index(tmp_path, "index1", 1, "Instruction", "64M")  # never the answer
    _index(tmp_path, "index2", 2, "Unified", "1024K")
    _index(tmp_path, "index3", 3, "Unified", "32768K")
    assert cache_size.last_level_cache_bytes(str(tmp_path)) == 32 << 20


def test_a_machine_that_does_not_say_gets_the_default(tmp_path):
    _index(tmp_path, "index0", 1, "Data", "garbled")
    assert cache_size.last_level_cache_bytes(str(tmp_path)) == cache_size.DEFAULT_BYTES
    assert cache_size.last_level_cache_bytes(str(tmp_path / "none")) == \
        cache_size.DEFAULT_BYTES
    assert cache_size._parse_size("2M") == 2 << 20
    assert cache_size._parse_size("4096") == 4096


def test_the_pass_fetches_ahead_only_beyond_the_cache_and_with_work_to_hide_it(
        monkeypatch):
    monkeypatch.setattr(metrics, "last_level_cache_bytes", lambda: 1 << 20)
    small = torch.zeros(1 << 10, dtype=torch.bfloat16)
    large16 = torch.zeros(1 << 17, dtype=torch.bfloat16)  # 1.25 MiB with its golden
    large32 = torch.zeros(1 << 17, dtype=torch.float32)
    assert not metrics._fetches_ahead(small, "rel", True)
    assert metrics._fetches_ahead(large16, None, True)  # the upcast hides it
    assert metrics._fetches_ahead(large32, "rel", False)  # the heat map hides it
    assert not metrics._fetches_ahead(large32, None, False)  # a count alone does not


def test_fetching_ahead_or_not_gives_the_same_figures(monkeypatch):
    """The fetch only warms the cache: every figure, both histograms and the heat map
    are the same to the bit with it and without (NaN in one block, a tail block)."""
    n = 5 * metrics.BLOCK + 4096
    gen = torch.Generator().manual_seed(7)
    g = torch.randn(n, generator=gen, dtype=torch.float64)
    g[2 * metrics.BLOCK + 5] = float("nan")
    for dtype, noise in ((torch.float32, 1e-7), (torch.bfloat16, 1e-3)):
        a = (g * (1 + noise * torch.randn(n, generator=gen, dtype=torch.float64))).to(dtype)
        got = []
        for fetch in (False, True):
            monkeypatch.setattr(metrics, "_fetches_ahead", lambda *_, f=fetch: f)
            got.append(repr(metrics.measure_all(a.reshape(-1, 4096), g.reshape(-1, 4096),
                                                heat="tol")))
        assert got[0] == got[1], dtype
