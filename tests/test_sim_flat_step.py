"""The simulator's step is the engine's: for the same hand-written state (tests/scheduler_states.py)
the flat simulator's step and a real engine step (tiny model, no preemption hidden) schedule the
same rows, the same prompt tokens and preempt the same sequences."""

import pytest

from scheduler_states import STATES, place
from tiny_models import tiny_checkpoint

from specwise.calc.arms import OFF, parse_arm
from specwise.calc.deployment import Deployment, DeploymentConfig
from specwise.calc.drafter import ExtraRowsCost
from specwise.calc.roofline import RooflineCost
from specwise.engine.block_manager import BlockManager
from specwise.engine.scheduler import Scheduler
from specwise.sim.flat import schedule_step

MAX_MODEL_LEN = 96
DEPLOYMENT = Deployment.from_config(DeploymentConfig(model="smollm2-135m", gpu="l4"))
# (engine --speculative, its k; the simulator's arm for the same method)
METHODS = [(None, 4, "off"), ("ngram", 4, "ngram:k=4,alpha=0.5"),
           ("lookahead:1,3,2", 4, "lookahead:w=1,n=3,g=2,k=4,alpha=0.5")]


def shape(batch, preempted) -> dict:
    """Name -> (prompt/decode tokens, draft rows), and the names preempted."""
    rows = {} if batch is None else {seq.request_id: (new, drafts) for seq, new, drafts in
                                     zip(batch.seqs, batch.num_new_tokens, batch.num_draft_tokens)}
    return {"rows": rows, "preempted": sorted(seq.request_id for seq in preempted)}


def engine_step(state, speculative, k) -> dict:
    from specwise.engine.llm import LLM
    engine = LLM(checkpoint=tiny_checkpoint(), dtype="float32", num_kv_blocks=state.num_blocks,
                 block_size=state.block_size, max_model_len=MAX_MODEL_LEN, max_num_seqs=state.max_num_seqs,
                 max_num_batched_tokens=state.max_num_batched_tokens, speculative=speculative,
                 num_speculative_tokens=k).engine
    seqs = place(state, engine.scheduler, add=lambda ids, params, name: engine.requests[
        engine.add_prepared(ids, params, request_id=name)])
    seen = []
    schedule = engine.scheduler.schedule

    def recording(draft_budget):
        waiting = {id(seq) for seq in engine.scheduler.waiting}
        batch = schedule(draft_budget)
        seen.append(shape(batch, [s for s in engine.scheduler.waiting if id(s) not in waiting]))
        return batch

    engine.scheduler.schedule = recording
    engine.step()                                        # the real step: drafting, forward, verification
    for name in list(engine.requests):
        engine.abort(name)
    assert seqs
    return seen[0]


def simulated_step(state, arm_text) -> dict:
    cost = RooflineCost(DEPLOYMENT)
    arm = OFF if arm_text == "off" else parse_arm(arm_text, cost, DEPLOYMENT)
    scheduler = Scheduler(BlockManager(state.num_blocks, state.block_size), state.max_num_seqs,
                          state.max_num_batched_tokens)
    place(state, scheduler)
    k = arm.k_for(len(scheduler.running)) if arm.speculative else 0
    tree_rows = arm.draft.rows if isinstance(arm.draft, ExtraRowsCost) else 0
    return shape(*schedule_step(scheduler, k, tree_rows, MAX_MODEL_LEN))


@pytest.mark.parametrize("method", METHODS, ids=lambda m: m[2].partition(":")[0])
@pytest.mark.parametrize("state", STATES, ids=lambda s: s.name)
def test_simulated_step_equals_the_engine_step(state, method):
    speculative, k, arm = method
    assert simulated_step(state, arm) == engine_step(state, speculative, k)


def test_the_states_show_what_they_are_named_for():
    """The fixtures exercise drafts, chunking and preemption (else the equality above proves little)."""
    drafts, long_prompt, kv_full = (simulated_step(state, "ngram:k=4,alpha=0.5") for state in STATES)
    assert drafts["rows"] == {"a": (1, 4), "b": (1, 4), "c": (1, 2)} and not drafts["preempted"]
    assert long_prompt["rows"] == {"a": (1, 4), "b": (1, 4), "p": (22, 0)}      # 32 - 2 x (1 + 4)
    assert kv_full["rows"] == {"a": (1, 4), "b": (1, 0)} and kv_full["preempted"] == ["c"]
    lookahead = simulated_step(STATES[0], "lookahead:w=1,n=3,g=2,k=4,alpha=0.5")
    assert lookahead["rows"] == {"a": (1, 8), "b": (1, 8), "c": (1, 8)}       # (1 + 2)(3 - 1) + (4 - 2) rows
