"""The host copy of the export buffers' generation words (asr.host_generation_board): a swap's staleness check
at the boundary that reads memory instead of the device.

CPU: a real shared-memory file written by another process and mapped here, and IpcKV's check over it. The
exporter's side on a GPU (DeviceKvExporter marking the board around each export) is test_cuda_ipc.py's.
"""
import logging
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from vla_edge_ros import config as config_mod
from vla_edge_ros.core import swap_protocol
from vla_edge_ros.core.stale_snapshots import private_directory, remove_stale_snapshot_dirs
from vla_edge_ros.model.cuda_ipc import IpcKV, IpcKvMapper
from vla_edge_ros.model.errors import DeviceKVUnavailable
from vla_edge_ros.model.generation_board import (CLOSED, FILE_NAME, GenerationBoard, GenerationView, complete_word,
                                                 writing_word)

# The owner of a board in another process: makes it, marks buffer 1 written by export 4 and buffer 2 being written
# by export 7, prints the board's path, then waits to be killed.
OWNER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from vla_edge_ros.core.stale_snapshots import private_directory
    from vla_edge_ros.model.generation_board import GenerationBoard
    board = GenerationBoard(3, private_directory(Path(sys.argv[1])))
    board.writing(1, 4)
    board.complete(1, 4)
    board.writing(2, 7)
    print(board.path, flush=True)
    time.sleep(600)
