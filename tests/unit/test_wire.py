from hypothesis import given
from hypothesis import strategies as st

from broker.mqtt.codec import Decoder
from broker.mqtt.packets import Publish
from broker.server.wire import shared_publish
from broker.session.message import Message


@given(
    topic=st.text(st.characters(blacklist_characters="+#\x00", blacklist_categories=["Cs"]),
                  min_size=1, max_size=300),
    payload=st.binary(max_size=300),
    version=st.sampled_from([4, 5]),
    qos=st.integers(0, 2),
    retain=st.booleans(),
    packet_ids=st.lists(st.integers(1, 0xFFFF), min_size=1, max_size=3),
)
def test_spliced_packet_ids_decode_to_the_same_message(
    topic: str, payload: bytes, version: int, qos: int, retain: bool, packet_ids: list[int]
) -> None:
    message = Message(topic, payload)
    for packet_id in packet_ids:
        data = shared_publish(message, version, qos, retain, packet_id if qos else None)
        (packet,) = Decoder(version=version).feed(data)
        assert packet == Publish(topic, payload, qos, retain, False, packet_id if qos else None)
