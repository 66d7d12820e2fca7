"""KVSlotManager and the eviction policies: choices, LIFO reuse, holes, reserve, errors."""
import numpy as np
import pytest

from vla_edge_ros.core.kv_slots import (AdjacentCosines, KVCapacityError, KVSlotManager, POLICIES,
                                        adjacent_cosine_similarities, make_policy)

TPF = 4          # tokens per frame (small, so slot numbers stay readable)
HID = 8


def basis(i: int) -> np.ndarray:
    v = np.zeros(HID, dtype=np.float32)
    v[i] = 1.0
    return v


def manager(policy: str, frames: int, window: int = 100, prefix: int = 0) -> KVSlotManager:
    m = KVSlotManager(prefix + frames * TPF, TPF, make_policy(policy, window))
    if prefix:
        m.reserve_prefix(prefix)
    return m


def ids(m: KVSlotManager) -> list:
    return [f.frame_id for f in m.retained()]


def check_bookkeeping(m: KVSlotManager) -> None:
    """Every slot is in exactly one place: free, prefix, a frame or transient."""
    held = [m.prefix_slots] + [f.slots for f in m.retained()]
    held_flat = np.concatenate(held) if held else np.zeros(0, np.int32)
    assert len(set(held_flat.tolist())) == held_flat.size, "a slot is held twice"
    assert m.used_slots == held_flat.size + m.transient_slots
    assert m.free_slots + m.used_slots == m.capacity
    assert m.fill_fraction == pytest.approx(m.used_slots / m.capacity)
    assert all(0 <= s < m.capacity for s in held_flat.tolist())
    # The context kept as frames came and went: the prefix, then every frame's slots, oldest first.
    assert m.context_slots().tolist() == held_flat.tolist()
    if m.retained():
        assert m.context_slots(without_newest=1).tolist() == held_flat[:-m.tokens_per_frame].tolist()
    if m.policy.uses_adjacent:      # the cosines kept as frames came and went: the very bits computed afresh
        assert m._adjacent.values == AdjacentCosines.of(m.retained()).values


# ----------------------------------------------------------------------------- policies


def test_fifo_evicts_the_oldest_only_when_full():
    m = manager("fifo", frames=3)
    for i in range(3):
        assert m.add_frame(i, basis(i), i * TPF, reserve=0).evicted == []
    adm = m.add_frame(3, basis(3), 3 * TPF, reserve=0)
    assert [f.frame_id for f in adm.evicted] == [0]
    assert ids(m) == [1, 2, 3]
    assert m.evictions == 1
    check_bookkeeping(m)


def test_sliding_window_caps_frames_even_with_capacity_left():
    m = manager("sliding_window", frames=10, window=3)
    for i in range(6):
        m.add_frame(i, basis(i % HID), i * TPF, reserve=0)
        assert len(m.retained()) == min(i + 1, 3)
    assert ids(m) == [3, 4, 5]
    assert m.free_slots == 7 * TPF          # room left; the window, not capacity, evicted
    # When capacity is tighter than the window, capacity rules.
    m = manager("sliding_window", frames=2, window=5)
    for i in range(4):
        m.add_frame(i, basis(i), i * TPF, reserve=0)
    assert ids(m) == [2, 3]


def test_semantic_evicts_the_older_frame_of_the_most_alike_adjacent_pair():
    m = manager("semantic", frames=4)
    near_dup = basis(2) + 0.05 * basis(5)
    pooled = [basis(0), basis(1) + 0.5 * basis(0), basis(2), near_dup]    # pairs: (0,1) cos .45, (1,2) 0, (2,3) ~1
    for i, p in enumerate(pooled):
        m.add_frame(i, p, i * TPF, reserve=0)
    sims = adjacent_cosine_similarities(np.stack(pooled))
    most_alike_older = int(np.argmax(sims))
    adm = m.add_frame(4, basis(7), 4 * TPF, reserve=0)
    assert [f.frame_id for f in adm.evicted] == [most_alike_older] == [2]
    assert ids(m) == [0, 1, 3, 4]           # the old but distinct frame 0 survives; fifo would drop it
    check_bookkeeping(m)


