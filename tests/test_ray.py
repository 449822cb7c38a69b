"""verify run --ray: the same rows as an xdist run, a fresh process per case on the
device Ray assigned, faults as rows, each golden computed once, and a lost node's cases
resubmitted. Clusters run with fake resources (NPU: 4, golden: 1) on this CPU machine."""
import json
import os
import shlex
import shutil
import subprocess
import sys
import time

import pytest

from verify.golden.store import GoldenStore

from helpers import REPO, run_cli

ray = pytest.importorskip("ray", reason="the ray extra is not installed")
pytestmark = pytest.mark.xdist_group("ray")  # one cluster at a time on a 2-core machine
HELPERS = os.path.join(os.path.dirname(__file__), "ray_helpers.py")
REGISTRY_TOKEN = "ray-t0ken"


@pytest.fixture(scope="module")
def cluster():
    """A one-node cluster (NPU: 4, golden: 1, 2 CPUs) held by a process of its own; its
    workers inherit this environment (the session's golden store, PYTHONPATH)."""
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "VERIFY_REGISTRY_TOKEN": REGISTRY_TOKEN}  # the nodes may push to a test registry
    proc = subprocess.Popen([sys.executable, HELPERS, "hold", "NPU=4,golden=1"], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    address = proc.stdout.readline().strip()
    assert address, "the cluster did not start"
    yield address
    proc.stdin.close()
    proc.wait(timeout=60)


def _rows(run_dir):
    return json.loads((run_dir / "results.json").read_text())["rows"]


KEEP = ("verdict", "standard", "reason", "mere", "mare", "max_abs", "max_rel", "rmse", "eb",
        "ulp_max", "margin", "floor_mere", "floor_max_abs", "inputs_sha", "shape", "seed")


def _keyed(rows):
    return {(r["op"], r["case_id"], r["backend"], r["kernel"], r["output"]):
            {k: r.get(k) for k in KEEP} for r in rows}


def test_ray_rows_equal_xdist_rows_and_each_golden_is_computed_once(tmp_path, cluster):
    """A small L0 selection under -n 2 and under --ray (a fresh store, so the golden tasks
    compute every golden): identical verdicts, metrics and input fingerprints per output;
    as many goldens computed as distinct golden keys, and no kernel task computed one."""
    selection = ("--level", "L0", "--op", "apply_rms_prop", "--op", "mean",
                 "--backend", "torch", "--reports", tmp_path)
    xd = run_cli("run", *selection, "-n", "2", "--run-id", "xdist",
                 "--store", tmp_path / "store-x")
    assert xd.returncode == 0, xd.stdout[-2000:] + xd.stderr[-2000:]
    t0 = time.monotonic()
    rr = run_cli("run", *selection, "--ray", cluster, "--run-id", "ray",
                 "--store", tmp_path / "store-r")
    assert rr.returncode == 0, rr.stdout[-2000:] + rr.stderr[-3000:]
    print(f"--ray: {time.monotonic() - t0:.1f} s")
    a, b = _keyed(_rows(tmp_path / "xdist")), _keyed(_rows(tmp_path / "ray"))
    assert len(a) == len(b) >= 17 and a == b
    doc = json.loads((tmp_path / "ray" / "results.json").read_text())
    info = doc["meta"]["ray"]
    distinct = {(r["op"], r["case_id"]) for r in doc["rows"] if r.get("golden_source")}
    assert info["golden_keys"] == info["goldens_computed"] == len(distinct), info
    # each golden task computed the golden's floors too, kept beside it for the kernel tasks
    assert {g["floors_source"] for g in info["golden_tasks"].values()} == {"computed"}, info
    assert all(g["floors"] >= 2 for g in info["golden_tasks"].values()), info
    kept = [e for e in GoldenStore(tmp_path / "store-r").entries(derived=True)
            if (e.meta.get("derived") or {}).get("kind") == "floors"]
    assert len(kept) == info["golden_keys"]
    assert {r.get("golden_source") for r in doc["rows"]} <= {"local", None}  # never computed
    assert all(r["worker"].startswith("ray:") and r["attempts"] == 1 for r in doc["rows"])
    assert any(k.startswith("node ray:") for k in doc["meta"]["environment"])


def test_goldens_travel_through_the_registry_between_stores(tmp_path, cluster):
    """Golden tasks push what they compute to the registry; a run whose nodes have
    another (empty) store fetches every golden from it instead of computing it."""
    from helpers import Service

    from verify.golden.registry_client import RegistryClient
    service = Service(tmp_path / "registry-store", token=REGISTRY_TOKEN)
    try:
        for run_id in ("first", "second"):
            out = run_cli("run", "--level", "L0", "--op", "mean", "--dtype", "fp32",
                          "--backend", "torch", "--ray", cluster, "--registry", service.url,
                          "--store", tmp_path / f"store-{run_id}", "--reports", tmp_path,
                          "--run-id", run_id)
            assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
        keys = RegistryClient(service.url).keys()
    finally:
        service.stop()
    first = json.loads((tmp_path / "first" / "results.json").read_text())["meta"]["ray"]
    second = json.loads((tmp_path / "second" / "results.json").read_text())["meta"]["ray"]
    assert first["goldens_computed"] == first["golden_keys"] == len(keys) >= 2, first
    assert {g["source"] for g in second["golden_tasks"].values()} == {"registry"}, second
    assert set(second["golden_tasks"]) == set(keys)
    # the first run's golden tasks pushed the floors too: the second run computed none
    assert {g["floors_source"] for g in first["golden_tasks"].values()} == {"computed"}
    assert {g["floors_source"] for g in second["golden_tasks"].values()} == {"registry"}


DEVICE_KERNELS = '''
import os
import signal
import time

import verify
import verify.specs.registry  # noqa: F401  (verify.specs.registry, below)

FIRST = os.environ.get("ASCEND_RT_VISIBLE_DEVICES")  # read once, as a device runtime does
LOG = os.path.join(os.path.dirname(__file__), "calls")
verify.backend("fake_npu", resources={"NPU": 1})


def _reference(**kw):
    return verify.specs.registry.kernels("lion", ["torch"])[0].fn(**kw)


@verify.kernel("lion", backend="fake_npu")
def records(weight, grad, exp_avg, *, lr, beta1, beta2, weight_decay):
    now = os.environ.get("ASCEND_RT_VISIBLE_DEVICES")
    os.makedirs(LOG, exist_ok=True)
    with open(os.path.join(LOG, f"{os.getpid()}-{time.time_ns()}"), "w") as f:
        f.write(f"{os.getpid()} {FIRST} {now} {tuple(weight.shape)}")
    if tuple(weight.shape) == (8, 8):
        os.kill(os.getpid(), signal.SIGKILL)           # a crash: the process is gone
    if tuple(weight.shape) == (1, 1):
        time.sleep(10**6)                               # a hang that signals can stop
    if tuple(weight.shape) == (33, 1023):
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
        time.sleep(10**6)                               # a hang no signal reaches
    return _reference(weight=weight, grad=grad, exp_avg=exp_avg, lr=lr, beta1=beta1,
                      beta2=beta2, weight_decay=weight_decay)
'''


def test_devices_crash_and_hangs_on_ray(tmp_path, cluster):
    """Each case runs in a process of its own that sees exactly the NPU Ray assigned it
    (max_calls=1: a reused process would keep its first device); a kernel that SIGKILLs
    its process is one ERROR row naming case and node; a hang is one 'timed out' row at
    --case-timeout, and a hang no signal reaches is ended by the driver after the grace
    period; the run ends within the limit plus a bounded slack."""
    (tmp_path / "k.py").write_text(DEVICE_KERNELS)
    t0 = time.monotonic()
    out = run_cli("run", "--level", "L0", "--op", "lion", "--dtype", "fp32", "--kernels",
                  tmp_path / "k.py", "--backend", "fake_npu", "--ray", cluster,
                  "--case-timeout", "3", "--reports", tmp_path, "--run-id", "x", timeout=300)
    wall = time.monotonic() - t0
    assert out.returncode == 1, out.stdout[-2000:] + out.stderr[-3000:]
    rows = _rows(tmp_path / "x")
    by_case = {}
    for r in rows:
        by_case.setdefault(r["case_id"], []).append(r)
    assert len(by_case) == 8
    errors = {c: rs[0]["reason"] for c, rs in by_case.items() if rs[0]["verdict"] == "ERROR"}
    assert set(errors) == {"small-fp32-8x8", "small-fp32-1x1", "tail-fp32-33x1023"}, errors
    assert errors["small-fp32-8x8"].startswith("kernel process died") and "ray:" in errors[
        "small-fp32-8x8"]
    assert errors["small-fp32-1x1"].startswith("timed out after 3 s while running the kernel")
    assert errors["tail-fp32-33x1023"].startswith("timed out after 3 s on ray:")
    assert "never returned to Python" in errors["tail-fp32-33x1023"]
    assert all(r["verdict"] == "PASS" for c, rs in by_case.items() if c not in errors
               for r in rs)
    assert wall < 3 + 10 + 150, wall  # limit + the driver's grace + processes on 2 cores (loaded)
    # device hygiene: one process per case, each saw one device id, the one Ray gave it
    calls = [open(tmp_path / "calls" / f).read().split(" ", 3)
             for f in os.listdir(tmp_path / "calls")]
    seen = {}
    for pid, first, now, _ in calls:
        seen.setdefault(pid, set()).update({first, now})
    assert len(seen) == 8, calls  # a process per case (a 10-step case calls 10 times)
    assert all(len(ids) == 1 and ids <= {"0", "1", "2", "3"} for ids in seen.values()), seen
    for r in rows:
        if r["verdict"] == "PASS":
            assert r["worker"].split(":")[-1] in {f"npu{now}" for _, _, now, _ in calls}


def test_usage_errors_under_ray(tmp_path):
    out = run_cli("run", "--level", "L0", "--op", "mean", "--ray", "local", "-n", "2")
    assert out.returncode == 2 and "-n and --ray" in out.stderr, out.stderr
    out = run_cli("run", "--level", "L0", "--op", "mean", "--ray", "local:NPU=x")
    assert out.returncode == 2 and "RESOURCE=AMOUNT" in out.stderr, out.stderr
    out = run_cli("run", "--level", "L0", "--op", "mean", "--ray", "local", "-k", "fp32")
    assert out.returncode == 2 and "-k" in out.stderr, out.stderr
    # a required registry that is away: exit 2 before any cluster starts
    out = run_cli("run", "--level", "L0", "--op", "mean", "--ray", "local:NPU=1",
                  "--registry", "http://127.0.0.1:9", "--registry-required")
    assert out.returncode == 2 and "not reachable" in out.stderr, out.stderr


def test_without_ray_installed_ray_is_a_usage_error_with_the_install_hint(tmp_path):
    """A Python where `import ray` fails: exit 2 naming the extra."""
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "__init__.py").write_text("raise ImportError('no ray here')\n")
    out = run_cli("run", "--level", "L0", "--op", "mean", "--ray", "local",
                  env={"PYTHONPATH": str(tmp_path)})
    assert out.returncode == 2 and "kernel-verify[ray]" in out.stderr, out.stderr


