"""`ListerWatcher`: list and watch one (resource, namespace, selectors) slice of the API.

Owns the request parameters shared by a reflector's LIST and WATCH calls, so both always
see the same slice. Invariant: list and watch use identical namespace and selectors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from pkg.kube.client import JSON, KubeClient, WatchStream
from pkg.kube.resources import Resource

__all__ = ["ListerWatcher", "ResourceListerWatcher"]


class ListerWatcher(Protocol):
    @property
    def resource(self) -> Resource: ...

    def list(
        self, *, limit: int | None, continue_token: str | None, resource_version: str | None
    ) -> JSON: ...

    def watch(self, *, resource_version: str, timeout_seconds: int) -> WatchStream: ...


@dataclass(frozen=True)
class ResourceListerWatcher:
    client: KubeClient
    resource: Resource
    namespace: str | None = None
    label_selector: str | None = None
    field_selector: str | None = None

    def list(
        self, *, limit: int | None, continue_token: str | None, resource_version: str | None
    ) -> JSON:
        return self.client.list(
            self.resource,
            namespace=self.namespace,
            label_selector=self.label_selector,
            field_selector=self.field_selector,
            limit=limit,
            continue_token=continue_token,
            resource_version=resource_version,
        )

    def watch(self, *, resource_version: str, timeout_seconds: int) -> WatchStream:
        return self.client.watch(
            self.resource,
            namespace=self.namespace,
            label_selector=self.label_selector,
            field_selector=self.field_selector,
            resource_version=resource_version,
            timeout_seconds=timeout_seconds,
            allow_watch_bookmarks=True,
        )
