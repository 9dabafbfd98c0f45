"""What a publisher is told when Durable Storage did not store its PUBLISH.

Its QoS 1/2 PUBLISHes waiting for storage get no acknowledgement: the connection is closed
(with MQTT 5 a DISCONNECT first, whose reason says why), so the client keeps the messages
and resends them when it connects again. Not a PUBACK/PUBREC with 0x97 Quota exceeded: a
negative acknowledgement ends the exchange (MQTT 5.0 section 4.3.2), and clients' libraries
then forget the message; unless every application checks every reason code, a full disk
would drop messages at the publishers instead of having them held there until space is back.
One behaviour for both versions, too: 3.1.1 has no negative PUBACK. The reason code of the
DISCONNECT is 0x97 Quota exceeded for a lack of space or the storage quota (the client may
back off before reconnecting), 0x83 Implementation specific error for any other failure.
"""

import asyncio
import logging
from typing import Any

from broker.ds.space import DISK_FULL, QUOTA, StorageRefused, out_of_space
from broker.mqtt.constants import ReasonCode
from broker.mqtt.errors import MQTTError

log = logging.getLogger(__name__)


def storage_failure(client_id: str, stored: "asyncio.Future[Any]") -> MQTTError:
    """The error the publisher's connection is closed with (logged here: a refusal while
    the disk is full is the alarm's news, so a warning; anything else an error)."""
    error = None if stored.cancelled() else stored.exception()
    if error is not None and (out_of_space(error) or (
            isinstance(error, StorageRefused) and error.reason in (DISK_FULL, QUOTA))):
        log.warning("not storing messages from %s: %s", client_id, error)
        return MQTTError("durable storage refuses writes", ReasonCode.QUOTA_EXCEEDED)
    log.error("storing a message from %s failed: %r", client_id, error)
    return MQTTError("storage failed", ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR)
