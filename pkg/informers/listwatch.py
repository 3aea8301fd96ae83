"""`ListerWatcher`: list and watch one (resource, namespace, selectors) slice of the API.

Owns the request parameters shared by a reflector's LIST and WATCH calls, so both always
see the same slice. Invariant: list and watch use identical namespace and selectors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from pkg.base.types import JSON
from pkg.kube.client import KubeClient, RestClient, WatchStream
from pkg.kube.resources import Resource

__all__ = ["ListerWatcher", "ResourceListerWatcher", "RestListerWatcher"]


class ListerWatcher(Protocol):
    """The two calls a reflector makes for one slice of the API: LIST pages and a WATCH.

    Implementations must use the same namespace and selectors for both and be safe to call
    from the reflector's thread while another thread stops the returned stream.
    """

    @property
    def resource(self) -> Resource:
        """The resource this slice is of."""
        ...

    def list(
        self, *, limit: int | None, continue_token: str | None, resource_version: str | None
    ) -> JSON:
        """One LIST page (``limit``/``continue_token`` paginate; ``resource_version`` as in
        the API). Raises `pkg.kube.errors.ApiError` subclasses.
        """
        ...

    def watch(self, *, resource_version: str, timeout_seconds: int) -> WatchStream:
        """A WATCH from ``resource_version`` with bookmarks, ending after ``timeout_seconds`` at
        the latest. Raises `pkg.kube.errors.ApiError` subclasses.
        """
        ...


@dataclass(frozen=True)
class ResourceListerWatcher:
    """A `ListerWatcher` over any `KubeClient` for one (resource, namespace, selectors)."""

    client: KubeClient
    resource: Resource
    namespace: str | None = None
    label_selector: str | None = None
    field_selector: str | None = None

    def list(
        self, *, limit: int | None, continue_token: str | None, resource_version: str | None
    ) -> JSON:
        """One LIST page of this slice."""
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
        """A WATCH of this slice from ``resource_version``, with bookmarks."""
        return self.client.watch(
            self.resource,
            namespace=self.namespace,
            label_selector=self.label_selector,
            field_selector=self.field_selector,
            resource_version=resource_version,
            timeout_seconds=timeout_seconds,
            allow_watch_bookmarks=True,
        )


@dataclass(frozen=True)
class RestListerWatcher:
    """A `ListerWatcher` over `RestClient` that can ask for less: metadata only
    (PartialObjectMetadata, as client-go's metadata informers) and streaming watch-list.

    With ``watch_list`` the reflector first tries :meth:`watch_list` (one WATCH with
    ``sendInitialEvents=true``) instead of LIST + WATCH, and falls back to them when the server
    refuses it (4xx)."""

    client: RestClient
    resource: Resource
    namespace: str | None = None
    label_selector: str | None = None
    field_selector: str | None = None
    metadata_only: bool = False
    watch_list_enabled: bool = False

    def list(
        self, *, limit: int | None, continue_token: str | None, resource_version: str | None
    ) -> JSON:
        """One LIST page of this slice."""
        return self.client.list(
            self.resource,
            namespace=self.namespace,
            label_selector=self.label_selector,
            field_selector=self.field_selector,
            limit=limit,
            continue_token=continue_token,
            resource_version=resource_version,
            metadata_only=self.metadata_only,
        )

    def watch(self, *, resource_version: str, timeout_seconds: int) -> WatchStream:
        """A WATCH of this slice from ``resource_version``, with bookmarks."""
        return self.client.watch(
            self.resource,
            namespace=self.namespace,
            label_selector=self.label_selector,
            field_selector=self.field_selector,
            resource_version=resource_version,
            timeout_seconds=timeout_seconds,
            allow_watch_bookmarks=True,
            metadata_only=self.metadata_only,
        )

    def __getattr__(self, name: str) -> object:
        # Without watch-list enabled the reflector must not see a `watch_list` method.
        if name == "watch_list" and self.watch_list_enabled:
            return self._watch_list
        raise AttributeError(name)

    def _watch_list(self, *, timeout_seconds: int) -> WatchStream:
        """A streaming watch-list of this slice (initial state, end bookmark, then live)."""
        return self.client.watch(
            self.resource,
            namespace=self.namespace,
            label_selector=self.label_selector,
            field_selector=self.field_selector,
            resource_version="",
            timeout_seconds=timeout_seconds,
            allow_watch_bookmarks=True,
            metadata_only=self.metadata_only,
            send_initial_events=True,
        )
