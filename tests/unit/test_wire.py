from hypothesis import given
from hypothesis import strategies as st

from broker.mqtt.codec import Decoder
from broker.mqtt.packets import Publish
from broker.server.wire import shared_publish
from broker.session.message import Message

_VARIANTS = st.tuples(st.sampled_from([4, 5]), st.integers(0, 2), st.booleans())


@given(
    topic=st.text(st.characters(blacklist_characters="+#\x00", blacklist_categories=["Cs"]),
                  min_size=1, max_size=300),
    payload=st.binary(max_size=300),
    deliveries=st.lists(st.tuples(_VARIANTS, st.integers(1, 0xFFFF)), min_size=1, max_size=8),
)
def test_spliced_packet_ids_decode_to_the_same_message(
    topic: str, payload: bytes, deliveries: list[tuple[tuple[int, int, bool], int]]
) -> None:
    """One message delivered in any mix of variants (the first cached in the message's
    slots, the others beside it) with any packet identifiers."""
    message = Message(topic, payload)
    for (version, qos, retain), packet_id in deliveries:
        data = shared_publish(message, version, qos, retain, packet_id if qos else None)
        (packet,) = Decoder(version=version).feed(data)
        assert packet == Publish(topic, payload, qos, retain, False, packet_id if qos else None)
