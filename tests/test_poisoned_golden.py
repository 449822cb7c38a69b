"""A write-token holder's wrong golden cannot give a green run: clients recompute a sample
of what they fetch, dispute a mismatch, and the registry then serves that key as absent
until the admin resolves it; writers are recorded by token id; records the registry can
see are wrong are refused at PUT. Against a real `verify serve` on 127.0.0.1."""
import json
import os

import pytest
import torch

import verify
import verify.specs.registry  # noqa: F401  (verify.specs.registry, below)
from verify.golden import registry_records as rr
from verify.golden.registry_client import DISPUTED_HEADER, RegistryClient
from verify.golden.store import GoldenStore

from helpers import Service, run_cli

WRITE, ADMIN = "attacker-has-a-write-token", "the-admin"


def _poison(honest: GoldenStore, into: GoldenStore) -> list[str]:
    """Every golden of ``honest`` again, with the full record a client checks and its
    float values sign-flipped."""
    keys = []
    for e in _goldens(honest):
        tensors = {k: (-v if v.dtype.is_floating_point else v)
                   for k, v in honest.get_tensors(e.key).items()}
        into.put_tensors(e.key, tensors, e.meta)
        keys.append(e.key)
    return keys


def _goldens(store: GoldenStore):
    """The store's goldens (not the compute-precision floors kept beside them)."""
    return [e for e in store.entries() if not e.meta.get("derived")]


@pytest.fixture
def poisoned(tmp_path):
    honest = GoldenStore(tmp_path / "honest")
    verify.run(level="L0", ops=["lion"], backends=["torch"], dtypes=["fp32"],
               store=str(tmp_path / "honest"), reports=False)
    bad = GoldenStore(tmp_path / "bad")
    keys = _poison(honest, bad)
    svc = Service(tmp_path / "served", token=WRITE, admin_token=ADMIN)
    attacker = RegistryClient(svc.url, token=WRITE)
    assert all(attacker.push(k, bad) == 201 for k in keys)  # the records look right
    yield svc, keys, honest
    svc.stop()


def _flipped_lion():
    """The attack's other half: a lion kernel whose outputs are sign-flipped."""
    good = verify.specs.registry.kernels("lion", ["torch"])[0].fn

    @verify.kernel("lion", backend="flipped")
    def lion(**kw):
        return tuple(-t for t in good(**kw))
    return lion


def test_a_poisoned_golden_cannot_give_a_green_run(tmp_path, poisoned, monkeypatch):
    svc, keys, _ = poisoned
    monkeypatch.delenv("VERIFY_REGISTRY_TOKEN", raising=False)
    _flipped_lion()
    trusting = verify.run(level="L0", ops=["lion"], backends=["flipped"], dtypes=["fp32"],
                          store=str(tmp_path / "trusting"), registry=svc.url, reports=False,
                          verify_fetched=0.0)
    judged = [r for r in trusting.rows if r["standard"] != "expect_error" and r["steps"] == 1]
    assert judged and {r["verdict"] for r in judged} == {"PASS"}  # what the attack did
    res = verify.run(level="L0", ops=["lion"], backends=["flipped"], dtypes=["fp32"],
                     store=str(tmp_path / "fresh"), registry=svc.url, reports=False)
    assert res.exit_status == 1                       # the default sample: never green
    errors = [r for r in res.rows if r["verdict"] == "ERROR"]
    assert errors and all("differs from a recomputation" in r["reason"] for r in errors)
    client = RegistryClient(svc.url)
    items = {i["key"]: i for i in client.items()}
    disputed = [k for k in keys if items[k]["disputed"]]
    assert disputed and all(items[k]["writer"] == rr.token_id(WRITE) for k in keys)
    import httpx
    head = httpx.head(f"{svc.url}/v1/goldens/{disputed[0]}")
    assert head.status_code == 200 and DISPUTED_HEADER in head.headers
    # every client treats a disputed key as absent: computed here, the verdicts are right
    again = verify.run(level="L0", ops=["lion"], backends=["torch"], dtypes=["fp32"],
                       store=str(tmp_path / "other"), registry=svc.url, reports=False,
                       verify_fetched=1.0)
    judged = [r for r in again.rows if r["standard"] != "expect_error"]
    assert judged and all(r["verdict"] == ("PASS" if r.get("golden_source") == "computed"
                                           else "ERROR") for r in judged)
    assert any(r.get("golden_source") == "computed" for r in judged)


