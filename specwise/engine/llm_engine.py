"""The engine seam: add_request / step / abort / has_unfinished.

    engine = LLMEngine(EngineConfig())
    request_id = engine.add_request("Hello", SamplingParams(temperature=0))
    while engine.has_unfinished():
        for output in engine.step(): ...
"""

import logging
import random
import time
import uuid
from dataclasses import dataclass

import torch


from specwise.config import DECODE_STEP_TOKENS, EngineConfig
from specwise.engine.block_manager import BlockManager
from specwise.engine.fault_isolation import FailedSteps, describe, isolate
from specwise.engine.model_runner import ModelRunner, kv_block_bytes
from specwise.engine.output_processor import OutputProcessor
from specwise.engine.outputs import RequestOutput, TokenLogprob
from specwise.engine.sampling.grammar import GrammarCompiler
from specwise.engine.sampling.logits_processors import LogitsProcessing
from specwise.engine.scheduler import ScheduledBatch, Scheduler, draft_room
from specwise.engine.sequence import Sequence
from specwise.engine.spec_decode.config import SpeculativeConfig
from specwise.engine.spec_decode.context import ProposerContext
from specwise.engine.spec_decode.factory import build_policy, build_proposer
from specwise.engine.spec_decode.grammar_drafts import fit_to_grammars
from specwise.engine.spec_decode.metrics import SpecStats
from specwise.engine.step_log import StepLog
from specwise.engine.target_model import build_target
from specwise.errors import InputError
from specwise.models.capabilities import cpu_capabilities, describe_kernels, linear_path
from specwise.models.checkpoints.loader import Checkpoint
from specwise.models.compile.graphs import CompiledForward, GraphSet
from specwise.models.llama import LlamaForCausalLM
from specwise.models.quantize import pack_weights
from specwise.sampling_params import SamplingParams

Prompt = str | list[int] | list[dict]

log = logging.getLogger("specwise.engine")


@dataclass
class Computed:
    """One sequence's share of a step, computed but not yet applied to it."""

    tokens: list[int]                       # emitted (none for a prompt chunk short of the prompt's end)
    num_drafted: int                        # drafted tokens verified (Proposal.num_drafted)
    num_rows: int                           # draft rows fed (Proposal.num_rows: a chain's drafts, a tree's rows)
    logprobs: list[TokenLogprob] | None     # of the emitted tokens, when the request asked