def test_semantic_ties_pick_the_oldest_pair_and_one_frame_falls_back_to_oldest():
    m = manager("semantic", frames=3)
    for i in range(3):
        m.add_frame(i, basis(0), i * TPF, reserve=0)          # all identical: every pair ties at 1.0
    assert [f.frame_id for f in m.add_frame(3, basis(1), 3 * TPF, reserve=0).evicted] == [0]
    single = manager("semantic", frames=1)
    single.add_frame(0, basis(0), 0, reserve=0)
    assert [f.frame_id for f in single.add_frame(1, basis(0), TPF, reserve=0).evicted] == [0]


def test_semantic_policy_alone_on_constructed_embeddings():
    pol = make_policy("semantic", window_frames=1)
    m = manager("fifo", frames=5)            # only used to build RetainedFrame records
    vecs = [basis(0), basis(1), basis(1) * 3.0, basis(3), basis(4)]       # (1,2) identical direction
    for i, v in enumerate(vecs):
        m.add_frame(i, v, i * TPF, reserve=0)
    assert pol.victim(m.retained(), need_free=True) == 1
    assert pol.victim(m.retained(), need_free=False) is None
    assert pol.victim([], need_free=True) is None


def test_unknown_policy_lists_the_valid_ones():
    with pytest.raises(ValueError) as info:
        make_policy("lru", 4)
    for name in POLICIES:
        assert name in str(info.value)


# ----------------------------------------------------------------------------- slots


def test_lifo_reuse_gives_the_evicted_frames_slots_to_the_next_frame():
    m = manager("semantic", frames=3, prefix=5)
    slots = {}
    pooled = [basis(0), basis(1), basis(1)]          # frames 1 and 2 alike: frame 1 goes
    for i, p in enumerate(pooled):
        slots[i] = m.add_frame(i, p, 5 + i * TPF, reserve=0).slots.copy()
    adm = m.add_frame(3, basis(3), 5 + 3 * TPF, reserve=0)
    assert [f.frame_id for f in adm.evicted] == [1]
    np.testing.assert_array_equal(adm.slots, slots[1])        # the hole in the middle is reused, same order
    # Logical order: prefix, then frames oldest first, whatever their physical slots.
    expected = np.concatenate([m.prefix_slots, slots[0], slots[2], slots[1]])
    np.testing.assert_array_equal(m.context_slots(), expected)
    assert m.context_slots().dtype == np.int32
    check_bookkeeping(m)


def test_transient_slots_are_lifo_and_released():
    m = manager("fifo", frames=3)
    m.add_frame(0, basis(0), 0, reserve=0)
    t1 = m.alloc_transient(3)
    m.release_transient()
    t2 = m.alloc_transient(2)
    np.testing.assert_array_equal(t2, t1[:2])        # most recently freed first
    check_bookkeeping(m)
    m.release_transient()
    m.release_transient()                            # nothing held: a no-op
    assert m.transient_slots == 0 and m.used_slots == TPF


def test_reserve_makes_room_for_the_cycle_suffix():
    m = manager("fifo", frames=4)                    # 16 slots
    for i in range(4):
        m.add_frame(i, basis(i), i * TPF, reserve=0)
    adm = m.add_frame(4, basis(4), 4 * TPF, reserve=6)   # needs 4 + 6 free: evicts 3 frames (12 slots)
    assert [f.frame_id for f in adm.evicted] == [0, 1, 2]
    assert m.free_slots >= 6
    suffix = m.alloc_transient(6)
    assert suffix.size == 6 and not set(suffix.tolist()) & set(m.context_slots().tolist())
    check_bookkeeping(m)


def test_evict_frames_by_id():
    m = manager("fifo", frames=4)
    for i in range(4):
        m.add_frame(10 + i, basis(i), i * TPF, reserve=0)
    gone = m.evict_frames([12, 10])
    assert [f.frame_id for f in gone] == [12, 10] and ids(m) == [11, 13]
    assert (m.removals, m.evictions) == (2, 0)          # requested removals are not policy evictions
    with pytest.raises(KeyError, match="99"):
        m.evict_frames([99])
    check_bookkeeping(m)


