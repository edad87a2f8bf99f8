"""The rank runner on real gloo ranks: results come back, and a hung, raising or dying rank fails the run with
a message that names it, leaving no process behind.

No wall-clock bound a loaded 2-core box can miss: a hung rank is found *by* the timeout (``timed_out``, and not
before it), a raising or dying rank is found *without* it (``not timed_out``, under a timeout far longer than
any start-up). How fast the teardown is belongs in a benchmark, not here."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import collective_tasks as tasks
import pytest

from pytest_moeperf.kernels.rank_controller import RankFailure, RankPool, leftover_processes

TIMEOUT_S = 5.0
#: For runs that must end without reaching their timeout (a rank raised or died): if the runner waited for the
#: timeout instead, ``timed_out`` would say so.
PATIENT_S = 300.0
#: A generous end for a run that hangs by design: it ended (the timeout worked), however busy the box.
ENDED_WITHIN_S = TIMEOUT_S + 120.0


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie waiting for its reaper is dead)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] != "Z"


@pytest.fixture
def pool() -> Iterator[RankPool]:
    """A pool of its own with a short timeout (the session's ``ranks`` fixture waits 180 s)."""
    p = RankPool(timeout_s=TIMEOUT_S)
    yield p
    p.close()


def _fail(pool: RankPool, fn: object, *args: object,
          timeout_s: float | None = None) -> tuple[RankFailure, list[int], float]:
    group = pool.group(2, "gloo")  # started first, so the timing below is the task's alone
    pids = group.pids
    started = time.monotonic()
    with pytest.raises(RankFailure) as info:
        pool.run(fn, *args, world_size=2, timeout_s=timeout_s)  # type: ignore[arg-type]
    return info.value, pids, time.monotonic() - started


def test_two_ranks_all_reduce_and_reuse(ranks: RankPool) -> None:
    assert ranks.run(tasks.sum_of_ranks, 1.0, world_size=2) == [[3.0] * 4, [3.0] * 4]
    # The same processes serve the next task.
    first = ranks.run(tasks.whoami, world_size=2)
    second = ranks.run(tasks.whoami, world_size=2)
    assert [r[:3] for r in first] == [(0, 2, "gloo"), (1, 2, "gloo")]
    assert [r[3] for r in first] == [r[3] for r in second]


def test_hung_rank_is_named_and_killed(pool: RankPool) -> None:
    failure, pids, elapsed = _fail(pool, tasks.hang_on_rank_1)
    message = str(failure)
    assert failure.culprits == (1,)
    assert failure.during == "hang_on_rank_1" and failure.timed_out
    assert message.startswith("rank 1 did not finish hang_on_rank_1 within the 5 s timeout")
    assert "rank 0 (pid" in message and "blocked in torch.distributed" in message
    assert "in hang_on_rank_1" in message  # rank 1's Python stack, dumped before the kill
    logdir = Path(message.rsplit("logs in ", 1)[1].split()[0])
    assert (logdir / "rank1.log").exists()  # kept: the message points at it
    assert TIMEOUT_S <= elapsed < ENDED_WITHIN_S  # found by the timeout, not before it; and it ended
    assert leftover_processes(pids) == []
    assert not any(_alive(pid) for pid in pids)


def test_raising_rank_is_named_with_its_traceback(pool: RankPool) -> None:
    failure, pids, _ = _fail(pool, tasks.raise_on_rank_1, timeout_s=PATIENT_S)
    message = str(failure)
    assert failure.culprits == (1,)
    assert message.startswith("rank 1 raised during raise_on_rank_1")
    assert not failure.timed_out  # a failure does not wait for the timeout
    assert "Traceback (most recent call last)" in message
    assert "ValueError: rank 1 refuses to add" in message
    assert not any(_alive(pid) for pid in pids)


def test_dying_rank_is_named_with_its_exit_code(pool: RankPool) -> None:
    failure, pids, _ = _fail(pool, tasks.exit_on_rank_0, 7, timeout_s=PATIENT_S)
    message = str(failure)
    assert failure.culprits == (0,)
    assert message.startswith("rank 0 died during exit_on_rank_0")
    assert f"rank 0 (pid {pids[0]}): exited with code 7" in message
    assert not failure.timed_out
    assert not any(_alive(pid) for pid in pids)


def test_teardown_takes_the_ranks_own_children(pool: RankPool, tmp_path: Path) -> None:
    failure, pids, _ = _fail(pool, tasks.spawn_grandchild_then_hang, str(tmp_path))
    assert failure.culprits == (1,)
    grandchildren = [int((tmp_path / f"grandchild{r}.pid").read_text()) for r in (0, 1)]
    assert not any(_alive(pid) for pid in (*pids, *grandchildren))
    assert "all rank processes ended" in str(failure)


def test_pool_replaces_a_failed_group(pool: RankPool) -> None:
    _fail(pool, tasks.raise_on_rank_1, timeout_s=PATIENT_S)
    assert pool.run(tasks.sum_of_ranks, 0.5, world_size=2) == [[2.0] * 4, [2.0] * 4]


def test_unpicklable_result_is_reported(pool: RankPool) -> None:
    failure, _, _ = _fail(pool, tasks.unpicklable_result, timeout_s=PATIENT_S)
    assert failure.culprits == (0, 1)
    assert "Can't pickle" in str(failure) or "cannot pickle" in str(failure).lower()


def test_ranks_that_cannot_start_fail_the_start() -> None:
    """NCCL ranks on a machine without CUDA: the start fails (fast, not after the timeout), naming every rank."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: NCCL ranks would start")
    started = time.monotonic()
    with pytest.raises(RankFailure) as info:
        RankPool(timeout_s=TIMEOUT_S).run(tasks.whoami, world_size=2, backend="nccl")
    assert info.value.during == "start"
    assert info.value.culprits == (0, 1)
    assert str(info.value).startswith("ranks 0, 1 raised during start")
    assert time.monotonic() - started < 120


def test_closed_pool_leaves_nothing(pool: RankPool) -> None:
    group = pool.group(2, "gloo")
    pids, logdir = group.pids, group.log_path(0).parent
    pool.close()
    assert not any(_alive(pid) for pid in pids)
    assert not logdir.exists()  # logs are kept only when a failure message points at them


def test_rank_timeout_option_reaches_the_fixture(run_moeperf, pytester: pytest.Pytester) -> None:  # type: ignore[no-untyped-def]
    """A whole pytest session: ``--moeperf-rank-timeout 4`` bounds a hung rank, and the test fails naming it."""
    pytester.syspathinsert(Path(__file__).parent)
    pytester.makepyfile(test_hang="""
        import collective_tasks

        def test_hangs(ranks):
            ranks.run(collective_tasks.hang_on_rank_1, world_size=2)
    """)
    result = run_moeperf("--moeperf-rank-timeout", "4", "-p", "no:randomly")
    result.assert_outcomes(failed=1)  # the message names the option's 4 s, not the default 180 s
    result.stdout.fnmatch_lines(["*RankFailure: rank 1 did not finish hang_on_rank_1 within the 4 s timeout*"])
