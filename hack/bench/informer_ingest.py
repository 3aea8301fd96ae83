#!/usr/bin/env python3
"""Benchmark: informer ingest of a recorded LIST + WATCH stream of Pod-sized objects.

Generates N realistic Pods (~3 KB of JSON each), records a paginated LIST (N pods) and a WATCH
stream (N MODIFIED events), serves the recorded bytes from a replay HTTP server in its own
process, then ingests the same stream in a fresh child process per contender:
  raw         - our Reflector + SharedInformer cache of raw dicts;
  raw+compact - the same with the `compact` transform (interned strings, no managedFields);
  serialized  - the same cache holding JSON bytes (`pkg.informers.serialized`), what the
                controller uses for the kinds it caches in full;
  typed       - the official client's typed path: ApiClient.deserialize into V1PodList per page
                and V1Pod per watch event (what kubernetes.watch.Watch does with deserialize=True).
Prints objects/s, peak RSS and the ratio; then, per cache, memory per object (tracemalloc)
against the object's JSON size and the lister's CPU per read (get, by_index, list), serialized
against raw. Usage: .venv/bin/python hack/bench/informer_ingest.py [-n N]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import random
import resource
import time
import tracemalloc
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import urllib3
from kubernetes import client as k8s
from kubernetes.watch import watch as k8s_watch

from pkg.base.clock import RealClock
from pkg.base.types import JSON
from pkg.informers.compact import compact as compact_fn
from pkg.informers.informer import SharedInformer
from pkg.informers.listwatch import ResourceListerWatcher
from pkg.informers.serialized import SerializedCodec
from pkg.informers.store import BY_NODE_NAME, Indexer, index_by_node_name
from pkg.kube.client import RestClient
from pkg.kube.resources import PODS

iter_resp_lines: Callable[[Any], Iterator[str]] = k8s_watch.iter_resp_lines

PAGE = 500


def make_pod(i: int, rv: int) -> JSON:
    name = f"worker-{i:05d}-{i * 7919 % 100000:05x}"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": f"team-{i % 20}",
            "uid": f"{i:08x}-1b2c-4d5e-8f90-{i:012x}",
            "resourceVersion": str(rv),
            "generation": 1,
            "creationTimestamp": "2026-01-02T03:04:05Z",
            "generateName": name[:-5],
            "labels": {
                "app": f"app-{i % 50}",
                "pod-template-hash": f"{i * 31 % 99999:x}",
                "resource.nvidia.com/computeDomain": f"cd-{i % 40}",
            },
            "annotations": {"kubectl.kubernetes.io/restartedAt": "2026-01-02T03:00:00Z"},
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": f"rs-{i % 50}",
                    "uid": f"owner-{i % 50:04d}",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "nodeName": f"node-{i % 500:03d}",
            "serviceAccountName": "default",
            "restartPolicy": "Always",
            "schedulerName": "default-scheduler",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "containers": [
                {
                    "name": "main",
                    "image": "nvcr.io/nvidia/cuda:12.9.0-base-ubuntu24.04",
                    "command": ["/bin/sh", "-c"],
                    "args": ["nvidia-smi -L; sleep infinity"],
                    "env": [{"name": f"ENV_{k}", "value": f"value-{k}-{i}"} for k in range(6)],
                    "resources": {
                        "limits": {"cpu": "2", "memory": "4Gi"},
                        "requests": {"cpu": "1", "memory": "2Gi"},
                        "claims": [{"name": "channel"}],
                    },
                    "ports": [{"containerPort": 8080, "name": "http", "protocol": "TCP"}],
                    "volumeMounts": [
                        {
                            "name": "kube-api-access",
                            "readOnly": True,
                            "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                        }
                    ],
                    "imagePullPolicy": "IfNotPresent",
                    "terminationMessagePolicy": "File",
                    "terminationMessagePath": "/dev/termination-log",
                }
            ],
            "resourceClaims": [{"name": "channel", "resourceClaimTemplateName": f"cd-{i % 40}"}],
            "tolerations": [
                {
                    "key": "node.kubernetes.io/not-ready",
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 300,
                }
            ],
            "volumes": [
                {
                    "name": "kube-api-access",
                    "projected": {
                        "sources": [
                            {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
                            {
                                "configMap": {
                                    "name": "kube-root-ca.crt",
                                    "items": [{"key": "ca.crt", "path": "ca.crt"}],
                                }
                            },
                        ]
                    },
                }
            ],
        },
        "status": {
            "phase": "Running",
            "hostIP": f"10.0.{i % 250}.{i % 200}",
            "podIP": f"10.244.{i % 250}.7",
            "startTime": "2026-01-02T03:04:06Z",
            "qosClass": "Burstable",
            "conditions": [
                {
                    "type": t,
                    "status": "True",
                    "lastProbeTime": None,
                    "lastTransitionTime": "2026-01-02T03:04:09Z",
                }
                for t in (
                    "PodReadyToStartContainers",
                    "Initialized",
                    "Ready",
                    "ContainersReady",
                    "PodScheduled",
                )
            ],
            "containerStatuses": [
                {
                    "name": "main",
                    "ready": True,
                    "restartCount": 0,
                    "started": True,
                    "image": "nvcr.io/nvidia/cuda:12.9.0",
                    "imageID": f"sha256:{i:064x}",
                    "containerID": f"containerd://{i * 13:064x}",
                    "state": {"running": {"startedAt": "2026-01-02T03:04:08Z"}},
                }
            ],
        },
    }


def record(n: int) -> tuple[list[bytes], list[bytes], int]:
    pods = [make_pod(i, 1000 + i) for i in range(n)]
    list_rv = 1000 + n
    pages = []
    for start in range(0, n, PAGE):
        meta: JSON = {"resourceVersion": str(list_rv)}
        if start + PAGE < n:
            meta["continue"] = str(start + PAGE)
        items = [
            {k: v for k, v in p.items() if k not in ("kind", "apiVersion")}
            for p in pods[start : start + PAGE]
        ]
        body = {"kind": "PodList", "apiVersion": "v1", "metadata": meta, "items": items}
        pages.append(json.dumps(body, separators=(",", ":")).encode())
    events = []
    for i, p in enumerate(pods):
        p["metadata"]["resourceVersion"] = str(list_rv + 1 + i)
        p["metadata"]["labels"]["rev"] = "2"
        events.append(json.dumps({"type": "MODIFIED", "object": p}, separators=(",", ":")).encode())
    return pages, events, list_rv + n


def serve(pages: list[bytes], events: list[bytes], port_q: Any) -> None:
    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *_a: Any) -> None:
            pass

        def do_GET(self) -> None:
            q = dict(parse_qsl(urlsplit(self.path).query))
            if q.get("watch") == "true":
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                if q.get("resourceVersion") == str(1000 + len(events)):
                    for ev in events:  # one chunk per event, like the API server's flushes
                        line = ev + b"\n"
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                self.wfile.write(b"0\r\n\r\n")
                return
            body = pages[int(q.get("continue") or 0) // PAGE]
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    class Quiet(ThreadingHTTPServer):
        daemon_threads = True

        def handle_error(self, request: Any, client_address: Any) -> None:
            pass  # benchmark clients disconnect abruptly on purpose

    httpd = Quiet(("127.0.0.1", 0), H)
    port_q.put(httpd.server_address[1])
    httpd.serve_forever()


def run_raw(url: str, final_rv: int, out: Any, *, mode: str = "raw") -> None:

    cfg = k8s.Configuration()
    cfg.host = url
    inf = SharedInformer(
        ResourceListerWatcher(RestClient(k8s.ApiClient(cfg)), PODS),
        clock=RealClock(),
        page_size=PAGE,
        transform=compact_fn if mode == "raw+compact" else None,
        codec=SerializedCodec() if mode == "serialized" else None,
    )
    t0 = time.perf_counter()
    inf.start()
    while inf.last_sync_resource_version != str(final_rv):
        time.sleep(0.001)
    dt = time.perf_counter() - t0
    n = len(inf.indexer)
    inf.stop()
    out.put(
        (
            mode,
            dt,
            n,
            resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        )
    )


def run_typed(url: str, final_rv: int, out: Any) -> None:

    api = k8s.ApiClient()
    http = urllib3.PoolManager()
    cache: dict[str, Any] = {}
    t0 = time.perf_counter()
    token, rv = "", ""
    while True:
        resp = http.request("GET", f"{url}/api/v1/pods?limit={PAGE}&continue={token}")
        plist = api.deserialize(resp.data.decode(), "V1PodList", "application/json")
        for p in plist.items:
            cache[f"{p.metadata.namespace}/{p.metadata.name}"] = p
        rv, token = plist.metadata.resource_version, plist.metadata.var_continue or ""
        if not token:
            break
    resp = http.request(
        "GET", f"{url}/api/v1/pods?watch=true&resourceVersion={rv}", preload_content=False
    )
    for line in iter_resp_lines(resp):
        ev = json.loads(line)
        p = api.deserialize(json.dumps(ev["object"]), "V1Pod", "application/json")
        cache[f"{p.metadata.namespace}/{p.metadata.name}"] = p
        rv = p.metadata.resource_version
    assert rv == str(final_rv)
    dt = time.perf_counter() - t0
    out.put(("typed", dt, len(cache), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss))


def run_raw_compact(url: str, final_rv: int, out: Any) -> None:
    run_raw(url, final_rv, out, mode="raw+compact")


def run_serialized(url: str, final_rv: int, out: Any) -> None:
    run_raw(url, final_rv, out, mode="serialized")


def measure_memory(events: list[bytes], mode: str, out: Any) -> None:
    """tracemalloc'd size of the cache after ingesting the watch stream (the steady state),
    then the lister's CPU per read (outside tracemalloc): a get of every key in random order
    (for the serialized cache mostly LRU misses), a get of one hot key, a by_index of one
    node's pods, and a full list()."""

    idx = Indexer(
        {BY_NODE_NAME: index_by_node_name},
        codec=SerializedCodec() if mode == "serialized" else None,
    )
    json_bytes = 0
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    for line in events:
        obj = json.loads(line)["object"]
        idx.add(compact_fn(obj) if mode == "raw+compact" else obj)
        json_bytes += len(json.dumps(obj, separators=(",", ":")))
    used = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    keys = idx.list_keys()
    random.Random(1).shuffle(keys)
    node = index_by_node_name(idx.get_by_key(keys[0]) or {})[0]

    def per_call(fn: Any, calls: int) -> float:
        t0 = time.perf_counter()
        for i in range(calls):
            fn(i)
        return (time.perf_counter() - t0) / calls * 1e6

    reads = {
        "get (each key once)": per_call(lambda i: idx.get_by_key(keys[i]), len(keys)),
        "get (one hot key)": per_call(lambda _i: idx.get_by_key(keys[0]), len(keys)),
        "by_index (one node)": per_call(lambda _i: idx.by_index(BY_NODE_NAME, node), 200),
        "list (all)": per_call(lambda _i: idx.list(), 3),
    }
    out.put(("mem", used / len(idx), json_bytes / len(idx), len(idx), reads))