def test_random_operations_keep_the_bookkeeping_exact():
    rng = np.random.default_rng(5)
    for policy in POLICIES:
        m = manager(policy, frames=6, window=4, prefix=3)
        next_id = 0
        added = placed = 0
        for _ in range(300):
            op = rng.integers(0, 5)
            if op <= 1:
                reserve = int(rng.integers(0, 2 * TPF))
                room_with_all_evicted = m.capacity - m.prefix_slots.size - m.transient_slots
                if TPF + reserve > room_with_all_evicted:
                    with pytest.raises(KVCapacityError):
                        m.add_frame(next_id, rng.normal(size=HID).astype(np.float32), next_id * TPF, reserve=reserve)
                else:
                    m.add_frame(next_id, rng.normal(size=HID).astype(np.float32), next_id * TPF, reserve=reserve)
                    assert m.free_slots >= reserve
                    added += 1
                next_id += 1
            elif op == 2 and m.free_slots:
                m.alloc_transient(int(rng.integers(1, m.free_slots + 1)))
            elif op == 3:
                m.release_transient()
            else:                                   # a swap keeping every other frame: only at a boundary
                kept = [(f.frame_id, f.pooled, f.position_start) for f in m.retained()[::2]]
                placement = m.plan_placement(kept)
                if m.transient_slots:
                    with pytest.raises(ValueError, match="transient slots are held"):
                        m.install(placement, reserve=0)
                else:
                    m.install(placement, reserve=0)
                    placed += len(kept)
                    assert [(f.frame_id, f.position_start) for f in m.retained()] == [(i, s) for i, _, s in kept]
            check_bookkeeping(m)
            assert len(m.retained()) <= (4 if policy == "sliding_window" else 6)
            assert [f.added_seq for f in m.retained()] == sorted(f.added_seq for f in m.retained())
        # A swap removes every frame (removals) and places the kept ones again (placed).
        assert added > 100 and placed > 0 and m.evictions + m.removals == added + placed - len(m.retained())


# ----------------------------------------------------------------------------- errors


def test_capacity_errors_are_explicit():
    m = manager("fifo", frames=2, prefix=4)          # 12 slots, 8 for frames
    with pytest.raises(KVCapacityError, match="reserve 5"):
        m.add_frame(0, basis(0), 0, reserve=5)       # 4 + 5 > 8 even with nothing retained
    assert m.retained() == [] and m.evictions == 0
    m.add_frame(0, basis(0), 0, reserve=0)
    with pytest.raises(KVCapacityError, match="alloc_transient"):
        m.alloc_transient(m.free_slots + 1)
    with pytest.raises(KVCapacityError, match="reserve_prefix"):
        m.reserve_prefix(5)
    with pytest.raises(ValueError, match="one frame"):
        KVSlotManager(3, TPF, make_policy("fifo", 1))


def test_bad_frames_are_rejected():
    m = manager("semantic", frames=2)
    m.add_frame(0, basis(0), 0, reserve=0)
    with pytest.raises(ValueError, match="already retained"):
        m.add_frame(0, basis(1), TPF, reserve=0)
    with pytest.raises(ValueError, match="NaN"):
        m.add_frame(1, np.full(HID, np.nan, np.float32), TPF, reserve=0)
    with pytest.raises(ValueError, match="pooled shape"):
        m.add_frame(1, np.ones(HID + 1, np.float32), TPF, reserve=0)
    with pytest.raises(ValueError, match="1-D float"):
        m.add_frame(1, np.ones((2, HID), np.float32), TPF, reserve=0)
    assert ids(m) == [0]


def test_frames_placed_by_a_swap_get_the_same_unit_vectors_as_frames_admitted_one_by_one():
    """The reconciler's shadow admits frames one by one; a swap places them all at once: the semantic policy
    must see bit-identical cosines either way, or the two sides would evict different frames."""
    rng = np.random.default_rng(3)
    pooled = rng.standard_normal((6, HID)).astype(np.float32)
    pooled[2] = 0.0                                            # a zero vector stays zero on both paths
    one_by_one = manager("semantic", frames=8)
    for i, p in enumerate(pooled):
        one_by_one.add_frame(i, p, i * TPF, reserve=0)
    placed = manager("semantic", frames=8)
    placed.install(placed.plan_placement([(i, p, i * TPF) for i, p in enumerate(pooled)]), reserve=0)
    for a, b in zip(one_by_one.retained(), placed.retained()):
        assert np.array_equal(a.unit, b.unit), a.frame_id
    assert not placed.retained()[2].unit.any()


