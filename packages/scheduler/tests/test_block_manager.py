import pytest
from sparkinfer.scheduler.block_manager import BlockManager


def test_allocate_and_free_return_blocks():
    bm = BlockManager(4, 16)
    blocks = bm.allocate(3)
    assert len(set(blocks)) == 3 and bm.num_free_blocks == 1 and bm.usage == 0.75
    bm.free(blocks)
    assert bm.num_free_blocks == 4


def test_shared_block_freed_by_last_holder():
    bm = BlockManager(2, 16)
    [b] = bm.allocate(1)
    bm.share([b])
    bm.free([b])
    assert bm.ref_count(b) == 1 and bm.num_free_blocks == 1
    bm.free([b])
    assert bm.num_free_blocks == 2


def test_allocate_beyond_free_raises():
    bm = BlockManager(2, 16)
    assert not bm.can_allocate(3)
    with pytest.raises(RuntimeError, match="asked for 3 KV blocks with 2 free"):
        bm.allocate(3)


def test_blocks_for_rounds_up():
    bm = BlockManager(8, 16)
    assert [bm.blocks_for(n) for n in (0, 1, 16, 17)] == [0, 1, 1, 2]
