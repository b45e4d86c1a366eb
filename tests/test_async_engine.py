"""AsyncEngine: concurrent asyncio streams, cancellation aborts, failures and shutdown."""

import asyncio
import threading

import pytest

from conftest import TINY_ENGINE
from specwise.engine.async_engine import AsyncEngine
from specwise.engine.fault_isolation import EngineDead
from specwise.engine.llm import LLM
from specwise.errors import InputError
from specwise.sampling_params import SamplingParams
from tiny_models import tiny_checkpoint

# generous bound on waiting for the engine thread; only ever reached when something hangs
PATIENCE_S = 10


@pytest.fixture
def async_engine():
    engine = AsyncEngine(lambda: LLM(checkpoint=tiny_checkpoint(), **TINY_ENGINE).engine)
    yield engine
    engine.shutdown()


def long_request() -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=80, ignore_eos=True)


async def collect(async_engine: AsyncEngine, prompt, params) -> list:
    return [output async for output in async_engine.generate(prompt, params)]


async def settled(async_engine: AsyncEngine) -> None:
    """Wait until no request is in flight and the engine has nothing left to step."""
    for _ in range(PATIENCE_S * 100):
        with async_engine.lock:
            idle = not async_engine.engine.has_unfinished() and not async_engine.num_in_flight
        if idle:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the engine never settled")


def assert_all_blocks_free(async_engine: AsyncEngine) -> None:
    with async_engine.lock:
        manager = async_engine.engine.block_manager
        manager.check_invariants()
        assert manager.num_free_blocks == manager.num_blocks
        assert async_engine.engine.requests == {}


def test_concurrent_streams_equal_llm_generate(llm, async_engine):
    prompts = ["Hello, world", "abc", "The quick brown fox jumps", "x", "0123456789", "def f(x): return x"]
    params = [SamplingParams(temperature=0, max_tokens=6 + 3 * i) if i % 2 else
              SamplingParams(temperature=1.5, max_tokens=12, seed=100 + i) for i in range(len(prompts))]
    expected = llm.generate(prompts, params)

    async def main():
        return await asyncio.gather(*(collect(async_engine, p, sp) for p, sp in zip(prompts, params)))

    streams = asyncio.run(main())
    for stream, reference in zip(streams, expected):
        final = stream[-1]
        assert final.finished and not any(o.finished for o in stream[:-1])
        assert final.output_token_ids == reference.output_token_ids
        assert final.text == reference.text and final.finish_reason == reference.finish_reason
        assert sum((o.new_token_ids for o in stream), []) == final.output_token_ids
        assert "".join(o.new_text for o in stream) == final.text
    assert_all_blocks_free(async_engine)


def test_breaking_out_of_the_stream_aborts_the_request(async_engine):
    async def main():
        other = asyncio.create_task(collect(async_engine, "abc", SamplingParams(temperature=0, max_tokens=30)))
        received = 0
        async for _ in async_engine.generate("Hello, world", long_request()):
            received += 1
            if received == 2:
                break
        await settled(async_engine)
        return received, await other

    received, other = asyncio.run(main())
    assert received == 2
    assert other[-1].finish_reason == "length" and len(other[-1].output_token_ids) == 30
    assert_all_blocks_free(async_engine)


def test_cancelling_the_consumer_task_aborts_the_request(async_engine):
    async def main():
        first_output = asyncio.Event()

        async def consume():
            async for _ in async_engine.generate("Hello, world", long_request()):
                first_output.set()

        task = asyncio.create_task(consume())
        await first_output.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await settled(async_engine)

    asyncio.run(main())
    assert_all_blocks_free(async_engine)


def test_a_bad_request_raises_in_the_caller(async_engine):
    with pytest.raises(InputError, match="empty"):
        asyncio.run(collect(async_engine, "", SamplingParams()))
    assert async_engine.num_in_flight == 0


def test_a_request_whose_work_raises_fails_and_the_engine_carries_on(async_engine, monkeypatch):
    runner = async_engine.engine.runner

    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    with monkeypatch.context() as patch:
        patch.setattr(runner, "execute", broken)
        with pytest.raises(RuntimeError, match="the engine failed this request: RuntimeError: boom"):
            asyncio.run(collect(async_engine, "abc", SamplingParams(temperature=0, max_tokens=5)))
    assert_all_blocks_free(async_engine)
    stream = asyncio.run(collect(async_engine, "abc", SamplingParams(temperature=0, max_tokens=5)))
    assert stream[-1].finish_reason == "length"


def test_shutdown_ends_streams_in_flight_and_stops_the_thread(async_engine):
    async def main():
        stream = async_engine.generate("Hello, world", long_request())
        first = await anext(stream)
        async_engine.shutdown()
        rest = await asyncio.wait_for(collect_rest(stream), timeout=PATIENCE_S)
        return [first] + rest

    async def collect_rest(stream):
        return [output async for output in stream]

    outputs = asyncio.run(main())
    assert outputs[-1].finished and outputs[-1].finish_reason == "abort"
    assert not async_engine.thread.is_alive()
    assert_all_blocks_free(async_engine)


def test_requests_after_shutdown_are_refused(async_engine):
    async_engine.shutdown()

    async def main():
        await asyncio.wait_for(collect(async_engine, "abc", SamplingParams(max_tokens=3)), timeout=PATIENCE_S)

    with pytest.raises(RuntimeError, match="shut down"):
        asyncio.run(main())


