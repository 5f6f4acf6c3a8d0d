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


def test_proc_readings_of_this_process_and_of_none() -> None:
    import os

    from eroica.runtime.system import cmdline, cpu_seconds, pid_alive, status_kib

    me = os.getpid()
    assert pid_alive(me) and not pid_alive(0)
    assert (cpu_seconds(me) or 0.0) > 0.0
    rss, peak = status_kib(me, "VmRSS"), status_kib(me, "VmHWM")
    assert rss is not None and peak is not None and 0 < rss <= peak
    assert b"python" in (cmdline(me) or b"").lower() or b"pytest" in (cmdline(me) or b"")
    assert status_kib(me, "NoSuchLine") is None
    gone = 2**22 + 1  # above the kernel's largest pid
    assert cpu_seconds(gone) is None and status_kib(gone, "VmRSS") is None and cmdline(gone) is None
