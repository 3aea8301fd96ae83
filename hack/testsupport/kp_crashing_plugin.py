"""Subprocess body for the crash test: a plugin that SIGKILLs itself at a checkpoint step.

Usage: python -m testsupport.kp_crashing_plugin <root> <api-url> <PrepareStarted|PrepareCompleted>
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import threading
from pathlib import Path

from kubernetes.client.configuration import Configuration

from pkg.kube.client import RestClient
from pkg.kube.config import Connection
from pkg.kubeletplugin.checkpoint import CheckpointStore, ClaimEntry, read_boot_id
from pkg.kubeletplugin.discovery import NodeDevices
from pkg.kubeletplugin.driver import KubeletPlugin
from testsupport.kp_harness import CLIQUE, make_config


class CrashingStore(CheckpointStore):
    """Dies like a SIGKILLed process right before persisting an entry in state ``crash_at``
    (PrepareCompleted) or right after it (PrepareStarted)."""

    crash_at = ""

    def put(self, entry: ClaimEntry) -> None:
        if entry.state == self.crash_at == "PrepareCompleted":
            os.kill(os.getpid(), signal.SIGKILL)
        super().put(entry)
        if entry.state == self.crash_at == "PrepareStarted":
            os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    root, url, crash_at = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    config = dataclasses.replace(
        make_config(root), boot_id_file=Path("/proc/sys/kernel/random/boot_id")
    )
    store = CrashingStore(directory=config.plugin_dir, boot_id=read_boot_id())
    store.crash_at = crash_at
    cfg = Configuration()
    cfg.host = url
    client = RestClient(Connection(cfg))
    devices = NodeDevices(driver_version="580.65.06", gpus=(), clique_id=CLIQUE)
    KubeletPlugin(config=config, client=client, devices=devices, store=store).start()
    print("READY", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
