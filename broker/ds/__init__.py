"""Durable Storage: messages and session state on LevelDB, after EMQX's design.

Hierarchy: database -> shard -> generation -> slab (a LevelDB directory) -> stream -> TTV.
Imports topics (broker.mqtt) and nothing about connections, sessions or routing. The
entry point is `DurableStorage`; see README "Durable Storage".
"""

from broker.ds.cook import StreamWrite
from broker.ds.iterator import Iterator, Stream
from broker.ds.settings import Settings
from broker.ds.shard import now_us
from broker.ds.site import SiteIdMismatch
from broker.ds.storage import DurableStorage
from broker.ds.subscribe import Subscription
from broker.ds.ttv import TTV
from broker.ds.tx import Conflict, PreconditionFailed, Transaction, TxAborted

__all__ = [
    "TTV",
    "Conflict",
    "DurableStorage",
    "Iterator",
    "PreconditionFailed",
    "Settings",
    "SiteIdMismatch",
    "Stream",
    "StreamWrite",
    "Subscription",
    "Transaction",
    "TxAborted",
    "now_us",
]
