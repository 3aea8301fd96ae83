"""Shared type vocabulary: the ``JSON`` object alias and the ``Literal`` event kinds.

Owns the names every layer uses for an API object as decoded JSON and for the closed sets of
event kinds (watch events, informer notifications, Kubernetes Event types), so that a typo in a
kind is a type error rather than a silently ignored branch.
"""

from __future__ import annotations

from typing import Any, Literal

__all__ = ["JSON", "EventType", "NotificationKind", "WatchEventType"]

JSON = dict[str, Any]
"""A Kubernetes object (or any JSON object) as decoded by :mod:`json`."""

WatchEventType = Literal["ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR"]
"""The ``type`` of one event on a Kubernetes watch stream."""

NotificationKind = Literal["add", "update", "delete"]
"""What an informer tells its event handlers (client-go ``OnAdd``/``OnUpdate``/``OnDelete``)."""

EventType = Literal["Normal", "Warning"]
"""The ``type`` of a ``core/v1`` Event."""
