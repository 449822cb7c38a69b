"""The harness as a dependency: the built wheel installed into a fresh environment and run
from a user's folder that has its own kernels/, goldens/ and test_cases/ folders.

The fresh environment takes its third-party packages (torch, numpy, ...) from this
environment through a .pth line, so no download is needed, but not this checkout: the
only `verify` it can import is the wheel's.
"""
import os
import subprocess
import sys
import sysconfig
import textwrap
import zipfile
from pathlib import Path

import pytest

from helpers import REPO
from test_user_kernels import THREE_ADAMW, USER_CASES, USER_OP


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w",
                           str(out), str(REPO)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (path,) = out.glob("kernel_verify-*.whl")
    return path


@pytest.fixture(scope="module")
def env(wheel, tmp_path_factory):
    """A fresh venv with only the wheel installed, and a user folder to run from."""
    root = tmp_path_factory.mktemp("fresh")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    site = Path(subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()"
         "['purelib'])"], capture_output=True, text=True, check=True).stdout.strip())
    (site / "_deps_from_dev_env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    proc = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"),
                           "install", "-q", "--no-deps", str(wheel)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    user = root / "user_project"
    for name in ("kernels", "goldens", "test_cases"):  # the user's own folders
        (user / name).mkdir(parents=True)
        (user / name / "__init__.py").write_text(
            f"raise ImportError('the harness imported the user\\'s own {name} package')\n")
    return {"venv": venv, "site": site, "user": user,
            "env": {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
                    "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}",
                    "COLUMNS": "200"}}


def run(env, *args, cwd=None, timeout=600):
    return subprocess.run([*map(str, args)], cwd=cwd or env["user"], env=env["env"],
                          capture_output=True, text=True, timeout=timeout)


def test_the_wheel_holds_one_top_level_package_and_the_op_pack(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"verify"}
    assert "verify/goldens/optimizers.py" in names and "verify/kernels/torch/optimizers.py" in names
    assert "verify/test_cases/lion.json" in names and "verify/cases/schema/cases.schema.json" in names
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "pytest11" not in text and "verify = verify.cli:main" in text


def test_ops_and_a_builtin_run_from_a_user_folder(env, tmp_path):
    where = run(env, env["venv"] / "bin" / "python", "-c", "import verify; print(verify.__file__)")
    assert where.stdout.startswith(str(env["site"])), where.stdout + where.stderr
    ops = run(env, "verify", "ops")
    assert ops.returncode == 0, ops.stderr
    assert len(ops.stdout.splitlines()) >= 32 and "lion  dtypes=" in ops.stdout
    assert "kernels=[torch" in ops.stdout
    out = run(env, "verify", "run", "--level", "L0", "--op", "lion", "--reports", tmp_path)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "FAIL 0, ERROR 0" in out.stdout and "verdicts per op and kernel" in out.stdout


def test_user_op_in_a_file_and_three_user_kernels(env, tmp_path):
    (env["user"] / "myop.py").write_text(USER_OP)
    (env["user"] / "swish_cases.json").write_text(USER_CASES)
    (env["user"] / "three.py").write_text(THREE_ADAMW)
    out = run(env, "verify", "run", "--level", "L0", "--kernels", "myop.py", "--op",
              "swish_scaled", "--backend", "mine", "--reports", tmp_path)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "swish_scaled" in out.stdout and "FAIL 0, ERROR 0" in out.stdout
    out = run(env, "verify", "run", "--level", "L0", "--kernels", "three.py", "--op", "adamw",
              "--backend", "mine", "--dtype", "fp32", "--reports", tmp_path)
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
    for name in ("mine:adamw_fp32 ", "mine:adamw_fp32_again", "mine:eps_inside"):
        assert name in out.stdout, name


def test_an_installed_op_pack_is_found_through_its_entry_point(env, tmp_path):
    pack = env["site"] / "teampack"
    pack.mkdir()
    (pack / "__init__.py").write_text(USER_OP.replace("swish_scaled", "team_swish")
                                      .replace('backend="mine"', 'backend="team"')
                                      .replace("swish_cases.json", "cases"))
    (pack / "cases").mkdir()
    (pack / "cases" / "team_swish.json").write_text(USER_CASES.replace("swish_scaled",
                                                                       "team_swish"))
    dist = env["site"] / "teampack-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: teampack\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[kernel_verify.packs]\nteam = teampack\n")
    ops = run(env, "verify", "ops", "team_swish")
    assert ops.returncode == 0 and "team_swish(x, scale, *, beta=1.0) -> y" in ops.stdout, \
        ops.stdout + ops.stderr
    out = run(env, "verify", "run", "--level", "L0", "--op", "team_swish", "--backend", "team",
              "--reports", tmp_path)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]


def test_other_pytest_projects_are_untouched(env):
    project = env["user"].parent / "unrelated"
    project.mkdir()
    (project / "conftest.py").write_text(textwrap.dedent("""
        def pytest_addoption(parser):
            parser.addoption("--backend", default="cpu")
            parser.addoption("--level", default="x")
    """))
    (project / "test_one.py").write_text("def test_one():\n    assert 1 + 1 == 2\n")
    python = env["venv"] / "bin" / "python"
    out = run(env, python, "-m", "pytest", "-q", "-p", "no:cacheprovider", cwd=project)
    assert out.returncode == 0 and "1 passed" in out.stdout, out.stdout + out.stderr
    helped = run(env, python, "-m", "pytest", "--help", "-p", "no:cacheprovider",
                 cwd=env["user"].parent)
    assert "kernel precision verification" not in helped.stdout
    loaded = run(env, python, "-m", "pytest", "-p", "verify", "--help", "-p",
                 "no:cacheprovider", cwd=env["user"].parent)
    assert "kernel precision verification" in loaded.stdout, loaded.stdout[-2000:] + \
        loaded.stderr[-2000:]
