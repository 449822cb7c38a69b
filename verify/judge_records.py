"""``verify.judge(path)``: the calls recorded in an msprobe dump or a capture folder,
judged against their ops' float64 goldens (README "Judge what ran on your NPU")."""
from __future__ import annotations

import os
from typing import Sequence

from . import api, recorded
from .errors import ConfigError


def judge(path: str | os.PathLike, *, ops: Sequence[str] | None = None,
          kernels: Sequence[str] = (), reports=None, run_id: str | None = None,
          store: str | None = None, registry: str | None = None,
          registry_required: bool = False, case_timeout: float | None = None,
          ray: str | None = None, shard: str | None = None,
          verify_fetched: float | None = None) -> api.RunResult:
    """Judge every recorded call of a bound API in ``path`` (a dump's root, a step / rank
    / proc folder, a dump.json, or a verify.capture folder); the RunResult's
    ``not_judged`` lists the records that were not, by API with counts and reasons.
    ``kernels``: your modules declaring ops with ``calls=`` bindings."""
    if not recorded.is_recorded_source(path):
        if not os.path.exists(path):
            raise ConfigError(f"{path}: no such file or folder")
        raise ConfigError(f"{path}: neither an msprobe dump (no dump.json below it) nor a "
                          f"verify.capture folder (no {recorded.CAPTURE_INDEX})")
    return api.run(level="all", ops=ops, backends=[recorded.BACKEND], cases=str(path),
                   kernels=kernels, reports=reports, run_id=run_id, store=store,
                   registry=registry, registry_required=registry_required,
                   case_timeout=case_timeout, ray=ray, shard=shard,
                   verify_fetched=verify_fetched)