SLOW_KERNELS = '''
import os
import time

import ray
import verify

MARKS = os.path.join(os.path.dirname(__file__), "started")
verify.backend("slow_npu", resources={"NPU": 1})


@verify.kernel("lion", backend="slow_npu")
def slow(weight, grad, exp_avg, *, lr, beta1, beta2, weight_decay):
    os.makedirs(MARKS, exist_ok=True)
    mark = os.path.join(MARKS, str(os.getpid()))
    with open(mark, "w") as f:
        f.write(ray.get_runtime_context().get_node_id())
    time.sleep(3)
    os.remove(mark)
    return verify.specs.registry.kernels("lion", ["torch"])[0].fn(
        weight=weight, grad=grad, exp_avg=exp_avg, lr=lr, beta1=beta1, beta2=beta2,
        weight_decay=weight_decay)
'''


def _loopback_only() -> bool:
    """Whether this machine lets us run in a network namespace of our own (root, or
    user namespaces), with iproute2 to bring its loopback up."""
    if not (shutil.which("unshare") and shutil.which("ip")):
        return False
    probe = subprocess.run(["unshare", "-n", "sh", "-c", "ip link set lo up"],
                           capture_output=True)
    return probe.returncode == 0


@pytest.mark.slow
def test_a_lost_node_s_cases_are_resubmitted(tmp_path):
    """Four local nodes (a golden node, three with 2 NPUs each; loopback only where this
    machine allows a network namespace, as Ray otherwise advertises the machine's
    interface address); one NPU node is killed while a case runs on it: every row is present and passes, the moved cases show
    attempts 2, and goldens ran on the golden node."""
    (tmp_path / "k.py").write_text(SLOW_KERNELS)
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    command = [sys.executable, HELPERS, "nodes", str(tmp_path / "out.json"),
               str(tmp_path / "k.py"), str(tmp_path / "store"), str(tmp_path)]
    loopback = _loopback_only()
    if loopback:  # a network namespace with only lo: the nodes can only reach each other
        command = ["unshare", "-n", "sh", "-c",
                   "ip link set lo up && exec " + " ".join(map(shlex.quote, command))]
    out = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    info = json.loads((tmp_path / "out.json").read_text())
    print(info)
    assert info["killed"], info
    doc = json.loads((tmp_path / "nodes" / "results.json").read_text())
    rows = doc["rows"]
    assert len({r["case_id"] for r in rows}) == 8 and all(r["verdict"] == "PASS" for r in rows)
    moved = [r for r in rows if r["attempts"] == 2]
    moved_cases = {r["case_id"] for r in moved}
    assert moved_cases and doc["meta"]["ray"]["resubmitted"] == len(moved_cases), doc["meta"]
    assert all(r["attempts"] == 1 for r in rows if r["case_id"] not in moved_cases)
    if loopback:
        assert {r["worker"].split(":")[1] for r in rows} == {"127.0.0.1"}
    nodes = {r["worker"].split(":")[2] for r in rows}
    assert len(nodes) >= 2 and info["head"] not in nodes  # cases ran on the NPU nodes only
    goldens = doc["meta"]["ray"]["golden_tasks"].values()
    assert len(goldens) == 8 and {g["worker"].split(":")[2] for g in goldens} == {info["head"]}


