"""``verify merge``: the shard runs of one selection joined into one run: the same
selection (and harness) or a clear error, every item once."""
from __future__ import annotations

from pathlib import Path

from verify.errors import ConfigError
from verify.report import results


def merge(run_dirs: list[str], out: str) -> tuple[list[dict], dict]:
    """The rows and meta of shard runs joined, after checking that they are the shards of
    one selection made by one harness, each exactly once."""
    if not run_dirs:
        raise ConfigError("verify merge needs at least one run folder")
    loaded = [(d, *results.load(d)) for d in run_dirs]
    first_dir, _, first = loaded[0]
    for d, _, meta in loaded:
        if meta.get("selection") is None:
            raise ConfigError(f"{d}: results.json names no selection (a run from before "
                              f"--shard existed, or not a verify run); run it again")
        if meta["selection"] != first["selection"]:
            raise ConfigError(
                f"{d} and {first_dir} are runs of different selections (selection "
                f"{meta['selection']} and {first['selection']}: other levels, ops, dtypes, "
                f"backends, case files or kernels); merge shards of one selection only")
        if meta.get("harness") != first.get("harness"):
            raise ConfigError(
                f"{d} and {first_dir} were made by different harness versions "
                f"({meta.get('harness')} and {first.get('harness')}); run every shard with "
                f"the same verify")
    shards = [meta.get("shard") or "1/1" for _, _, meta in loaded]
    counts = {s.split("/")[1] for s in shards}
    if len(counts) != 1:
        raise ConfigError(f"the runs were sharded differently: {', '.join(shards)}")
    n = int(counts.pop())
    seen: dict[str, str] = {}
    for (d, _, _), s in zip(loaded, shards):
        if s in seen:
            raise ConfigError(f"shard {s} is given twice ({seen[s]} and {d})")
        seen[s] = d
    missing = [f"{i}/{n}" for i in range(1, n + 1) if f"{i}/{n}" not in seen]
    if missing:
        raise ConfigError(f"shard(s) {', '.join(missing)} missing: a merged report without "
                          f"them would look complete")
    out_dir = Path(out)
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise ConfigError(f"--out {out}: exists and is not an empty folder")
    rows = [r for _, rs, _ in loaded for r in rs]
    warnings = list(dict.fromkeys(w for _, _, m in loaded for w in m.get("warnings", [])))
    meta = {"run_id": out_dir.name, "level": first.get("level"),
            "environment": first.get("environment", {}), "warnings": warnings,
            "selection": first["selection"], "harness": first.get("harness"),
            "shard": None, "merged_from": [m.get("run_id") for _, _, m in loaded]}
    if first.get("recorded"):  # one dump's index, the same in every shard
        meta["recorded"] = first["recorded"]
    return rows, meta