def test_a_swap_placing_frames_with_units_computed_by_its_loader_gets_the_same_slots_and_units():
    """A loaded snapshot brings its unit vectors (StateSnapshot.prepare_units, off the cycle thread): placing
    with them must give exactly what placing without them gives, and units that do not match are refused."""
    from vla_edge_ros.core.state_snapshot import SnapshotFrame, StateSnapshot
    rng = np.random.default_rng(4)
    pooled = rng.standard_normal((5, HID)).astype(np.float32)
    frames = [(i, p, i * TPF) for i, p in enumerate(pooled)]
    snap = StateSnapshot(version=1, frames=[SnapshotFrame(i, 0.0, s, p) for i, p, s in frames])
    snap.prepare_units()
    plain, prepared = manager("semantic", frames=8), manager("semantic", frames=8)
    plain.install(plain.plan_placement(frames), reserve=0)
    prepared.install(prepared.plan_placement(frames, units=snap.units), reserve=0)
    for a, b in zip(plain.retained(), prepared.retained()):
        assert np.array_equal(a.unit, b.unit) and a.slots.tolist() == b.slots.tolist()
    assert not prepared.retained()[0].slots.flags.writeable
    with pytest.raises(ValueError, match="unit vectors for 5 frames"):
        manager("semantic", frames=8).plan_placement(frames, units=snap.units[:4])


def test_the_array_stack_hands_out_the_slots_the_list_did():
    """Random admissions, transients, removals, swaps (plan_placement + install) and resets (evict_all): the
    same slots per frame and the same free stack as the slot manager of before (kept as the swap benchmark's
    baseline)."""
    from slot_bookkeeping_before import BaselineKVSlotManager
    rng = np.random.default_rng(3)
    new = KVSlotManager(64 * TPF + 5, TPF, make_policy("semantic", 100))
    old = BaselineKVSlotManager(64 * TPF + 5, TPF, make_policy("semantic", 100))
    assert np.array_equal(new.reserve_prefix(5), old.reserve_prefix(5))
    next_id = 0
    for step in range(400):
        op = rng.integers(0, 5)
        if op == 0:
            pooled = rng.standard_normal(HID).astype(np.float32)
            a = new.add_frame(next_id, pooled, next_id * TPF, reserve=9)
            b = old.add_frame(next_id, pooled, next_id * TPF, reserve=9)
            assert np.array_equal(a.slots, b.slots) and [f.frame_id for f in a.evicted] == [f.frame_id for f in b.evicted]
            next_id += 1
        elif op == 1:
            n = int(rng.integers(0, 9))
            assert np.array_equal(new.alloc_transient(n), old.alloc_transient(n))
            new.release_transient()
            old.release_transient()
        elif op == 2 and new.retained():
            fid = new.retained()[int(rng.integers(0, len(new.retained())))].frame_id
            new.evict_frames([fid])
            old.evict_frames([fid])
        elif op == 3:
            kept = [(f.frame_id, f.pooled, f.position_start) for f in new.retained()[::2]]
            a, b = new.plan_placement(kept), old.plan_placement(kept)
            assert np.array_equal(a.slots, b.slots) and not a.slots.flags.writeable
            assert [f.frame_id for f in new.install(a, reserve=9)] == [f.frame_id for f in old.install(b, reserve=9)]
        else:
            assert [f.frame_id for f in new.evict_all()] == [f.frame_id for f in old.evict_all()]
        assert [(f.frame_id, f.slots.tolist(), f.added_seq) for f in new.retained()] == \
            [(f.frame_id, f.slots.tolist(), f.added_seq) for f in old.retained()]
        assert new.free_stack().tolist() == old.free_stack().tolist() and new.free_slots == old.free_slots
        check_bookkeeping(new)


def test_placed_frames_equal_constructed_ones():
    """RetainedFrame.placed (the swap's fast path) gives the frame the constructor gives."""
    from vla_edge_ros.core.kv_slots import RetainedFrame, unit_vector
    pooled, slots = basis(2) * 3, np.arange(TPF, dtype=np.int32)
    a = RetainedFrame(frame_id=7, slots=slots, pooled=pooled, position_start=40, added_seq=3)
    b = RetainedFrame.placed(7, slots, pooled, 40, 3, unit_vector(pooled))
    assert (a.frame_id, a.position_start, a.added_seq) == (b.frame_id, b.position_start, b.added_seq)
    assert a.slots is b.slots and a.pooled is b.pooled and np.array_equal(a.unit, b.unit)
    with pytest.raises(AttributeError):                 # still frozen
        b.frame_id = 8


def test_freeing_a_slot_twice_is_caught():
    m = manager("fifo", frames=2)
    slots = m.alloc_transient(m.free_slots)
    m.release_transient()
    with pytest.raises(RuntimeError, match="freed twice"):
        m._push(slots[:1])