def test_a_hunt_over_ray_finds_what_a_serial_hunt_finds(tmp_path, cluster):
    """verify hunt --ray: each round's candidates as Ray tasks; the same found cases as
    the serial hunt, bit for bit."""
    planted = str(REPO / "tests" / "data" / "planted_kernels.py")
    common = ("hunt", "--op", "softmax", "--backend", "planted", "--kernels", planted,
              "--dtype", "fp32", "--budget", "8", "--seed", "1",
              "--max-elements", str(1 << 19), "--reports", tmp_path)
    serial = run_cli(*common, "--run-id", "serial", "--store", tmp_path / "s1")
    spread = run_cli(*common, "--run-id", "ray", "--ray", cluster, "--store", tmp_path / "s2")
    assert serial.returncode == 1, serial.stdout[-2000:] + serial.stderr[-2000:]
    assert spread.returncode == 1, spread.stdout[-2000:] + spread.stderr[-3000:]
    a = json.loads((tmp_path / "serial" / "found_cases.json").read_text())
    b = json.loads((tmp_path / "ray" / "found_cases.json").read_text())
    assert a["levels"] == b["levels"] and a["levels"]["L0"]
    meta = json.loads((tmp_path / "ray" / "results.json").read_text())["meta"]["hunt"]
    assert meta["ray"] == cluster and meta["tried"] == 8