def child(target: Any, *args: Any) -> tuple[Any, ...]:
    q: Any = mp.get_context("fork").Queue()
    p = mp.get_context("fork").Process(target=target, args=(*args, q))
    p.start()
    res = q.get(timeout=1800)
    p.join()
    return tuple(res)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=20_000, help="objects (LIST and WATCH each)")
    args = ap.parse_args()
    pages, events, final_rv = record(args.n)
    size = sum(len(e) for e in events) / len(events)
    print(
        f"recorded: {args.n} pods, LIST {sum(map(len, pages)) / 1e6:.1f} MB in {len(pages)} "
        f"pages + WATCH {args.n} events (avg event {size:.0f} B)"
    )
    ctx = mp.get_context("fork")
    port_q: Any = ctx.Queue()
    server = ctx.Process(target=serve, args=(pages, events, port_q), daemon=True)
    server.start()
    url = f"http://127.0.0.1:{port_q.get(timeout=30)}"
    total = 2 * args.n
    results = {}
    for target in (run_raw, run_raw_compact, run_serialized, run_typed):
        kind, dt, n, rss_kb = child(target, url, final_rv)
        results[kind] = dt
        print(
            f"{kind:>11}: {total} objects in {dt:6.2f}s = {total / dt:8.0f} obj/s, "
            f"cached {n}, peak RSS {rss_kb / 1024:.0f} MiB"
        )
    for kind in ("raw", "raw+compact", "serialized"):
        print(f"ratio {kind}/typed throughput: {results['typed'] / results[kind]:.1f}x")
    reads: dict[str, dict[str, float]] = {}
    for mode in ("raw", "raw+compact", "serialized"):
        _, per_obj, json_per_obj, n, reads[mode] = child(measure_memory, events, mode)
        print(
            f"cache memory ({mode}): {per_obj:.0f} B/object vs "
            f"{json_per_obj:.0f} B JSON = {per_obj / json_per_obj:.2f}x ({n} objects)"
        )
    for op in reads["raw"]:
        raw, ser = reads["raw"][op], reads["serialized"][op]
        print(f"lister {op}: raw {raw:.2f} us, serialized {ser:.2f} us = {ser / raw:.1f}x")
    server.terminate()
    server.join()


if __name__ == "__main__":
    main()