def test_a_planned_swap_takes_the_lowest_slots_after_the_prefix_whatever_the_arena_held():
    """plan_placement lays the frames out from the capacity and the prefix alone (the loader plans it while the
    cycle admits and evicts); install puts it in force: the frames in the lowest slots after the prefix, the
    next admissions lowest first, every slot in one place."""
    m = manager("fifo", frames=6, prefix=3)
    for i in range(9):                                  # the arena's order scrambled by evictions
        m.add_frame(i, basis(i % HID), i * TPF, reserve=0)
    kept = [(f.frame_id, f.pooled, f.position_start) for f in m.retained()[1::2]]
    placement = m.plan_placement(kept)
    m.add_frame(9, basis(1), 9 * TPF, reserve=0)        # the cycle goes on between the plan and the boundary
    removed = m.install(placement, reserve=TPF)
    assert [f.frame_id for f in removed] == [4, 5, 6, 7, 8, 9]
    outside_prefix = sorted(set(range(m.capacity)) - set(m.prefix_slots.tolist()))
    assert np.concatenate([f.slots for f in m.retained()]).tolist() == outside_prefix[:len(kept) * TPF]
    assert m.add_frame(10, basis(2), 10 * TPF, reserve=0).slots.tolist() == \
        outside_prefix[len(kept) * TPF:(len(kept) + 1) * TPF]
    assert m.removals == 6
    check_bookkeeping(m)


def test_a_placement_is_refused_where_it_does_not_fit_and_nothing_changes():
    """install refuses, with the manager untouched, a placement planned for another arena, one that leaves less
    than the cycle's reserve free, and any while a cycle's transient slots are held."""
    m = manager("fifo", frames=4, prefix=2)
    for i in range(3):
        m.add_frame(i, basis(i % HID), i * TPF, reserve=0)
    before = ([f.frame_id for f in m.retained()], m.free_stack().tolist())
    three = [(f.frame_id, f.pooled, f.position_start) for f in m.retained()]
    with pytest.raises(ValueError, match="prefix of 0 slots"):
        m.install(manager("fifo", frames=4).plan_placement(three), reserve=0)
    with pytest.raises(ValueError, match="arena of"):
        m.install(manager("fifo", frames=5, prefix=2).plan_placement(three), reserve=0)
    with pytest.raises(KVCapacityError, match="reserved for a cycle"):
        m.install(m.plan_placement(three), reserve=TPF + 1)
    m.alloc_transient(1)
    with pytest.raises(ValueError, match="transient slots are held"):
        m.install(m.plan_placement(three[:1]), reserve=0)
    m.release_transient()
    assert ([f.frame_id for f in m.retained()], m.free_stack().tolist()) == before
    with pytest.raises(KVCapacityError, match="exist outside the prefix"):
        m.plan_placement(three + [(9, basis(1), 9 * TPF), (10, basis(0), 10 * TPF)])
    with pytest.raises(ValueError, match="duplicate frame ids"):
        m.plan_placement(three + three[:1])


def test_a_semantic_manager_that_keeps_its_cosines_evicts_what_recomputing_them_would():
    """Random admissions (the policy evicting), removals on request, swaps and resets with real-sized embeddings:
    the kept cosines stay bit-identical to a fresh computation (check_bookkeeping)."""
    rng = np.random.default_rng(11)
    hidden = 1536
    m = KVSlotManager(40 * TPF + 3, TPF, make_policy("semantic", 100))
    m.reserve_prefix(3)
    base = rng.standard_normal(hidden).astype(np.float32)
    next_id = 0
    for step in range(600):
        op = rng.integers(0, 50)
        if op <= 44:
            pooled = (base + rng.uniform(0.2, 2.0) * rng.standard_normal(hidden)).astype(np.float32)
            if step % 50 == 0:
                pooled[:] = 0.0                         # a zero vector: cosine 0 with everything
            m.add_frame(next_id, pooled, next_id * TPF, reserve=5)
            next_id += 1
        elif op <= 47 and m.retained():
            m.evict_frames([m.retained()[int(rng.integers(0, len(m.retained())))].frame_id])
        elif op == 48:
            m.install(m.plan_placement([(f.frame_id, f.pooled, f.position_start) for f in m.retained()[1::2]]),
                      reserve=5)
        elif step % 97 == 0:
            m.evict_all()
        check_bookkeeping(m)
    assert m.evictions > 50


