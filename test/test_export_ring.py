"""The rule a GPU reconciler's KV exports follow (model/export_ring.py): a fresher offer is never written into
the buffer of the newest offer nor into one the primary may be copying from (the one handed out last).

The device side (CUDA IPC, generations checked around the copy) is test_cuda_ipc.py; this is the rule alone,
driven as the reconciler drives it: an export per fresher offer, a handout now and then."""
import pytest

from vla_edge_ros.config import ASRConfig, ConfigError, MIN_EXPORT_BUFFERS, load
from vla_edge_ros.model.export_ring import ExportRing


def test_a_handed_out_buffer_is_never_rewritten_while_fresher_offers_keep_coming():
    ring = ExportRing(ASRConfig().export_buffers)
    written = [ring.take()]                          # offer v1
    handed_out = written[-1]                          # the primary asked: v1 is handed out
    ring.protect({handed_out})
    for _ in range(20):                               # the round keeps catching up: v2, v3, ...
        written.append(ring.take())
        assert written[-1] != handed_out and written[-1] != written[-2]
        assert ring.free(), "with 3 buffers one is always free"
    newest = written[-1]
    ring.protect({newest})                            # the primary asked again: the newest is handed out now,
    assert handed_out in ring.free()                  # so v1's buffer is free again
    assert ring.free() == [b for b in range(3) if b != newest]
    nxt = ring.take()
    assert nxt != newest and ring.newest == nxt
    assert ring.take() not in (newest, nxt)           # the handed-out one stays untouched as long as protected


def test_round_robin_when_nothing_is_protected_and_every_buffer_comes_back():
    ring = ExportRing(3)
    assert [ring.take() for _ in range(6)] == [0, 1, 2, 0, 1, 2]


def test_too_few_buffers_are_refused():
    ring = ExportRing(2)
    ring.take()
    ring.protect({1})
    with pytest.raises(RuntimeError, match="no free buffer"):
        ring.take()                                   # newest 0 and protected 1: why the config asks for 3
    with pytest.raises(ValueError):
        ring.protect({5})
    with pytest.raises(ValueError):
        ExportRing(1)
    with pytest.raises(ConfigError, match="asr.export_buffers"):
        load(overrides={"asr.export_buffers": MIN_EXPORT_BUFFERS - 1})
