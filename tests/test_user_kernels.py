"""A user's kernels and ops, from the user's side: several kernels of one op, a duplicate
registration, a kernel with the wrong signature, an op declared in a file with its own
case file, `verify ops OP`, the store's location, a fast `verify --help`."""
import os
import subprocess
import sys
import textwrap

import pytest

import verify
from verify.specs import registry

from helpers import REPO, run_cli

THREE_ADAMW = '''
import torch
import verify


def _adamw(weight, grad, m, v, beta1, beta2, lr, weight_decay, eps, step, eps_inside=False):
    w, g = weight.float(), grad.float()
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    mh, vh = m / (1 - beta1 ** step), v / (1 - beta2 ** step)
    denom = torch.sqrt(vh + eps) if eps_inside else torch.sqrt(vh) + eps
    w = w * (1 - lr * weight_decay) - lr * mh / denom
    return w.to(weight.dtype), m, v


@verify.kernel("apply_adam_w_v2", backend="mine")
def adamw_fp32(weight, grad, m, v, *, beta1, beta2, lr, weight_decay, eps, step):
    return _adamw(weight, grad, m, v, beta1, beta2, lr, weight_decay, eps, step)


@verify.kernel("apply_adam_w_v2", backend="mine")
def adamw_fp32_again(weight, grad, m, v, *, beta1, beta2, lr, weight_decay, eps, step):
    """The same math written a second time."""
    return _adamw(weight, grad, m, v, beta1, beta2, lr, weight_decay, eps, step)


@verify.kernel("apply_adam_w_v2", backend="mine", name="eps_inside")
def third(weight, grad, m, v, *, beta1, beta2, lr, weight_decay, eps, step):
    return _adamw(weight, grad, m, v, beta1, beta2, 1e-1, weight_decay, 1e-2, step, True)
'''


@pytest.fixture(scope="module")
def three_kernels(tmp_path_factory, module_registrations):
    tmp = tmp_path_factory.mktemp("three")
    (tmp / "three.py").write_text(THREE_ADAMW)
    return verify.run(level="L0", ops=["apply_adam_w_v2"], backends=["mine"],
                      kernels=[str(tmp / "three.py")], dtypes=["fp32"], reports=False)


def test_three_kernels_of_one_op_each_run_under_their_own_name(three_kernels):
    rows = [r for r in three_kernels.rows if r["standard"] != "expect_error"]
    by_kernel = {}
    for r in rows:
        by_kernel.setdefault(r["kernel"], set()).add(r["verdict"])
    assert set(by_kernel) == {"adamw_fp32", "adamw_fp32_again", "eps_inside"}
    assert by_kernel["adamw_fp32"] == {"PASS"} and by_kernel["adamw_fp32_again"] == {"PASS"}
    assert "FAIL" in by_kernel["eps_inside"]
    assert three_kernels.exit_status == 1


def test_one_name_registered_from_two_places_is_an_error(tmp_path):
    first, second = tmp_path / "a.py", tmp_path / "b.py"
    body = ("import verify\n@verify.kernel('lion', backend='dup')\n"
            "def lion_kernel(weight, grad, exp_avg, *, lr, beta1, beta2, weight_decay):\n"
            "    return weight, exp_avg\n")
    first.write_text(body)
    second.write_text("\n\n" + body)
    registry.load_user_module(str(first))
    with pytest.raises(verify.ConfigError) as err:
        registry.load_user_module(str(second))
    assert f"{first}:2" in str(err.value) and f"{second}:4" in str(err.value)  # decorators
    assert "lion_kernel" in str(err.value)


def test_a_wrong_keyword_gives_one_error_row_per_case_naming_the_signature(tmp_path):
    mod = tmp_path / "typo.py"
    mod.write_text("import verify\n\n@verify.kernel('lion', backend='typo')\n"
                   "def lion(weight, grad, exp_avg, *, lr, beta_1, beta2, weight_decay):\n"
                   "    return weight, exp_avg\n")
    res = verify.run(level="L0", ops=["lion"], backends=["typo"], kernels=[str(mod)],
                     reports=False)
    errors = [r for r in res.rows if r["verdict"] == "ERROR"]
    n_cases = len({r["case_id"] for r in res.rows})
    assert len(errors) == len(res.rows) == n_cases
    reason = errors[0]["reason"]
    assert f"typo:lion ({mod}:3)" in reason and "beta1" in reason
    assert verify.op("lion").signature() in reason
    assert "lion(weight, grad, exp_avg, *, lr=0.0001, beta1=0.9" in reason