def test_requests_sent_while_a_step_runs_join_one_prefill(async_engine, monkeypatch):
    """Adding never waits for the engine lock: a burst sent during a long step is admitted
    together at the next step, not trickled in over several prefills."""
    prefills = []
    step = async_engine.engine.step

    def recording_step():
        waiting = len(async_engine.engine.scheduler.waiting)
        if waiting:
            prefills.append(waiting)
        return step()

    monkeypatch.setattr(async_engine.engine, "step", recording_step)

    async def main():
        async_engine.lock.acquire()                 # a long step is running
        streams = [asyncio.ensure_future(collect(async_engine, f"burst {i}", SamplingParams(max_tokens=3)))
                   for i in range(8)]
        for _ in range(PATIENCE_S * 100):
            if len(async_engine.inbox) == 8:
                break
            await asyncio.sleep(0.01)
        assert len(async_engine.inbox) == 8, "adds waited for the step"
        async_engine.lock.release()
        return await asyncio.wait_for(asyncio.gather(*streams), PATIENCE_S)

    results = asyncio.run(main())
    assert [len(outputs[-1].output_token_ids) for outputs in results] == [3] * 8
    assert prefills[0] == 8


def test_the_engine_is_built_and_called_on_the_step_thread():
    threads = []

    def build():
        threads.append(threading.current_thread())
        return LLM(checkpoint=tiny_checkpoint(), **TINY_ENGINE).engine

    async_engine = AsyncEngine(build)
    try:
        assert threads == [async_engine.thread]
        assert async_engine.call(lambda engine: (threading.current_thread(), engine)) == \
            (async_engine.thread, async_engine.engine)
        with pytest.raises(ZeroDivisionError):
            async_engine.call(lambda engine: 1 / 0)
        assert async_engine.call(lambda engine: engine.has_unfinished()) is False    # still serving
    finally:
        async_engine.shutdown()
    with pytest.raises(RuntimeError, match="shut down"):
        async_engine.call(lambda engine: None)


def test_a_failed_build_raises_in_the_caller():
    def build():
        raise InputError("no such model")

    with pytest.raises(InputError, match="no such model"):
        AsyncEngine(build)


def test_a_fault_no_request_can_be_blamed_for_kills_the_engine(async_engine, monkeypatch):
    """The model raising for every request of a step: every stream ends with EngineDead, new requests are
    refused at once, and the on_dead callbacks hear why."""
    reasons, told = [], threading.Event()
    async_engine.on_dead.append(lambda reason: (reasons.append(reason), told.set()))

    def broken(*args, **kwargs):
        raise RuntimeError("the model is broken")

    async def main():
        async_engine.lock.acquire()                 # both requests join the same step
        streams = [asyncio.ensure_future(collect(async_engine, prompt, long_request())) for prompt in ("a", "b")]
        for _ in range(PATIENCE_S * 100):
            if len(async_engine.inbox) == 2:
                break
            await asyncio.sleep(0.01)
        async_engine.lock.release()
        return await asyncio.wait_for(asyncio.gather(*streams, return_exceptions=True), PATIENCE_S)

    monkeypatch.setattr(async_engine.engine.runner, "execute", broken)
    results = asyncio.run(main())
    assert all(isinstance(result, EngineDead) and "the model is broken" in str(result) for result in results)
    assert told.wait(PATIENCE_S)        # the callbacks run on the step thread after the streams have ended
    assert len(reasons) == 1 and "every request of the step failed" in reasons[0]
    with pytest.raises(EngineDead):
        asyncio.run(collect(async_engine, "abc", SamplingParams(max_tokens=3)))
    with pytest.raises(EngineDead):
        async_engine.call(lambda engine: None)


def test_a_step_that_never_returns_is_found_by_the_watchdog(async_engine, monkeypatch):
    """check_progress on a fake clock: a step running past the watchdog's limit kills the engine and
    ends the stream waiting on it, though the step thread (holding the engine lock) never comes back."""
    release = threading.Event()
    step = async_engine.engine.step
    monkeypatch.setattr(async_engine.engine, "step", lambda: (release.wait(), step())[1])

    async def main():
        stream = asyncio.ensure_future(collect(async_engine, "abc", long_request()))
        for _ in range(PATIENCE_S * 100):
            if async_engine.busy_since is not None:
                break
            await asyncio.sleep(0.01)
        started = async_engine.busy_since
        async_engine.check_progress(5.0, now=started + 4.9)
        assert async_engine.dead is None
        async_engine.check_progress(5.0, now=started + 5.1)
        return await asyncio.wait_for(asyncio.gather(stream, return_exceptions=True), PATIENCE_S)

    try:
        [result] = asyncio.run(main())
        assert isinstance(result, EngineDead) and "watchdog" in str(result)
    finally:
        release.set()
    async_engine.thread.join(PATIENCE_S)
    assert not async_engine.thread.is_alive()            # a dead engine steps no more


def test_a_steps_outputs_wake_the_event_loop_once(async_engine, monkeypatch):
    """Four streams decoding together: every step's outputs arrive in one callback on the caller's loop."""
    steps, step = [], async_engine.engine.step
    monkeypatch.setattr(async_engine.engine, "step", lambda: (steps.append(1), step())[1])

    async def main():
        loop, wakeups, post = asyncio.get_running_loop(), [], asyncio.get_running_loop().call_soon_threadsafe
        loop.call_soon_threadsafe = lambda *args: (wakeups.append(1), post(*args))[1]
        outputs = await asyncio.gather(*(collect(async_engine, f"prompt {i}", long_request()) for i in range(4)))
        return outputs, len(wakeups)

    outputs, wakeups = asyncio.run(main())
    assert all(output[-1].finished for output in outputs)
    assert sum(len(output) for output in outputs) > len(steps)     # several outputs a step ...
    assert wakeups <= len(steps) + 4               # ... one wake-up a step (and one per prompt prepared in a thread)