class LLMEngine:
    def __init__(self, config: EngineConfig, checkpoint: Checkpoint | None = None):
        self.config = config
        if config.num_threads is not None:
            torch.set_num_threads(config.num_threads)     # process-wide, as torch has it
        self.num_threads = torch.get_num_threads()
        # compile True: every graph compiled (or loaded) now; None: the graphs if the compile cache holds them,
        # else eager, with `pending_compile` naming the graphs for whoever compiles them elsewhere (serve); False: eager
        target = build_target(config, checkpoint, for_compile=config.compile is not False)
        self.dtype, self.max_model_len, self.model = target.dtype, target.max_model_len, target.model
        self.tokenizer = target.checkpoint.tokenizer
        self.model_config = target.checkpoint.config
        graph_set = None if config.compile is False else GraphSet.of(self.model, self.dtype)
        self.compiled = config.compile is True or (graph_set is not None and graph_set.cached())
        self.pending_compile: GraphSet | None = None
        self.thread_cap: int | None = None       # the most torch threads a step may use (None: no cap)
        if config.compile is None and not self.compiled:
            pack_weights(self.model, self.dtype, config.quantization, config.device)    # eager's fastest linears
            self.pending_compile = graph_set
        self._describe()
        num_blocks = config.num_kv_blocks or kv_cache_blocks(config, self.model, self.dtype, self.max_model_len)
        self.block_manager = BlockManager(num_blocks, config.block_size)
        self.scheduler = Scheduler(self.block_manager, config.max_num_seqs, config.max_num_batched_tokens)
        self.runner = ModelRunner(self.model, num_blocks, config.block_size, self.dtype, config.device,
                                  self.compiled, graph_set)
        self.grammars = GrammarCompiler(self.tokenizer, self.model_config.vocab_size)
        self.runner.processing = LogitsProcessing(self.tokenizer.eos_token_ids, self.grammars)
        # a sequence that fills the whole KV cache ends with "length" (it could never be scheduled again)
        self.outputs = OutputProcessor(self.tokenizer, min(self.max_model_len, num_blocks * config.block_size))
        self.scheduler.release_hooks += [self.runner.release, self._on_release]
        self.requests: dict[str, Sequence] = {}
        self.aborted: list[RequestOutput] = []
        self.rng = random.Random(config.seed)
        self.stats = SpecStats()
        self.failed_steps = FailedSteps()
        self.step_log = StepLog(config.step_log)     # the last steps in memory (GET /steps), a file where asked
        self.proposer = None
        self.set_speculative(config.speculative, config.num_speculative_tokens)

    def _describe(self) -> None:
        """What runs, for start-up lines and run.json: "bf16, linears: bf16 oneDNN packed (CPU AVX512, x86_64), eager"
        (the switch to compiled graphs says it again)."""
        config = self.config
        self.kernel_line = describe_kernels(self.dtype, config.quantization, config.device, self.compiled) + \
            (", compiled" if self.compiled else ", eager")
        self.kernels = {"dtype": str(self.dtype).removeprefix("torch."), "compiled": self.compiled,
                        "linears": linear_path(self.dtype, config.quantization, config.device, self.compiled),
                        "cpu": cpu_capabilities().to_dict()}

    def use_compiled(self, forward: CompiledForward) -> None:
        """Step through forward from the next step on (graphs loaded from the cache; run here once first, over a
        scratch cache). Between steps only, on the thread that steps. What a graph raises is raised, eager kept."""
        self.runner.use_forward(forward)
        self.compiled, self.pending_compile, self.thread_cap = True, None, None
        self._describe()

    def set_speculative(self, speculative: str | None, num_speculative_tokens: int) -> None:
        """Switch drafting method between requests (the evaluator runs every arm on one load)."""
        if self.scheduler.has_unfinished():
            raise RuntimeError("change speculation only while no request is in flight")
        self.runner.feature_observers = []          # the previous drafter's, if it read features
        self.runner.feature_layers = []
        context = ProposerContext(self.runner, self.tokenizer, self.dtype, self.config.device, self.max_model_len)
        spec_config = SpeculativeConfig.parse(speculative, num_speculative_tokens)
        self.proposer = build_proposer(spec_config, context)
        self.config.speculative, self.config.num_speculative_tokens = speculative, num_speculative_tokens
        # the most rows a sequence feeds after its last token: k, or a draft tree's rows (lookahead)
        self.num_speculative_tokens = spec_config.step_rows if self.proposer else 0
        self.policy = build_policy(self.config, self.num_speculative_tokens, self.runner, self.max_model_len,
                                   self.proposer)
        self.step_k = self.num_speculative_tokens     # the policy's choice for the current step

    def add_request(self, prompt: Prompt, params: SamplingParams | None = None,
                    request_id: str | None = None) -> str:
        return self.add_prepared(self.prepare(prompt), params, request_id)

    def add_prepared(self, token_ids: list[int], params: SamplingParams | None = None,
                     request_id: str | None = None, tenant: str | None = None) -> str:
        """Add a prompt that `prepare` has already tokenized and checked. `tenant` keeps drafters
        that learn across requests (suffix's global cache) from drafting one tenant's text for
        another; None is the one default tenant."""
        params = params or SamplingParams()
        request_id = request_id or uuid.uuid4().hex
        if request_id in self.requests:
            raise InputError(f"request id {request_id!r} is already in flight")
        self.check_params(params)
        seq = Sequence(request_id, token_ids, params, seed=self.rng.getrandbits(63), tenant=tenant)
        self.runner.processing.add(seq)
        self.requests[request_id] = seq
        self.outputs.add(seq)
        self.scheduler.add(seq)
        return request_id

    def prepare(self, prompt: Prompt) -> list[int]:
        """The prompt's token ids, checked to fit; reads no state a step changes (any thread)."""
        token_ids = self.encode(prompt)
        self._check_prompt_fits(token_ids)
        return token_ids

    def encode(self, prompt: Prompt) -> list[int]:
        if not prompt:
            raise InputError("the prompt is empty")
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt)
        if prompt and all(isinstance(item, dict) for item in prompt):
            return self.tokenizer.apply_chat_template(prompt)
        if prompt and all(isinstance(item, int) for item in prompt):
            if max(prompt) >= self.model_config.vocab_size or min(prompt) < 0:
                raise InputError(f"token id out of range [0, {self.model_config.vocab_size})")
            return list(prompt)
        raise InputError("a prompt is a non-empty string, list of token ids, or list of chat messages")

    def check_params(self, params: SamplingParams) -> None:
        """InputError for settings this model cannot honour; compiles (and caches) the grammar (any thread)."""
        vocab_size = self.model_config.vocab_size
        bad = [t for t in [*params.logit_bias, *params.stop_token_ids] if not 0 <= t < vocab_size]
        if bad:
            raise InputError(f"token id {bad[0]} is outside the vocabulary [0, {vocab_size})")
        if params.structured_output is not None:
            self.grammars.check(params.structured_output)

    def _check_prompt_fits(self, token_ids: list[int]) -> None:
        if not token_ids:
            raise InputError("the prompt is empty")
        if len(token_ids) >= self.max_model_len:
            raise InputError(f"the prompt has {len(token_ids)} tokens; the context window is "
                             f"{self.max_model_len} (prompt + at least one output token)")
        if self.block_manager.blocks_for(len(token_ids) + 1) > self.block_manager.num_blocks:
            raise InputError(f"the prompt ({len(token_ids)} tokens) does not fit in the KV cache")

    def abort(self, request_id: str) -> None:
        seq = self.requests.get(request_id)
        if seq is None or seq.is_finished:
            return
        self.scheduler.finish(seq, "abort")
        self.aborted.append(self._output(seq, [], "", "abort"))

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished() or bool(self.aborted)

    def step(self) -> list[RequestOutput]:
        outputs, self.aborted = self.aborted, []
        self.step_k = self._choose_k()
        batch = self.scheduler.schedule(self._draft_budget)
        if batch is None:
            return outputs
        self._set_threads(batch.num_tokens)
        started = time.perf_counter()
        computed, faults = isolate(batch, self._compute)         # nothing committed yet (fault_isolation.py)
        self.step_log.write(batch, [computed[i].num_rows if i in computed else 0 for i in range(len(batch.seqs))],
                            started)
        self.failed_steps.check(len(batch.seqs), faults)
        return outputs + self._commit(batch, computed, faults)

    def _compute(self, batch: ScheduledBatch) -> list[Computed]:
        """Drafts, the forward and verification of one batch; changes nothing a retry of it would see."""
        saved = self.runner.rng_states(batch.seqs)
        try:
            proposal = self._propose(batch)
            started = time.perf_counter()
            emitted = self.runner.execute(batch, proposal)
        except Exception:
            self.runner.restore_rng(batch.seqs, saved)
            raise
        if proposal is not None:
            self.stats.verifying_seconds += time.perf_counter() - started
        return [Computed(tokens, 0 if proposal is None else proposal.num_drafted(index),
                         0 if proposal is None else proposal.num_rows(index),
                         self.runner.step_logprobs.pop(seq.seq_id, None))
                for index, (seq, tokens) in enumerate(zip(batch.seqs, emitted))]

    def _commit(self, batch: ScheduledBatch, computed: dict[int, Computed],
                faults: dict[int, Exception]) -> list[RequestOutput]:
        """Apply each sequence's computed share; a fault while applying it fails that request alone."""
        outputs = []
        for index, seq in enumerate(batch.seqs):
            try:
                output = (self._fail(seq, faults[index]) if index in faults else
                          self._advance(seq, computed[index], batch.num_new_tokens[index]))
            except Exception as error:
                output = self._fail(seq, error)
            if output is not None:
                outputs.append(output)
        return outputs

    def _fail(self, seq: Sequence, error: Exception) -> RequestOutput:
        reason = describe(error)
        log.error("request %s failed in the engine step: %s", seq.request_id, reason, exc_info=error)
        if not seq.is_finished:
            self.scheduler.finish(seq, "error")
        return self._output(seq, [], "", "error", error=reason)

    def _set_threads(self, num_tokens: int) -> None:
        """decode_threads for a step of at most DECODE_STEP_TOKENS tokens, num_threads for a larger one; at most
        thread_cap (while another process compiles the graphs on this machine, background_compile.py)."""
        threads = self.num_threads
        if self.config.decode_threads is not None and num_tokens <= DECODE_STEP_TOKENS:
            threads = self.config.decode_threads
        if self.thread_cap is not None:
            threads = min(threads, self.thread_cap)
        if threads != torch.get_num_threads():
            torch.set_num_threads(threads)

    def _draft_budget(self, seq: Sequence) -> int:
        if self.proposer is None:
            return 0
        return draft_room(seq, self.step_k, self.max_model_len, getattr(self.proposer, "budget_counts_rows", False))

    def _choose_k(self) -> int:
        running = self.scheduler.running
        if self.proposer is None or not running:
            return self.num_speculative_tokens
        context_len = sum(len(seq) for seq in running) // len(running)
        return self.policy.choose_k(len(running), context_len)

    def _propose(self, batch: ScheduledBatch):
        if self.proposer is None or not any(batch.num_draft_tokens):
            return None
        started = time.perf_counter()
        proposal = fit_to_grammars(self.proposer.propose(batch.seqs, batch.num_draft_tokens), batch.seqs,
                                   batch.num_draft_tokens, self.runner.processing)
        seconds = time.perf_counter() - started
        self.stats.drafting_seconds += seconds
        num_drafting = sum(1 for k in batch.num_draft_tokens if k)
        self.policy.observe_drafting(seconds, num_drafting, max(batch.num_draft_tokens))
        return proposal

    def _advance(self, seq: Sequence, computed: Computed, num_new_tokens: int) -> RequestOutput | None:
        emitted = computed.tokens
        self.scheduler.step_done(seq, num_new_tokens, len(emitted))
        if not emitted:                                  # a prompt chunk short of the prompt's end
            return None
        if computed.num_drafted:
            seq.spec.record(computed.num_drafted, len(emitted) - 1)
            self.stats.record(computed.num_drafted, len(emitted) - 1)
            self.policy.observe(computed.num_drafted, len(emitted) - 1)
        result = self.outputs.append(seq, emitted)
        self.runner.processing.accept(seq, result.new_token_ids)
        logprobs = computed.logprobs
        prompt_logprobs = self.runner.prompt_logprobs.pop(seq.seq_id, None)     # the first output only
        if result.finish_reason:
            self.scheduler.finish(seq, result.finish_reason)
        else:
            self.scheduler.return_lookahead(seq)
        return self._output(seq, result.new_token_ids, result.new_text, result.finish_reason,
                            None if logprobs is None else logprobs[:len(result.new_token_ids)], prompt_logprobs)

    def _output(self, seq: Sequence, new_token_ids, new_text, finish_reason, logprobs=None,
                prompt_logprobs=None, error: str | None = None) -> RequestOutput:
        text = self.outputs.text(seq)
        if seq.is_finished:
            self.requests.pop(seq.request_id, None)
            self.outputs.remove(seq)
        return RequestOutput(seq.request_id, seq.prompt_token_ids, seq.output_token_ids, new_token_ids, text,
                             new_text, finished=seq.is_finished, finish_reason=finish_reason, spec=seq.spec.copy(),
                             new_logprobs=logprobs, prompt_logprobs=prompt_logprobs, error=error)

    def _on_release(self, seq: Sequence) -> None:
        if self.proposer is not None:
            self.proposer.free(seq)


def kv_cache_blocks(config: EngineConfig, model: LlamaForCausalLM, dtype: torch.dtype, max_model_len: int) -> int:
    """The KV cache's blocks for `--kv-cache-gb`, but no more than max_num_seqs sequences of max_model_len tokens
    can hold at once (no prefix cache keeps blocks past their sequence). Worked example: a 2-layer test model in
    fp32 keeps a token in 512 bytes, so a GiB is 2M tokens; 64 sequences of 2048 use 131k of them (64 MiB), and
    zeroing the GiB cost 6-7 s on a VM whose fresh pages are slow to touch."""
    budget = int(config.kv_cache_gb * 2**30 // kv_block_bytes(model, config.block_size, dtype))
    return min(budget, config.max_num_seqs * -(-max_model_len // config.block_size))