def test_verify_fetched_one_recomputes_every_fetched_golden(tmp_path, poisoned):
    svc, keys, _ = poisoned
    res = verify.run(level="L0", ops=["lion"], backends=["torch"], dtypes=["fp32"],
                     store=str(tmp_path / "fresh"), registry=svc.url, reports=False,
                     verify_fetched=1.0)
    judged = [r for r in res.rows if r["standard"] != "expect_error"]
    assert judged and {r["verdict"] for r in judged} == {"ERROR"}
    with pytest.raises(verify.ConfigError):
        verify.run(level="L0", ops=["lion"], reports=False, verify_fetched=1.5)


def test_audit_by_writer_and_the_admins_resolution(tmp_path, poisoned, monkeypatch):
    svc, keys, honest = poisoned
    out = run_cli("golden", "audit", "--registry", svc.url, "--writer", rr.token_id(WRITE))
    assert out.returncode == 1, out.stdout + out.stderr
    assert f"{len(keys)} differ" in out.stdout
    key = keys[0]
    monkeypatch.setenv("VERIFY_REGISTRY_ADMIN_TOKEN", "not-the-admin")
    refused = run_cli("golden", "resolve", key, "--registry", svc.url, "--drop",
                      env={"VERIFY_REGISTRY_ADMIN_TOKEN": "not-the-admin"})
    assert refused.returncode == 1 and "403" in refused.stdout
    dropped = run_cli("golden", "resolve", key, "--registry", svc.url, "--drop",
                      env={"VERIFY_REGISTRY_ADMIN_TOKEN": ADMIN})
    assert dropped.returncode == 0, dropped.stdout + dropped.stderr
    assert RegistryClient(svc.url, token=WRITE).push(key, honest) == 201  # writable again


def test_records_the_registry_can_see_are_wrong_are_refused_at_put(tmp_path):
    honest = GoldenStore(tmp_path / "honest")
    verify.run(level="L0", ops=["lion"], backends=["torch"], dtypes=["fp32"],
               store=str(tmp_path / "honest"), reports=False)
    entry = _goldens(honest)[0]
    tensors = honest.get_tensors(entry.key)
    forged = GoldenStore(tmp_path / "forged")
    other_key = "f" * 64  # a record of another case (or version) put under this key
    forged.put_tensors(other_key, tensors, entry.meta)
    entry2 = _goldens(honest)[1]
    forged.put_tensors(entry2.key, honest.get_tensors(entry2.key),
                       {**entry2.meta, "inputs_sha": "0" * 16})
    svc = Service(tmp_path / "served", token=WRITE)
    try:
        client = RegistryClient(svc.url, token=WRITE)
        assert client.push(other_key, forged) == 400
        assert client.push(entry2.key, forged) == 400
        assert client.push(entry.key, honest) == 201   # the honest writer is not blocked
        assert client.push(entry2.key, honest) == 201
    finally:
        svc.stop()


def test_the_cheapest_case_of_each_op_and_dtype_is_the_one_always_checked(tmp_path):
    from verify.golden import source as golden_source
    from verify.cases import selection
    plan = selection.build(selection.Selection(level="L0", ops=["lion"], backends=["torch"]))
    resolver = golden_source.GoldenResolver(None, verify_fetched=0.01)
    resolver.designate(c for c, _ in plan.items)
    spec = verify.op("lion")
    for (op, dtype), key in resolver._cheapest.items():
        group = [c for c, _ in plan.items if c.dtype == dtype and not c.expect_error]
        smallest = min(group, key=lambda c: sum(
            int(torch.tensor(s).prod()) for s in c.input_shapes.values()))
        chosen = next(c for c in group if c.golden_key(spec.golden_version) == key)
        assert sum(int(torch.tensor(s).prod()) for s in chosen.input_shapes.values()) == \
            sum(int(torch.tensor(s).prod()) for s in smallest.input_shapes.values())
        assert resolver._should_verify(spec, chosen, key)
