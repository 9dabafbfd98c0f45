"""Site IDs per ordinal: stable across scale down/up and across lost state."""

import re
from pathlib import Path

from broker.ds.site import ensure_site_id
from mqtt_operator import sites


def test_new_ordinals_get_new_ids_and_known_ones_keep_theirs() -> None:
    ids = iter(["A", "B", "C", "D", "E"])
    three = sites.assign({}, 3, lambda: next(ids))
    assert three == {0: "A", 1: "B", 2: "C"}
    down = sites.assign(three, 2, lambda: next(ids))  # scale down: ordinal 2 keeps its ID
    assert down == three
    back = sites.assign(down, 4, lambda: next(ids))
    assert back == {0: "A", 1: "B", 2: "C", 3: "D"}


def test_a_colliding_random_id_is_drawn_again() -> None:
    ids = iter(["A", "A", "B"])
    assert sites.assign({}, 2, lambda: next(ids)) == {0: "A", 1: "B"}


def test_random_ids_have_the_form_a_standalone_broker_gives_itself(tmp_path: Path) -> None:
    site = sites.new_site_id()
    generated = ensure_site_id(tmp_path, "")
    assert len(site) == len(generated) == 16
    assert re.fullmatch("[0-9a-f]{16}", site) and re.fullmatch("[0-9a-f]{16}", generated)


def test_ids_assigned_in_upper_case_before_are_kept() -> None:
    """Never rewritten: the pod's data dir holds its ID as it was first given."""
    known = sites.merge_known({"0": "0A1B2C3D4E5F6071"}, None)
    assert sites.assign(known, 2, lambda: "00112233aabbccdd") == {
        0: "0A1B2C3D4E5F6071", 1: "00112233aabbccdd"}


def test_published_map_wins_and_status_restores_what_the_map_lost() -> None:
    merged = sites.merge_known({"0": "A", "1": "B"}, {"1": "X", "2": "C"})
    assert merged == {0: "A", 1: "B", 2: "C"}
    assert sites.as_data(merged) == {"0": "A", "1": "B", "2": "C"}
    assert sites.merge_known(None, None) == {}


def test_a_replaced_claim_gets_a_new_site_and_a_kept_one_keeps_its_site() -> None:
    ids = {0: "a", 1: "b", 2: "c"}
    first = sites.rebind(ids, {}, {0: "u0", 1: "u1"})  # before binding: claims adopted
    assert (first.ids, first.claims, first.replaced) == (ids, {0: "u0", 1: "u1"}, {})
    lost = sites.rebind(first.ids, first.claims, {0: "u0", 1: "u1-new", 2: "u2"},
                        lambda: "d")
    assert lost.ids == {0: "a", 1: "d", 2: "c"}
    assert lost.replaced == {1: "b"}
    assert lost.claims == {0: "u0", 1: "u1-new", 2: "u2"}
    # A claim not there (scaled down, or not created yet) keeps its binding and its site.
    again = sites.rebind(lost.ids, lost.claims, {0: "u0"})
    assert (again.ids, again.claims, again.replaced) == (lost.ids, lost.claims, {})


def test_the_sites_map_holds_claims_beside_ordinals_and_reads_back() -> None:
    data = sites.as_map_data({0: "a", 1: "b"}, {1: "u1"})
    assert data == {"0": "a", "1": "b", "claim-1": "u1"}
    assert sites.merge_known(data, None) == {0: "a", 1: "b"}
    assert sites.bound_claims(data) == {1: "u1"}
