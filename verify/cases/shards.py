"""CI sharding on ordinary runners: ``verify run --shard I/N`` takes a deterministic,
balanced 1/N of a selection, and ``verify merge`` joins the shard runs into one report.

Balance comes from each item's expected cost, known before anything runs: the elements of
its inputs times its steps (twice that with a backward pass), plus a fixed per-item cost.
Items are dealt largest first to the lightest shard (ties: the lower shard, then by name),
so every machine that builds the same selection deals the same shards.
"""
from __future__ import annotations

import hashlib
import math
from pathlib import Path

from verify.errors import ConfigError

PER_ITEM = 20_000  # elements' worth of harness time per item (start-up, report rows)


def parse(text: str) -> tuple[int, int]:
    """'2/3' -> (2, 3), with 1 <= I <= N."""
    try:
        i, n = (int(part) for part in str(text).split("/"))
    except ValueError:
        i = n = 0
    if not (n >= 1 and 1 <= i <= n):
        raise ConfigError(f"--shard takes I/N with 1 <= I <= N (such as 2/3), not {text!r}")
    return i, n


def item_name(case, kern) -> str:
    """An item's name, as pytest shows it: ``op[level-case_id-backend:kernel]``."""
    return f"{case.op}[{case.level}-{case.id}-{kern.id}]"


def expected_cost(case, kern) -> int:
    elements = sum(math.prod(shape) for shape in case.input_shapes.values())
    passes = 2 if getattr(case, "mode", "forward") in ("backward", "both") else 1
    return elements * max(1, case.steps) * passes + PER_ITEM


def pick(items: list, index: int, count: int, name_of) -> list:
    """The items of shard ``index`` (1-based) of ``count``, in their original order."""
    if count == 1:
        return list(items)
    costs = [expected_cost(*item) for item in items]
    order = sorted(range(len(items)), key=lambda k: (-costs[k], name_of(*items[k])))
    loads = [0] * count
    mine = set()
    for k in order:
        shard = min(range(count), key=lambda s: (loads[s], s))
        loads[shard] += costs[k]
        if shard == index - 1:
            mine.add(k)
    return [items[k] for k in sorted(mine)]


def take(items: list, shard: str | None) -> tuple[list, str, str | None]:
    """(this shard's items, the whole selection's id, the shard as 'I/N' or None): the
    id goes in the run's meta so verify merge can tell shards of one selection from runs
    of another."""
    whole = selection_id(item_name(c, k) for c, k in items)
    if not shard:
        return list(items), whole, None
    index, count = parse(shard)
    return pick(items, index, count, item_name), whole, f"{index}/{count}"


def selection_id(names) -> str:
    """A fingerprint of a whole (unsharded) selection: the same cases and kernels give the
    same id on every machine."""
    return hashlib.sha256("\n".join(sorted(names)).encode()).hexdigest()[:16]


def harness_id() -> str:
    """The package version and a fingerprint of the harness's own code: shards made by
    different harnesses do not merge."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        release = version("kernel-verify")
    except PackageNotFoundError:  # run from a source tree
        release = "source"
    h = hashlib.sha256()
    root = Path(__file__).resolve().parent.parent  # all of the verify package
    for path in sorted(root.rglob("*.py")):
        h.update(path.relative_to(root).as_posix().encode())
        h.update(path.read_bytes())
    return f"{release}+{h.hexdigest()[:12]}"