def test_a_backward_kernel_without_a_name_serves_every_kernel_of_its_backend():
    @verify.kernel("rmsnorm_without_weight", backend="pairing", name="k_one")
    def k_one(x, *, eps):
        return x
    @verify.kernel("rmsnorm_without_weight", backend="pairing", name="k_two")
    def k_two(x, *, eps):
        return x
    @verify.backward_kernel("rmsnorm_without_weight", backend="pairing")
    def shared(x, *, grad_rstd, eps):
        return (x,)
    @verify.backward_kernel("rmsnorm_without_weight", backend="pairing", name="k_two")
    def own(x, *, grad_rstd, eps):
        return (x,)
    kerns = {k.name: k for k in registry.kernels("rmsnorm_without_weight", ["pairing"])}
    assert kerns["k_one"].backward is shared and kerns["k_two"].backward is own


USER_OP = '''
import math
import torch
import verify


def _swish(x, beta):
    return x * torch.sigmoid(beta * x)


@verify.declare_op(
    "swish_scaled",
    inputs=[verify.InputSpec("x"), verify.InputSpec("scale", shape=lambda main: main[-1:])],
    params={"beta": 1.0},
    outputs=[verify.OutputSpec("y")],
    dtypes=["fp32", "bf16"],
    standard="cann_v2",
    grads=verify.Gradients(wrt=("x", "scale"),
                           reduced={"scale": verify.broadcast_length("scale", "x")}),
    cases="swish_cases.json",
)
def swish_scaled(x, scale, *, beta):
    """y = swish_beta(x) * scale, scale broadcast over the last dim."""
    return _swish(x, beta) * scale


@verify.kernel("swish_scaled", backend="mine")
def swish_fp32(x, scale, *, beta):
    return (_swish(x.float(), beta) * scale.float()).to(x.dtype)
'''

USER_CASES = '''{"op": "swish_scaled", "levels": {"L0": [
  {"id": "vec", "shape": [64], "dtype": ["fp32", "bf16"]},
  {"id": "cube", "shape": [2, 3, 32], "dtype": "fp32", "params": {"beta": 1.5}}]}}'''


def test_a_user_op_declared_in_a_file_with_its_own_cases(tmp_path):
    (tmp_path / "myop.py").write_text(USER_OP)
    (tmp_path / "swish_cases.json").write_text(USER_CASES)
    res = verify.run(level="L0", ops=["swish_scaled"], backends=["mine"],
                     kernels=[str(tmp_path / "myop.py")], reports=False)
    outputs = {(r["case_id"], r["output"]): r["verdict"] for r in res.rows}
    assert set(outputs.values()) == {"PASS"}, res.summary()
    assert ("vec-fp32-64", "y") in outputs and ("cube-fp32-2x3x32", "grad_scale") in outputs
    spec = verify.op("swish_scaled")
    assert spec.signature() == "swish_scaled(x, scale, *, beta=1.0) -> y"
    assert spec.ranks == (0, 8)


def test_verify_ops_op_prints_the_call_convention():
    out = run_cli("ops", "lion", "adamw")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "lion(weight, grad, exp_avg, *, lr=0.0001, beta1=0.9, beta2=0.99, " \
           "weight_decay=0.0) -> (w_new, exp_avg_new)" in text
    assert "exp_avg: dtype fp32; shape the case's shape; default dist=normal" in text
    assert "apply_adam_w_v2(weight, grad, m, v, *" in text and "gradients" not in \
        text.split("apply_adam_w_v2(")[1]


def test_help_answers_without_importing_torch():
    code = ("import sys; from verify import cli; cli._parser().format_help(); "
            "import verify; print(sorted(m for m in ('torch', 'pandas', 'numpy') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=REPO, timeout=120)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_one_store_per_user_and_reading_commands_never_create_one(tmp_path, monkeypatch):
    from verify.golden.store import default_store_dir
    monkeypatch.delenv("VERIFY_STORE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert default_store_dir() == str(tmp_path / "cache" / "kernel-verify" / "goldens")
    monkeypatch.chdir(tmp_path)
    assert default_store_dir() == str(tmp_path / "cache" / "kernel-verify" / "goldens")
    missing = tmp_path / "nonexistent"
    for command in ("ls", "check", "gc"):
        out = run_cli("golden", command, "--store", missing)
        assert out.returncode == 2 and "does not exist" in out.stderr, out.stderr
    assert not missing.exists()


def test_optional_backends_are_not_imported_until_used():
    code = ("import sys, verify; verify.ops(); verify.run(level='L0', ops=['lion'], "
            "backends=['torch'], reports=False); "
            "print(sorted(m for m in ('triton', 'pypto', 'verify.kernels.triton', "
            "'verify.kernels.pypto') if m in sys.modules))")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=REPO, env=env, timeout=300)
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout + out.stderr


def test_no_third_party_debug_logging(tmp_path):
    code = textwrap.dedent("""
        import logging, verify
        verify.run(level="L0", ops=["lion"], backends=["torch"], reports=False)
        print("root level", logging.getLogger().level, len(logging.getLogger().handlers))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=tmp_path, timeout=300)
    assert "DEBUG" not in out.stdout + out.stderr
    assert "root level 30 0" in out.stdout, out.stdout + out.stderr
