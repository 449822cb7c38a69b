"""Ray clusters for the --ray tests, each in a process of its own (Ray keeps one
connection per process, and a test process must not be left connected).

``python ray_helpers.py hold NPU=4,golden=1``: start a one-node cluster with those
(fake) resources, print its address, and keep it until stdin closes.
``python ray_helpers.py nodes OUT_JSON KERNELS_PY STORE REPORTS``: a 4-node cluster (a head
with the ``golden`` resource, three nodes with 2 NPUs each, loopback only, all in this
process), a run over it, and one NPU node removed while its cases run.
"""
import json
import os
import sys
import time


def hold(resources: str) -> None:
    import logging
    logging.getLogger("ray._private.accelerators.npu").setLevel(logging.CRITICAL)
    import ray
    from verify.running.ray_run import parse_spec
    ray.init(num_cpus=2, resources=parse_spec(f"local:{resources}")["resources"],
             include_dashboard=False, object_store_memory=128 << 20, log_to_driver=False)
    print(ray.get_runtime_context().gcs_address, flush=True)
    sys.stdin.read()
    ray.shutdown()


def nodes(out_json: str, kernels: str, store: str, reports: str) -> None:
    import threading

    import ray
    from ray.cluster_utils import Cluster

    t0 = time.time()
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "resources": {"golden": 1}, "object_store_memory": 96 << 20})
    workers = [cluster.add_node(num_cpus=1, resources={"NPU": 2},
                                object_store_memory=96 << 20) for _ in range(3)]
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    up = time.time() - t0
    head = cluster.head_node.node_id[:8]
    import verify
    marks = os.path.join(os.path.dirname(kernels), "started")
    done = {}

    def go():
        done["result"] = verify.run(level="L0", ops=["lion"], dtypes=["fp32"],
                                    backends=["slow_npu"], kernels=[kernels], store=store,
                                    reports=reports, run_id="nodes", ray="auto", retries=1,
                                    progress_every=0)
    thread = threading.Thread(target=go)
    thread.start()
    victim, killed_at = None, None
    while thread.is_alive() and victim is None:  # a node with a case running on it
        time.sleep(0.2)
        running = {}
        for name in os.listdir(marks) if os.path.isdir(marks) else []:
            running[open(os.path.join(marks, name)).read().strip()] = name
        for node in workers:
            if node.node_id in running:
                victim = node
                break
    if victim is not None:
        cluster.remove_node(victim, allow_graceful=False)
        killed_at = time.time()
    thread.join()
    ended = time.time()
    result = done["result"]
    ray.shutdown()
    cluster.shutdown()
    seen = json.load(open(os.path.join(reports, "nodes", "results.json")))["meta"]["ray"][
        "node_loss_seen"]
    json.dump({"cluster_up_s": up, "head": head, "killed": victim is not None,
               "kill_to_rows_s": None if killed_at is None else ended - killed_at,
               "kill_to_loss_seen_s": None if not (seen and killed_at) else
               min(seen) - killed_at,
               "run_dir": str(result.run_dir), "exit_status": result.exit_status},
              open(out_json, "w"))


if __name__ == "__main__":
    {"hold": hold, "nodes": nodes}[sys.argv[1]](*sys.argv[2:])
