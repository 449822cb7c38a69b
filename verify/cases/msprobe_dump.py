"""Reading msprobe dumps (PyPI mindstudio-probe): where they are, their records, streamed.

Layout (reference/msprobe.md): ``<dump_path>/step<N>/proc<pid>/`` or ``.../rank<R>/``
holding ``dump.json`` (``{task, level, framework, dump_data_dir, data: {record: ...}}``),
``construct.json`` (record -> parent module, where the level records modules) and, for
task "tensor", ``dump_tensor_data/*.pt``. Records are streamed with ijson: a real step's
dump.json holds 10^5 records, which are never all in memory. Tensor files are resolved
beside dump.json (``dump_data_dir`` holds the dump machine's path).
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import ijson
import torch

from verify.errors import ConfigError

_STEP = re.compile(r"^step(\d+)$")
_RANK = re.compile(r"^rank(\d+)$")
_PROC = re.compile(r"^proc(\d+)$")
_RECORD = re.compile(r"^(?P<api>.+)\.(?P<n>\d+)\.(?P<dir>forward|backward)$")


@dataclass(frozen=True)
class TensorRef:
    """A tensor of a record: its file (absolute), dtype and shape as dump.json gives them."""

    path: str
    dtype: str  # "torch.bfloat16"
    shape: tuple[int, ...]
    # what dump.json says of its values (Max, Min, Mean, Norm, md5): tensors that differ
    # here differ in content, so indexing hashes only the calls these cannot tell apart
    summary: str = field(default="", compare=False)

    @property
    def exact(self) -> bool:
        """Its name is its content (a capture's blob): no file needs reading to tell."""
        return self.path.endswith(".safetensors")

    @property
    def identity(self) -> str:
        return Path(self.path).stem if self.exact else self.summary

    @property
    def torch_dtype(self) -> torch.dtype:
        value = getattr(torch, self.dtype.split(".")[-1], None)
        if not isinstance(value, torch.dtype):
            raise ValueError(f"unknown dtype {self.dtype!r}")
        return value

    def meta(self) -> torch.Tensor:
        return torch.empty(self.shape, dtype=self.torch_dtype, device="meta")

    def load(self, mmap: bool = False) -> torch.Tensor:
        if not os.path.isfile(self.path):
            raise FileNotFoundError(f"{self.path} is missing")
        if self.path.endswith(".safetensors"):  # a capture's blob (verify.capture)
            from safetensors.torch import load_file
            t = load_file(self.path)["t"]
        else:
            t = torch.load(self.path, map_location="cpu", weights_only=True, mmap=mmap)
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{self.path} holds a {type(t).__name__}, not a tensor")
        if tuple(t.shape) != self.shape or t.dtype != self.torch_dtype:
            raise ValueError(f"{self.path} is {t.dtype} {list(t.shape)}; dump.json says "
                             f"{self.dtype} {list(self.shape)}")
        return t


@dataclass(frozen=True)
class DumpFile:
    """One dump.json: where, and the step / rank its folders name."""

    path: str
    step: int | None
    rank: int | None
    task: str
    level: str
    framework: str


def _place(path: Path) -> tuple[int | None, int | None]:
    step = rank = None
    for part in path.parts:
        if m := _STEP.match(part):
            step = int(m.group(1))
        elif m := _RANK.match(part):
            rank = int(m.group(1))
    return step, rank


def is_dump(path: str | os.PathLike) -> bool:
    """Whether ``path`` is an msprobe dump: a dump.json, or a folder with one below it."""
    p = Path(path)
    if p.is_file():
        return p.name == "dump.json" or _looks_like_dump(p)
    if not p.is_dir():
        return False
    return any(True for _ in _dump_jsons(p, limit=1))


def _looks_like_dump(p: Path) -> bool:
    try:
        with open(p, "rb") as f:
            head = f.read(4096)
    except OSError:
        return False
    return b'"data"' in head and (b'"task"' in head or b'"framework"' in head)


def _dump_jsons(root: Path, limit: int | None = None) -> Iterator[Path]:
    found = 0
    for folder, dirs, files in os.walk(root, followlinks=True):
        dirs.sort(key=lambda d: (int(re.sub(r"\D", "", d) or -1), d))
        dirs[:] = [d for d in dirs if d != "dump_tensor_data"]
        if "dump.json" in files:
            yield Path(folder, "dump.json")
            found += 1
            if limit and found >= limit:
                return


def _header(path: Path) -> dict:
    """The top-level fields before ``data`` (msprobe writes them first)."""
    out: dict = {}
    try:
        with open(path, "rb") as f:
            for prefix, event, value in ijson.parse(f):
                if prefix == "data":
                    break
                if "." not in prefix and prefix and event in ("string", "number", "null",
                                                               "boolean"):
                    out[prefix] = value
    except ijson.JSONError as exc:
        raise ConfigError(f"{path}: not a dump.json: {exc}") from None
    return out


def dump_files(path: str | os.PathLike) -> list[DumpFile]:
    """Every dump.json of a dump (its root, a step / rank / proc folder, or the file)."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"{path}: no such file or folder")
    files = [p] if p.is_file() else list(_dump_jsons(p))
    if not files:
        raise ConfigError(f"{path}: no dump.json below it (an msprobe dump has "
                          f"step<N>/proc<pid>/dump.json or step<N>/rank<R>/dump.json)")
    out = []
    for f in files:
        head = _header(f)
        framework = str(head.get("framework", "pytorch"))
        if framework.lower() == "mindspore":
            raise ConfigError(f"{f}: a MindSpore dump (.npy tensors): not supported; dump "
                              f"the PyTorch model with msprobe, or capture it with "
                              f"verify.capture")
        task = str(head.get("task", ""))
        if task != "tensor":
            raise ConfigError(f"{f}: no tensors: dump with task tensor (this dump's task is "
                              f"{task or 'not given'}: statistics alone cannot be judged)")
        step, rank = _place(f.resolve())
        out.append(DumpFile(str(f.resolve()), step, rank, task, str(head.get("level", "")),
                            framework))
    return out


_SUMMARY = ("Max", "Min", "Mean", "Norm", "md5")


def decode(value: Any, data_dir: str) -> Any:
    """A record's argument as Python values, tensors as TensorRefs."""
    if value is None:
        return None
    if isinstance(value, list):
        return [decode(v, data_dir) for v in value]
    if isinstance(value, dict):
        kind = value.get("type")
        if kind == "torch.Tensor":
            name = value.get("data_name")
            if not name:
                raise ValueError("a tensor without data_name (a statistics-only record)")
            summary = "|".join(repr(value.get(k)) for k in _SUMMARY if k in value)
            return TensorRef(os.path.join(data_dir, os.path.basename(str(name))),
                             str(value.get("dtype")), tuple(int(n) for n in value["shape"]),
                             summary)
        if kind == "torch.dtype":
            return getattr(torch, str(value.get("value", "")).split(".")[-1], None)
        if kind == "torch.Size":
            return tuple(value.get("value") or ())
        if kind == "slice":
            v = value.get("value") or [None, None, None]
            return slice(*v)
        if kind is not None and "value" in value:
            v = value["value"]
            return float(v) if kind == "float" and v is not None else v
        return {k: decode(v, data_dir) for k, v in value.items()}
    return value


@dataclass
class Record:
    name: str  # "Functional.rms_norm.0.forward"
    api: str  # "Functional.rms_norm"
    direction: str  # forward | backward | module
    body: dict


def records(dump: DumpFile) -> Iterator[Record]:
    """The records of one dump.json, in file order, one at a time. A file cut short is a
    ConfigError naming the file and the last whole record."""
    last = None
    try:
        with open(dump.path, "rb") as f:
            for name, body in ijson.kvitems(f, "data", use_float=True):
                last = name
                m = _RECORD.match(name)
                if m is None:
                    yield Record(name, name.split(".")[0], "module", body)
                else:
                    yield Record(name, m.group("api"), m.group("dir"), body)
    except ijson.JSONError as exc:
        where = f"after record {last}" if last else "before its first record"
        raise ConfigError(f"{dump.path}: cut short or not JSON ({exc}) {where}: copy the "
                          f"dump again, or judge the records before it with a repaired "
                          f"file") from None


def construct(dump: DumpFile) -> dict:
    """record -> parent module from construct.json (empty when the level records none)."""
    path = Path(dump.path).with_name("construct.json")
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in data.items() if isinstance(v, str)} if isinstance(data, dict) \
        else {}


def ran_on_npu(dump: DumpFile) -> bool:
    """Whether the dumped process ran torch_npu: its call stacks (stack.json) pass
    through torch_npu's files. (Tensor files are saved as CPU tensors either way.)"""
    path = Path(dump.path).with_name("stack.json")
    try:
        with open(path, "rb") as f:
            tail = b""
            while chunk := f.read(1 << 20):
                if b"torch_npu" in tail + chunk:
                    return True
                tail = chunk[-16:]
    except OSError:
        return False
    return False


def data_dir(dump: DumpFile) -> str:
    return str(Path(dump.path).with_name("dump_tensor_data"))
