"""The collector settings of columnar work: in force inside the block, the previous ones after it."""

import gc

from eroica.runtime.system import COLUMNAR_GC_THRESHOLDS, columnar_gc_during


def test_columnar_gc_during_sets_then_restores_the_collector() -> None:
    before = gc.get_threshold()
    kept = [object()]  # something built before the block: frozen inside it
    with columnar_gc_during():
        assert gc.get_threshold() == COLUMNAR_GC_THRESHOLDS
        assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0  # collectable again
    assert kept


def test_columnar_gc_during_restores_after_an_error() -> None:
    before = gc.get_threshold()
    try:
        with columnar_gc_during():
            raise RuntimeError("stage failed")
    except RuntimeError:
        pass
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0
