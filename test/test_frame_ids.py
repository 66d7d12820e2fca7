"""FrameIdEpochs: ids handed to the state keep growing across camera restarts."""
from vla_edge_ros.core.frame_ids import FrameIdEpochs


def test_ids_pass_through_until_the_numbering_starts_over():
    ids = FrameIdEpochs()
    assert [ids.map(r) for r in (1, 2, 2, 5, 9)] == [1, 2, 2, 5, 9]        # repeats and skips are kept
    assert ids.restarts == 0
    assert [ids.map(r) for r in (1, 2, 4)] == [10, 11, 13]                 # restarted camera: after 9
    assert [ids.map(r) for r in (3, 7)] == [14, 18]                        # and again, after 13
    assert ids.restarts == 2
