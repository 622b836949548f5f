"""`--kv-cache-memory SIZE` on run, chat and serve: it sizes a paged engine's block pool (a pool too small for
one full sequence is refused, naming the flag), answers do not change with it, and a slot engine, whose KV
is fixed at build time, refuses it."""

from __future__ import annotations

import json

import pytest
from cli_process import assert_user_error, trtbuild
from runner_engines import build_paged_engine

from engine_builder import LLM
from engine_builder.formats.build_config import Limits
from engine_builder.util.byte_size import parse_byte_size
from engine_builder.util.errors import InputError


@pytest.fixture(scope="module")
def paged(tiny_serve_engine, module_tmp_factory):
    """tiny_serve_engine's model built paged, and its (bytes per block, blocks one full sequence needs)."""
    lim = LLM(tiny_serve_engine).engine.limits
    engine = build_paged_engine(tiny_serve_engine.parent / "ckpt", module_tmp_factory.mktemp("kvmem") / "engine",
                                Limits(lim.max_batch, lim.max_input_len, lim.max_seq_len), 8)
    with LLM(engine, kv_cache_memory=64 << 10) as llm:  # 16 blocks: more than one sequence, under the cap
        layout = llm.backend.layout
        assert llm.backend.kv.pool.num_blocks == (64 << 10) // layout.bytes_per_block  # the bytes given, in blocks
        return engine, layout.bytes_per_block, layout.max_blocks_per_seq + 1


def _run(engine, *args):
    return trtbuild("run", engine, "--prompt", "w5 w6 w7", "--max-new-tokens", "12", "--temperature", "0",
                    "--json", "--no-chat", *args, timeout=120)


def test_run_takes_a_size_and_answers_the_same(paged):
    engine, per_block, needed = paged
    default = _run(engine)
    assert default.returncode == 0, default.stderr
    kib = -(-needed * per_block // 1024)  # the smallest pool that holds one full sequence, in whole KiB
    small = _run(engine, "--kv-cache-memory", f"{kib}KiB")
    assert small.returncode == 0, small.stderr
    assert json.loads(small.stdout)["token_ids"] == json.loads(default.stdout)["token_ids"]


def test_a_pool_smaller_than_one_sequence_is_refused_by_run_chat_and_serve(paged):
    engine, per_block, needed = paged
    size = str((needed - 1) * per_block)
    assert_user_error(_run(engine, "--kv-cache-memory", size), "--kv-cache-memory", f"at least {needed * per_block}")
    assert_user_error(trtbuild("chat", engine, "--kv-cache-memory", size, stdin="w5\n", timeout=120),
                      "--kv-cache-memory")
    assert_user_error(trtbuild("serve", engine, "--port", "0", "--kv-cache-memory", size, timeout=120),
                      "--kv-cache-memory")


def test_a_slot_engine_and_a_bad_size_are_refused(tiny_serve_engine, paged):
    assert_user_error(_run(tiny_serve_engine, "--kv-cache-memory", "1GiB"), "--kv-layout paged")
    assert_user_error(_run(paged[0], "--kv-cache-memory", "lots"), "--kv-cache-memory", "not a size")


@pytest.mark.parametrize("text, size", [("2GiB", 2 << 30), ("512MiB", 512 << 20), ("512m", 512 << 20),
                                        ("1.5GB", 1_500_000_000), ("4096", 4096), (" 8 KiB ", 8192)])
def test_sizes_read_as_users_write_them(text, size):
    assert parse_byte_size(text, "--x") == size


@pytest.mark.parametrize("text", ["", "lots", "0", "-1", "2TiB", "1e9", "0.1", "GiB"])
def test_what_is_not_a_size(text):
    with pytest.raises(InputError, match="--x .* is not a size"):
        parse_byte_size(text, "--x")
