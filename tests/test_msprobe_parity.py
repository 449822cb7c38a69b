"""Our msprobe-named figures against msprobe itself (PyPI mindstudio-probe 26.2.0).

msprobe pulls tensorboard, scikit-learn and ONNX along, so it is never a dependency of the
harness: this test builds a venv of its own once (~2 minutes; kept under the user's cache
folder), runs msprobe's own classes there on the same arrays, and compares. Where the venv
cannot be built (no package index), it SKIPs with the reason.
"""
import json
import os
import subprocess
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

import verify
from verify.comparator import benchmark as bm

from helpers import msprobe_python as _msprobe_python

RUNNER = textwrap.dedent('''
    import json, sys
    from types import SimpleNamespace
    import numpy as np, torch
    from msprobe.pytorch.api_accuracy_checker.precision_standard.benchmark_compare import \\
        BenchmarkCompare
    from msprobe.pytorch.api_accuracy_checker.precision_standard.absolute_threshold import \\
        AbsolutethdCompare
    from msprobe.pytorch.api_accuracy_checker.compare.algorithm import calc_ratio

    out = {}
    data = np.load(sys.argv[1])
    for name in json.loads(sys.argv[2]):
        dtype = getattr(torch, name.split("-")[0])
        dev, bench = data[name + "/dev"], data[name + "/bench"]
        col = {}
        BenchmarkCompare(SimpleNamespace(bench_output=bench, device_output=dev,
                                         compare_column=col, dtype=dtype)).compare()
        absol = {}
        AbsolutethdCompare(SimpleNamespace(bench_output=bench, device_output=dev,
                                           compare_column=absol, dtype=dtype)).compare()
        names = {"max_rel_error": "max_rel_err", "mean_rel_error": "mean_rel_err"}
        out[name] = {**{names.get(k, k): float(v) for k, v in col.items()},
                     **{"abs_" + k: float(v) for k, v in absol.items()},
                     "ratio": float(calc_ratio(0.3, 0.0001, str(dtype)))}
    print(json.dumps(out))
''')


def _cases():
    rng = np.random.default_rng(21)
    g = np.concatenate([rng.normal(0, 1, 6000), rng.normal(0, 1, 1500) * 2 ** -14,
                        rng.uniform(-1, 1, 400) * 2 ** -22, [0.0, 1.0, -2.0]])
    out = {}
    for name, dtype in (("float32", torch.float32), ("float16", torch.float16),
                        ("bfloat16", torch.bfloat16)):
        gt = torch.from_numpy(g)
        for kind, actual in (("rounded", gt.to(dtype)),
                             ("noisy", (gt * (1 + torch.from_numpy(
                                 rng.normal(0, 3e-3, g.size)))).to(dtype))):
            out[f"{name}-{kind}"] = (actual, gt, dtype)
    return out


def test_our_msprobe_figures_equal_msprobes_own():
    python = _msprobe_python()
    cases = _cases()
    arrays = {}
    for key, (actual, golden, _) in cases.items():
        dev = actual.float().numpy() if actual.dtype == torch.bfloat16 else actual.numpy()
        arrays[key + "/dev"], arrays[key + "/bench"] = dev, golden.numpy()
    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"msprobe-parity-{os.getpid()}.npz"
    np.savez(path, **arrays)
    script = path.with_suffix(".py")
    script.write_text(RUNNER)
    try:
        proc = subprocess.run([str(python), str(script), str(path), json.dumps(list(cases))],
                              capture_output=True, text=True, timeout=600)
    finally:
        path.unlink(missing_ok=True)
        script.unlink(missing_ok=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    theirs = json.loads(proc.stdout.strip().splitlines()[-1])
    worst = {}
    for key, (actual, golden, dtype) in cases.items():
        ours = bm.metrics(actual, golden, dtype)
        for metric in bm.METRICS:
            diff = abs(ours[metric] - theirs[key][metric])
            worst[metric] = max(worst.get(metric, 0.0), diff)
            assert ours[metric] == pytest.approx(theirs[key][metric], rel=1e-9, abs=1e-15), \
                (key, metric)
        m = verify.compare(actual, golden, dtype=dtype).metrics
        assert m.eb == pytest.approx(theirs[key]["eb"], abs=1e-15), key  # the eb column
        # the absolute-threshold standard passes exactly when msprobe finds no element over
        abs_ok = theirs[key]["abs_rel_err_ratio"] == 0 and theirs[key]["abs_abs_err_ratio"] == 0
        ours_abs = verify.compare(actual, golden, dtype=dtype, standard="abs_threshold")
        assert (ours_abs.metrics.rel_err_ratio == 0) == (theirs[key]["abs_rel_err_ratio"] == 0)
        assert ours_abs.metrics.rel_err_ratio == pytest.approx(
            theirs[key]["abs_rel_err_ratio"], abs=1e-12), key
        assert ours_abs.metrics.small_err_ratio == pytest.approx(
            theirs[key]["abs_abs_err_ratio"], abs=1e-12), key
        assert (ours_abs.verdict == "PASS") == abs_ok or ours_abs.metrics.nan_inf_mismatch
        assert bm.ratio(0.3, 0.0001, dtype) == pytest.approx(theirs[key]["ratio"]), key
    print("largest difference from msprobe per metric:", worst)
