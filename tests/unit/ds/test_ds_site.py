"""Site ID: random once, kept; a contradicting node.site_id is refused."""

import pytest

from broker.ds.site import SiteIdMismatch, ensure_site_id, read_site_id


def test_random_at_first_start_then_kept(tmp_path) -> None:
    first = ensure_site_id(tmp_path, "")
    assert len(first) == 16 and int(first, 16) >= 0
    assert ensure_site_id(tmp_path, "") == first
    assert ensure_site_id(tmp_path, first) == first
    assert ensure_site_id(tmp_path / "other", "") != first


def test_configured_at_first_start_is_stored(tmp_path) -> None:
    assert ensure_site_id(tmp_path, "site-a") == "site-a"
    assert read_site_id(tmp_path) == "site-a"


def test_contradiction_is_refused_naming_the_key(tmp_path) -> None:
    ensure_site_id(tmp_path, "site-a")
    with pytest.raises(SiteIdMismatch, match=r"node\.site_id 'site-b'.*'site-a'"):
        ensure_site_id(tmp_path, "site-b")


def test_the_stored_spelling_wins_over_a_configured_one_in_another_case(tmp_path) -> None:
    ensure_site_id(tmp_path, "00AB")
    assert ensure_site_id(tmp_path, "00ab") == "00AB"