""")


def _descriptor(board_path, buffer=1, generation=4, **changes):
    d = {"handle": "00" * 64, "bytes": 4096, "header_offset": 4000, "generation": generation, "rows": 64,
         "shape": [2, 4, 400, 64], "element": "uint16", "finite": True, "buffer": buffer,
         "generation_board": str(board_path)}
    d.update(changes)
    return d


def test_words_written_in_one_process_are_read_in_another_until_the_owner_is_killed(tmp_path):
    owner = subprocess.Popen([sys.executable, "-c", OWNER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        path = owner.stdout.readline().strip()
        assert path, "the owner printed no board"
        view = GenerationView(path)
        assert view.buffers == 3 and view.owner == owner.pid
        assert [view.word(i) for i in range(3)] == [0, complete_word(4), writing_word(7)] == [0, 8, 15]
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait(timeout=30)
    # Killed without closing: its last words still say buffer 1 is complete, but its memory is going away, so the
    # view no longer answers and the boundary reads the device word (which fails cleanly for a dead exporter) ...
    assert [view.word(i) for i in range(3)] == [None, None, None]
    # ... its directory is named for its pid, and the next reconciler's store removes it while the mapping stays.
    directory = os.path.dirname(path)
    assert os.path.basename(directory).startswith(f"vla_edge_swap_{owner.pid}_")
    assert [p.name for p in remove_stale_snapshot_dirs(tmp_path)] == [os.path.basename(directory)]
    assert not os.path.exists(directory)
    assert view.word(1) is None
    view.close()
    assert view.word(1) is None, "a closed view answers None, it does not raise"


def test_the_boundarys_check_reads_the_board_and_refuses_a_stale_or_closed_offer(tmp_path):
    board = GenerationBoard(3, private_directory(tmp_path))
    board.writing(1, 4)
    mapper = IpcKvMapper(device=None)                # no GPU: only the board is mapped, never a handle
    kv = IpcKV(_descriptor(board.path), mapper)
    kv.attach_board()
    assert kv.checks_on_host
    with pytest.raises(DeviceKVUnavailable, match="host generation board 9, offer 4"):
        kv.check_usable()                            # export 4 still being written
    board.complete(1, 4)
    kv.check_usable()
    board.writing(0, 1)                              # another buffer's export: not this offer's business
    kv.check_usable()
    board.writing(1, 5)                              # the next export into this offer's buffer was queued
    with pytest.raises(DeviceKVUnavailable, match="moved on .*host generation board 11"):
        kv.check_usable()
    newer = IpcKV(_descriptor(board.path, generation=5), mapper)
    newer.attach_board()
    board.complete(1, 5)
    newer.check_usable()
    assert mapper.board(str(board.path)) is newer._board is kv._board, "a board is mapped once per path"
    board.close()
    assert not board.directory.exists()
    with pytest.raises(DeviceKVUnavailable, match=f"host generation board {CLOSED}"):
        newer.check_usable()
    board.writing(1, 6)                              # an exporter's late call after its close: ignored
    board.complete(1, 6)
    assert board.word(1) == CLOSED
    mapper.close()


def test_a_new_reconcilers_board_replaces_the_old_ones_mapping(tmp_path):
    mapper = IpcKvMapper(device=None)
    first, second = (GenerationBoard(3, private_directory(tmp_path)) for _ in range(2))
    for board in (first, second):
        board.writing(1, 4)
        board.complete(1, 4)
    old_offer = IpcKV(_descriptor(first.path), mapper)
    old_offer.attach_board()
    old_view = old_offer._board
    assert old_view.word(1) == 8
    new_offer = IpcKV(_descriptor(second.path), mapper)    # the restarted reconciler's first offer
    new_offer.attach_board()
    new_offer.check_usable()
    assert old_view.word(1) is None, "the old board is unmapped: its offer would read the device word"
    assert mapper.board(str(first.path)) is not old_view    # mapped afresh if it ever came back
    for board in (first, second):
        board.close()
    mapper.close()


def test_a_board_that_cannot_be_made_leaves_no_directory_behind(tmp_path, monkeypatch):
    from vla_edge_ros.model import generation_board

    def no_mapping(*args, **kwargs):                 # e.g. /dev/shm full
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(generation_board.mmap, "mmap", no_mapping)
    directory = private_directory(tmp_path)
    with pytest.raises(OSError, match="No space"):
        GenerationBoard(3, directory)
    assert not directory.exists()


def test_a_board_that_cannot_be_used_leaves_the_check_to_the_device_and_says_so_once(tmp_path, caplog):
    mapper = IpcKvMapper(device=None)
    missing = tmp_path / "gone" / FILE_NAME
    with caplog.at_level(logging.WARNING, logger="vla_edge_ros.model.cuda_ipc"):
        for version in (1, 2):
            kv = IpcKV(_descriptor(missing, generation=version), mapper)
            kv.attach_board()
            assert not kv.checks_on_host
    assert sum("cannot map the reconciler's generation board" in r.getMessage() for r in caplog.records) == 1
    small = GenerationBoard(2, private_directory(tmp_path))
    kv = IpcKV(_descriptor(small.path, buffer=2), mapper)        # no word for buffer 2
    kv.attach_board()
    assert not kv.checks_on_host
    empty = tmp_path / "empty" / FILE_NAME
    empty.parent.mkdir()
    empty.write_bytes(b"")
    with pytest.raises(ValueError, match="not a generation board"):
        GenerationView(empty)
    with pytest.raises(ValueError, match="named export_generations"):     # a peer's path is not opened blindly
        GenerationView(tmp_path / "elsewhere")
    fifo = tmp_path / "fifo" / FILE_NAME
    fifo.parent.mkdir()
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match="not a generation board"):       # neither blocks nor maps a FIFO
        GenerationView(fifo)
    link = tmp_path / "link" / FILE_NAME
    link.parent.mkdir()
    link.symlink_to(small.path)
    with pytest.raises(OSError):                                         # nor follows a link
        GenerationView(link)
    with pytest.raises(ValueError, match="no buffer index"):
        IpcKV({k: v for k, v in _descriptor(small.path).items() if k != "buffer"}, mapper)
    kv = IpcKV({k: v for k, v in _descriptor(small.path).items() if k != "generation_board"}, mapper)
    kv.attach_board()
    assert not kv.checks_on_host, "an offer without a board is checked on the device"
    small.close()
    mapper.close()


def test_the_option_is_off_by_default_and_boards_live_where_snapshot_directories_do(tmp_path, monkeypatch):
    assert config_mod.load().asr.host_generation_board is False
    assert config_mod.load(overrides={"asr.host_generation_board": True}).asr.host_generation_board is True
    monkeypatch.setattr(swap_protocol, "SHM_DIR", tmp_path)
    assert swap_protocol.snapshot_base() == tmp_path
    monkeypatch.setattr(swap_protocol, "SHM_DIR", tmp_path / "absent")
    assert swap_protocol.snapshot_base() != tmp_path / "absent"