def test_evictions_with_kept_cosines_match_the_policy_computing_them():
    """The same admissions through a manager (kept cosines) and through a plain list asked of the policy with
    no cosines given: the same frames evicted, in the same order."""
    rng = np.random.default_rng(12)
    hidden = 1536
    m = KVSlotManager(30 * TPF, TPF, make_policy("semantic", 100))
    policy = make_policy("semantic", 100)
    plain: list = []
    for i in range(400):
        pooled = rng.standard_normal(hidden).astype(np.float32) + (rng.standard_normal(hidden) if i % 3 else 0)
        pooled = pooled.astype(np.float32)
        want = []
        while len(plain) * TPF + TPF > m.capacity:
            idx = policy.victim(plain, need_free=True)
            want.append(plain.pop(idx).frame_id)
        adm = m.add_frame(i, pooled, i * TPF, reserve=0)
        plain.append(m.retained()[-1])
        assert [f.frame_id for f in adm.evicted] == want
    assert m.evictions > 300


@pytest.mark.parametrize("policy", ["fifo", "semantic"])
def test_readmitting_frames_held_before_a_swap_equals_adding_them_anew(policy):
    """A swap's late frames are re-admitted from the records the manager held before the swap (readmit: their
    embedding's checks and unit vector not redone). The state after must be the one add_frame builds: the same
    slots, positions, order, unit vectors to the bit, kept cosines and evictions, also when the policy evicts."""
    rng = np.random.default_rng(9)
    pooled = rng.standard_normal((12, HID)).astype(np.float32)
    before = manager(policy, frames=8)
    for i in range(10):                                        # fills and evicts
        before.add_frame(i, pooled[i], i * TPF, reserve=0)
    late = {f.frame_id: f for f in before.retained()[-2:]}     # the frames newer than the snapshot
    placement = [(i, pooled[i], i * TPF) for i in (2, 4, 5, 6, 7)]
    results = []
    for readmit in (False, True):
        m = manager(policy, frames=8)
        m.install(m.plan_placement(placement), reserve=0)
        for fid in (8, 9, 10, 11):                             # late ones, then two new frames that evict
            if readmit and fid in late:
                got = m.readmit(late[fid], 100 + fid * TPF, reserve=TPF)
            else:
                got = m.add_frame(fid, pooled[fid], 100 + fid * TPF, reserve=TPF)
            assert m.holds(fid) and not m.holds(fid + 100)
            results.append((got.slots.tolist(), [f.frame_id for f in got.evicted]))
        check_bookkeeping(m)
        results.append([(f.frame_id, f.slots.tolist(), f.position_start, f.added_seq, f.unit.tobytes())
                        for f in m.retained()])
    assert results[:5] == results[5:]
    with pytest.raises(ValueError, match="already retained"):
        m.readmit(late[9], 0, reserve=0)


@pytest.mark.parametrize("policy", sorted(POLICIES))
@pytest.mark.parametrize("count", [0, 5, 9, 14])
def test_admitting_a_whole_state_at_once_leaves_what_admitting_it_frame_by_frame_leaves(policy, count):
    """The reconciler's shadow after an applied swap (admit_all): the same slots, order, unit vectors, cosines,
    admission numbers, evictions and free slots as add_frame one by one, with and without evictions (9 frames
    fit with the reserve; sliding_window's window of 6 evicts earlier), including a repeated embedding."""
    rng = np.random.default_rng(count)
    pooled = rng.standard_normal((count, HID)).astype(np.float32)
    if count > 3:
        pooled[3] = pooled[1]
    frames = [(100 + i, p, 0) for i, p in enumerate(pooled)]
    one_by_one, at_once = (manager(policy, frames=10, window=6, prefix=3) for _ in range(2))
    evicted = sum(len(one_by_one.add_frame(fid, p, s, reserve=2).evicted) for fid, p, s in frames)
    assert at_once.admit_all(frames, reserve=2) == evicted
    assert one_by_one.evictions == at_once.evictions == evicted
    for a, b in zip(one_by_one.retained(), at_once.retained(), strict=True):
        assert (a.frame_id, a.added_seq) == (b.frame_id, b.added_seq)
        assert np.array_equal(a.slots, b.slots) and np.array_equal(a.unit, b.unit)
    if one_by_one._adjacent is not None:
        assert one_by_one._adjacent.values == at_once._adjacent.values
    assert np.array_equal(one_by_one.context_slots(), at_once.context_slots())
    assert one_by_one.free_slots == at_once.free_slots
    assert np.array_equal(one_by_one.alloc_transient(at_once.free_slots), at_once.alloc_transient(at_once.free_slots))
    check_bookkeeping(at_once)


