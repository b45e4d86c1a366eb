"""The one definition of acceptance: counters, the three figures, merge."""

import pytest

from specwise.engine.spec_decode.metrics import SpecStats


def docstring_example() -> SpecStats:
    stats = SpecStats()
    for num_accepted in (4, 1, 0):
        stats.record(num_drafted=4, num_accepted=num_accepted)
    return stats


def test_docstring_worked_example():
    stats = docstring_example()
    assert (stats.drafts, stats.draft_tokens, stats.accepted_tokens) == (3, 12, 5)
    assert stats.accepted_per_position == [2, 1, 1, 1]
    assert stats.acceptance_rate == pytest.approx(5 / 12)
    assert stats.mean_acceptance_length == pytest.approx(8 / 3)
    assert stats.per_position_acceptance == pytest.approx([2 / 3, 1 / 3, 1 / 3, 1 / 3])
    assert sum(stats.per_position_acceptance) == pytest.approx(stats.mean_acceptance_length - 1)


def test_a_step_without_drafts_is_not_a_draft():
    stats = docstring_example()
    stats.record(num_drafted=0, num_accepted=0)
    assert (stats.drafts, stats.draft_tokens) == (3, 12)


def test_figures_are_none_before_any_draft():
    stats = SpecStats()
    stats.record(0, 0)
    assert stats.acceptance_rate is None
    assert stats.mean_acceptance_length is None
    assert stats.per_position_acceptance is None
    assert stats.to_dict()["acceptance_rate"] is None


def test_shorter_drafts_count_as_not_accepted_at_later_positions():
    stats = SpecStats()
    stats.record(num_drafted=1, num_accepted=1)
    stats.record(num_drafted=3, num_accepted=2)
    assert stats.accepted_per_position == [2, 1, 0]
    assert stats.per_position_acceptance == [1.0, 0.5, 0.0]
    assert stats.mean_acceptance_length == 2.5


def test_merge_adds_counters_and_aligns_positions():
    short = SpecStats()
    short.record(2, 2)
    short.drafting_seconds, short.verifying_seconds = 0.5, 1.0
    merged = docstring_example().merge(short)
    assert (merged.drafts, merged.draft_tokens, merged.accepted_tokens) == (4, 14, 7)
    assert merged.accepted_per_position == [3, 2, 1, 1]
    assert (merged.drafting_seconds, merged.verifying_seconds) == (0.5, 1.0)
    assert merged.mean_acceptance_length == pytest.approx(1 + 7 / 4)


def test_copy_is_a_snapshot():
    stats = docstring_example()
    snapshot = stats.copy()
    stats.record(4, 4)
    assert snapshot.drafts == 3 and snapshot.accepted_per_position == [2, 1, 1, 1]


def test_record_rejects_more_accepted_than_drafted():
    with pytest.raises(ValueError):
        SpecStats().record(num_drafted=2, num_accepted=3)
    with pytest.raises(ValueError):
        SpecStats().record(num_drafted=2, num_accepted=-1)


@pytest.mark.parametrize("fields", [
    dict(drafts=-1),
    dict(drafts=1, draft_tokens=2, accepted_tokens=3, accepted_per_position=[1, 1, 1]),
    dict(drafts=2, draft_tokens=4, accepted_tokens=3, accepted_per_position=[2, 2]),
    dict(drafts=2, draft_tokens=4, accepted_tokens=3, accepted_per_position=[1, 2]),
    dict(drafts=1, draft_tokens=4, accepted_tokens=2, accepted_per_position=[2]),
    dict(verifying_seconds=-0.1),
])
def test_inconsistent_counters_are_rejected(fields):
    with pytest.raises(ValueError):
        SpecStats(**fields)


def test_to_dict_carries_counters_and_figures():
    summary = docstring_example().to_dict()
    assert summary["accepted_per_position"] == [2, 1, 1, 1]
    assert summary["mean_acceptance_length"] == pytest.approx(8 / 3)
    assert summary["per_position_acceptance"][0] == pytest.approx(2 / 3)
