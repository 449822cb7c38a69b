"""Random mutations of real case files, for fuzzing the case loader (the test suite's
hypothesis test and benchmarks/fuzz_case_files.py share them)."""
import copy
import json
import random


def _paths(doc, prefix=()):
    yield prefix
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _paths(v, prefix + (i,))


def _mutate_json(doc, rng: random.Random, value):
    """Replace, delete or grow the value at a random path of ``doc``."""
    paths = [p for p in _paths(doc) if p]
    path = rng.choice(paths)
    parent = doc
    for p in path[:-1]:
        parent = parent[p]
    how = rng.random()
    if how < 0.6:
        parent[path[-1]] = value
    elif how < 0.8:
        del parent[path[-1]]
    elif isinstance(parent[path[-1]], list) and parent[path[-1]]:
        parent[path[-1]] = parent[path[-1]] * rng.randint(2, 40)  # sweeps that grow
    else:
        parent[path[-1]] = [value, parent[path[-1]]]
    return doc


def _mutate_bytes(data: bytes, rng: random.Random) -> bytes:
    data = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        i = rng.randrange(len(data))
        how = rng.random()
        if how < 0.4:
            data[i] = rng.randrange(256)
        elif how < 0.7:
            del data[i:i + rng.randint(1, 20)]
        else:
            data[i:i] = rng.choice([b"[", b"{", b"NaN", b"1e999", b"\xff", b'"', b"9" * 50])
    return bytes(data)


def mutate(data: bytes, rng: random.Random, value, byte_level: bool) -> bytes:
    """A mutated copy of a case file's bytes: bytes flipped, cut and inserted, or 1-3
    JSON values replaced, deleted or grown (``value`` is the JSON value to put in)."""
    if byte_level:
        return _mutate_bytes(data, rng)
    doc = json.loads(data)
    for _ in range(rng.randint(1, 3)):
        doc = _mutate_json(doc, rng, copy.deepcopy(value))
    return json.dumps(doc, allow_nan=True).encode()


def random_json(rng: random.Random, depth: int = 0):
    """A small random JSON value (NaN, huge numbers and odd strings included)."""
    kind = rng.randrange(9 if depth < 3 else 6)
    if kind == 0:
        return None
    if kind == 1:
        return rng.random() < 0.5
    if kind == 2:
        return rng.choice([0, -1, 1, 7, 2**31, 10**12, -10**6])
    if kind == 3:
        return rng.choice([0.5, -2.5, 1e-30, 1e300, float("nan"), float("inf")])
    if kind == 4:
        return rng.choice(["fp32", "bf16", "L0", "normal", "given", "x", "", "\u00e9"])
    if kind == 5:
        return rng.choice([[8, 8], [0], [], ["M", "K"]])
    if kind in (6, 7):
        return [random_json(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {rng.choice(["id", "shape", "dtype", "params", "inputs", "dims", "steps", "x"]):
            random_json(rng, depth + 1) for _ in range(rng.randint(0, 4))}
