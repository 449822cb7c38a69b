"""Where kernels run: in pytest-xdist workers, so that a kernel that kills its process
(a segfault, ``os._exit``, an OOM kill) or hangs where no signal reaches it costs one
ERROR row with its cause, and the run goes on.

Chosen over a subprocess per case (which would re-import torch for every case) and over
pytest-timeout (whose thread method ends the whole process): xdist already restarts a
crashed worker and reports the item it was running. What it cannot tell is why the
worker died; each worker leaves notes for the controller in a folder of the run:
``<pid>.crash`` (faulthandler's dump of a fatal signal) and ``<pid>.stuck`` (the
watchdog's reason before it ends a worker stuck past its time limit), and the
controller reads the worker's exit status.
"""
from __future__ import annotations

import faulthandler
import logging
import os
import shutil
import signal
import sys
import sysconfig
import tempfile
import threading
from pathlib import Path


NOTES_ENV = "VERIFY_FAULT_NOTES"
RESTARTS = 100_000  # a crashed worker is replaced every time: each crash is one row
log = logging.getLogger("verify.isolation")


def prepare(config) -> None:
    """At pytest_cmdline_main, before xdist reads its options: no ``-n`` means one
    worker; crashed workers are always replaced."""
    opt = config.option
    if not config.pluginmanager.hasplugin("xdist") or not hasattr(opt, "numprocesses"):
        return
    if opt.collectonly or getattr(opt, "usepdb", False):
        return
    if opt.numprocesses is None:
        opt.numprocesses = 1
    if getattr(opt, "maxworkerrestart", "") is None:
        opt.maxworkerrestart = str(RESTARTS)


def configure(config):
    """The controller makes the notes folder (its workers inherit it through the
    environment); a worker writes its fatal-signal dump there and ends itself when a
    case is stuck past its limit. In a run without workers, a stuck case can only be
    reported. Returns the run context's on_stuck(seconds, phase)."""
    if hasattr(config, "workerinput"):
        notes = os.environ.get(NOTES_ENV)
        if notes and Path(notes).is_dir():
            crash = open(Path(notes) / f"{os.getpid()}.crash", "w")  # noqa: SIM115 (kept open)
            config._verify_crash_file = crash
            faulthandler.enable(file=crash, all_threads=False)
            return _end_worker(Path(notes))
        return None
    notes = tempfile.mkdtemp(prefix="verify-faults-")
    os.environ[NOTES_ENV] = notes
    config._verify_notes = Path(notes)
    return _report_stuck


def cleanup(config) -> None:
    notes = getattr(config, "_verify_notes", None)
    if notes is not None:
        shutil.rmtree(notes, ignore_errors=True)
        if os.environ.get(NOTES_ENV) == str(notes):
            del os.environ[NOTES_ENV]


def _end_worker(notes: Path):
    def on_stuck(seconds: float, phase: str) -> None:
        (notes / f"{os.getpid()}.stuck").write_text(
            f"timed out after {seconds:g} s while {phase}, and never returned to Python "
            f"(its worker was ended; --case-timeout {seconds:g}, 0: no limit)")
        sys.stderr.flush()
        os._exit(70)
    return on_stuck


def _report_stuck(seconds: float, phase: str) -> None:
    log.error("a case is still running %g s past its time limit and cannot be interrupted "
              "in this process while %s (-n 0 runs kernels in the run's own process: "
              "without it, it would be ended and reported as an ERROR row)", seconds, phase)


# the controller's view of its workers: worker id -> (pid, exit status) of one that died
_DOWN: dict[str, tuple[int, int | None]] = {}


def worker_down(node, error) -> None:
    """pytest_testnodedown: remember how a crashed worker's process ended."""
    if error is None:
        return
    popen = getattr(getattr(node.gateway, "_io", None), "popen", None)
    if popen is None:
        return
    try:
        code = popen.wait(timeout=10)
    except Exception:  # still running, or not a process we can wait for
        code = None
    _DOWN[node.gateway.id] = (popen.pid, code)


def crash_cause(config, worker_id: str) -> str:
    """Why the worker ``worker_id`` died: its watchdog's note, the fatal signal
    faulthandler saw (and where), or its exit status."""
    pid, code = _DOWN.pop(worker_id, (None, None))
    notes = getattr(config, "_verify_notes", None)
    if notes is not None and pid is not None:
        stuck = notes / f"{pid}.stuck"
        if stuck.is_file():
            return stuck.read_text()
        dump = notes / f"{pid}.crash"
        if dump.is_file() and dump.stat().st_size:
            return "worker crashed: " + _describe_dump(dump.read_text(errors="replace"), code)
    if code is None:
        return "worker crashed (its process ended while running this case)"
    if code < 0:
        return f"worker crashed: signal {-code} ({_signal_name(-code)})"
    return (f"worker crashed: its process exited with status {code} while running this case "
            f"(os._exit or a library ending the process)")


def _describe_dump(text: str, code: int | None) -> str:
    lines = text.splitlines()
    what = next((ln.split(":", 1)[1].strip() for ln in lines
                 if ln.startswith("Fatal Python error")), "fatal error")
    frames = [ln.strip() for ln in lines if ln.strip().startswith("File ")]
    library = (sysconfig.get_paths()["stdlib"], "site-packages", str(Path(__file__).parent.parent))
    own = [f for f in frames if not any(part in f for part in library)]
    frame = (own or frames or [""])[0]
    sig = f"signal {-code} ({_signal_name(-code)}), " if code is not None and code < 0 else ""
    return f"{sig}{what}" + (f", in {frame}" if frame else "")


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name + (", the OOM killer's or a kill -9"
                                              if number == signal.SIGKILL else "")
    except ValueError:
        return "unknown signal"


def lingering_threads(before: set[int]) -> list[threading.Thread]:
    """Non-daemon threads started since ``before`` (a kernel's leftovers), less the
    comparator's own pool threads (block_threads), which idle between compares."""
    from verify.comparator.block_threads import own_threads
    ours = own_threads()
    return [t for t in threading.enumerate()
            if t.ident not in before and t.ident not in ours and not t.daemon
            and t is not threading.main_thread() and t.is_alive()]


PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when its parent dies (Linux prctl): a
    worker or a guarded run never outlives the process that started it, even when that
    one is killed with SIGKILL. Elsewhere, a thread polls the parent instead."""
    import ctypes
    import signal as _signal
    import threading as _threading

    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(_signal.SIGKILL), 0, 0, 0) == 0:
            if os.getppid() != parent:  # the parent died before the call took effect
                os._exit(1)
            return
    except (OSError, AttributeError):
        pass

    def watch() -> None:
        import time as _time
        while os.getppid() == parent:
            _time.sleep(1.0)
        os._exit(1)

    _threading.Thread(target=watch, name="verify-parent-watch", daemon=True).start()


PR_SET_CHILD_SUBREAPER = 36


def adopt_orphans() -> None:
    """Become the reaper of this process's descendants (Linux): a kernel's child that
    outlives its own parent is re-parented here, so end_children() finds it."""
    import ctypes
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def end_children() -> int:
    """SIGKILL the processes kernels left behind (this process's children, and with
    adopt_orphans() their orphaned descendants); how many were ended."""
    import signal as _signal
    me, ended = os.getpid(), 0
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            stat = (entry / "stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid != me:
            continue
        try:
            os.kill(int(entry.name), _signal.SIGKILL)
            os.waitpid(int(entry.name), 0)
            ended += 1
        except (ProcessLookupError, ChildProcessError, PermissionError):
            continue
    return ended