def test_admit_all_fills_an_empty_manager_only():
    m = manager("semantic", frames=10)
    m.add_frame(1, basis(1), 0, reserve=0)
    with pytest.raises(ValueError, match="fills an empty manager"):
        m.admit_all([(2, basis(2), 0)], reserve=0)


def test_unit_vectors_in_blocks_are_the_bits_of_unit_vectors_in_one_piece():
    """unit_vectors_of: the 1.5B's width, 300 rows over several blocks (85 rows of 1536 a block), zero rows too."""
    from vla_edge_ros.core.kv_slots import UNIT_BLOCK_BYTES, unit_vectors, unit_vectors_of
    rng = np.random.default_rng(11)
    pooled = rng.standard_normal((300, 1536)).astype(np.float32)
    pooled[[0, 84, 85, 299]] = 0.0
    assert UNIT_BLOCK_BYTES // (8 * 1536) < 300
    whole = unit_vectors(pooled)
    assert np.array_equal(unit_vectors_of(list(pooled)), whole) and np.array_equal(unit_vectors_of(pooled), whole)
    assert unit_vectors_of([]).shape == (0, 1)
    bad = list(pooled)
    bad[200] = bad[200].copy()
    bad[200][3] = np.nan
    with pytest.raises(ValueError, match="finite vectors of one size"):
        unit_vectors_of(bad)
    with pytest.raises(ValueError, match="finite vectors of one size"):
        unit_vectors_of(list(pooled[:150]) + [np.zeros(8, np.float32)])


def test_a_wide_state_placed_at_once_matches_one_by_one_across_unit_blocks():
    """admit_all at the 1.5B's width over more frames than one unit block: the semantic policy's cosines and the
    units are the bits add_frame gives, so the reconciler's shadow and the primary evict alike."""
    rng = np.random.default_rng(12)
    pooled = rng.standard_normal((200, 1536)).astype(np.float32)
    frames = [(i, p, 0) for i, p in enumerate(pooled)]
    one_by_one = KVSlotManager(4 + 210 * TPF, TPF, make_policy("semantic", 100))
    at_once = KVSlotManager(4 + 210 * TPF, TPF, make_policy("semantic", 100))
    for m in (one_by_one, at_once):
        m.reserve_prefix(4)
    for fid, p, s in frames:
        one_by_one.add_frame(fid, p, s, reserve=0)
    assert at_once.admit_all(frames, reserve=0) == 0
    assert one_by_one._adjacent.values == at_once._adjacent.values
    assert all(np.array_equal(a.unit, b.unit) for a, b in zip(one_by_one.retained(), at_once.retained(), strict=True))


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_admitting_a_whole_state_with_known_unit_vectors_leaves_the_same_bits(policy):
    """The reconciler rebuilds its shadow after an applied swap with the old shadow's unit vectors (admit_all's
    known_units): all known, some known, or of another width (ignored), the result is the one computed afresh."""
    rng = np.random.default_rng(21)
    pooled = rng.standard_normal((9, HID)).astype(np.float32)
    frames = [(300 + i, p, 0) for i, p in enumerate(pooled)]
    fresh = manager(policy, frames=10, window=6, prefix=3)
    evicted = fresh.admit_all(frames, reserve=2)
    old = {f.frame_id: f.unit for f in fresh.retained()}
    for known in (old, {fid: u for fid, u in old.items() if fid % 2}, {fid: u[:-1] for fid, u in old.items()}):
        again = manager(policy, frames=10, window=6, prefix=3)
        assert again.admit_all(frames, reserve=2, known_units=known) == evicted
        for a, b in zip(fresh.retained(), again.retained(), strict=True):
            assert (a.frame_id, a.added_seq) == (b.frame_id, b.added_seq)
            assert np.array_equal(a.slots, b.slots) and np.array_equal(a.unit, b.unit)
        if fresh._adjacent is not None:
            assert fresh._adjacent.values == again._adjacent.values
        check_bookkeeping(again)
