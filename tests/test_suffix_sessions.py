"""The agentic suite category and multi-turn session replay (bench/load/sessions.py).

  - the agentic category loads: every session's turns are numbered 0.., each line's
    conversation extends the previous turn's, and the seeded order keeps turns in order;
  - replayed through a closed loop at concurrency 1 and 3, each turn is sent only after its
    previous turn finished on the same arm, carrying the answer that arm produced in place of
    the reference answer; arms and load points keep separate sessions.
"""

import asyncio

from specwise.bench.inputs.suite import CATEGORIES, load_suite
from specwise.bench.load.arrivals import closed_loop, take
from specwise.bench.load.order import seeded_order
from specwise.bench.load.sessions import Sessions
from specwise.bench.load.targets.base import TokenChunk


def agentic():
    return load_suite(["agentic"])


def test_the_agentic_category_is_multi_turn():
    assert "agentic" in CATEGORIES
    requests = agentic()
    sessions = {}
    for request in requests:
        sessions.setdefault(request.extra["session"], []).append(request)
    assert len(sessions) >= 6
    for turns in sessions.values():
        assert [r.extra["turn"] for r in turns] == list(range(len(turns))) and len(turns) >= 3
        for previous, current in zip(turns, turns[1:]):
            assert current.messages[:len(previous.messages)] == previous.messages
            assert current.messages[len(previous.messages)]["role"] == "assistant"


def test_the_seeded_order_keeps_turns_in_order():
    for seed in range(5):
        seen = {}
        for request in seeded_order(load_suite(), seed):
            if "session" in request.extra:
                session = request.extra["session"]
                assert request.extra["turn"] == seen.get(session, -1) + 1
                seen[session] = request.extra["turn"]


class EchoTarget:
    """Answers "<arm> answer to: <last user message>", word by word, and logs what it was sent and when."""

    def __init__(self, name):
        self.name, self.method = name, "off"
        self.log = []            # (event, request_id, messages)

    async def stream(self, request):
        self.log.append(("start", request.request_id, request.messages))
        for word in f"{self.name} answer to: {request.messages[-1]['content'][:20]}".split():
            await asyncio.sleep(0.001)
            yield TokenChunk(0.0, word + " ")
        self.log.append(("end", request.request_id, None))


async def replay(sessions, target, point, requests, concurrency):
    async def send(request):
        request = await sessions.prepare(target.name, point, request)
        answer = sessions.recorder(target)
        async for _ in answer.stream(request):
            pass
        sessions.finish(target.name, point, request, answer.text)
    await closed_loop(requests, concurrency, send)


def check_replay(target, requests):
    by_id = {r.request_id: r for r in requests}
    started = {rid: index for index, (event, rid, _) in enumerate(target.log) if event == "start"}
    ended = {rid: index for index, (event, rid, _) in enumerate(target.log) if event == "end"}
    sent = {rid: messages for event, rid, messages in target.log if event == "start"}
    answers = {}
    for request in requests:
        session, turn = request.extra["session"], request.extra["turn"]
        if turn:
            previous = next(r for r in requests if r.extra["session"] == session and r.extra["turn"] == turn - 1)
            assert started[request.request_id] > ended[previous.request_id]
            carried = sent[request.request_id][len(sent[previous.request_id])]
            assert carried == {"role": "assistant", "content": answers[previous.request_id]}
            assert sent[request.request_id][-1] == by_id[request.request_id].messages[-1]
        answers[request.request_id] = f"{target.name} answer to: {sent[request.request_id][-1]['content'][:20]}"
        answers[request.request_id] = " ".join(answers[request.request_id].split()) + " "


def test_replay_carries_each_answer_into_the_next_turn():
    requests = seeded_order(agentic(), 0)
    sessions = Sessions()
    for concurrency, arm in ((1, "off"), (3, "suffix")):
        target = EchoTarget(arm)
        asyncio.run(replay(sessions, target, ("concurrency", concurrency), requests, concurrency))
        check_replay(target, requests)


def test_repeats_are_sessions_of_their_own():
    requests = take(seeded_order(agentic(), 1), 2 * len(agentic()))
    target = EchoTarget("off")
    asyncio.run(replay(Sessions(), target, ("concurrency", 2), requests, 2))
    assert len([event for event in target.log if event[0] == "end"]) == len(requests)
