"""Shared informers and work queues with client-go semantics over raw JSON dicts.

Public surface: `SharedInformerFactory`, `SharedInformer`, `Lister`, `Indexer` (+ stock index
functions, `DeletedFinalStateUnknown`, and the `ObjectCodec` deciding how it holds objects, e.g.
`SerializedCodec`), `Reflector`, `ListerWatcher`, the work queues and rate limiters
(`pkg.informers.workqueue`), all timed on an injected `pkg.base.Clock`.
"""

from pkg.informers.factory import SharedInformerFactory
from pkg.informers.informer import SharedInformer
from pkg.informers.listener import HandlerRegistration
from pkg.informers.lister import Lister
from pkg.informers.listwatch import ListerWatcher, ResourceListerWatcher
from pkg.informers.reflector import BackoffPolicy, Reflector
from pkg.informers.serialized import SerializedCodec
from pkg.informers.store import (
    BY_NODE_NAME,
    BY_OWNER_UID,
    BY_UID,
    DeletedFinalStateUnknown,
    Indexer,
    IndexFunc,
    ObjectCodec,
    by_label,
    index_by_node_name,
    index_by_owner_uid,
    index_by_uid,
    meta_namespace_key,
)
from pkg.informers.workqueue import (
    BucketRateLimiter,
    DelayingQueue,
    ItemExponentialFailureRateLimiter,
    MaxOfRateLimiter,
    RateLimiter,
    RateLimitingQueue,
    WorkQueue,
    default_controller_rate_limiter,
)

__all__ = [
    "BY_NODE_NAME",
    "BY_OWNER_UID",
    "BY_UID",
    "BackoffPolicy",
    "BucketRateLimiter",
    "DelayingQueue",
    "DeletedFinalStateUnknown",
    "HandlerRegistration",
    "IndexFunc",
    "Indexer",
    "ItemExponentialFailureRateLimiter",
    "Lister",
    "ListerWatcher",
    "MaxOfRateLimiter",
    "ObjectCodec",
    "RateLimiter",
    "RateLimitingQueue",
    "Reflector",
    "ResourceListerWatcher",
    "SerializedCodec",
    "SharedInformer",
    "SharedInformerFactory",
    "WorkQueue",
    "by_label",
    "default_controller_rate_limiter",
    "index_by_node_name",
    "index_by_owner_uid",
    "index_by_uid",
    "meta_namespace_key",
]
