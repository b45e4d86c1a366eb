"""`specwise train-drafter` on tiny random models: the trained graphs match what the engine runs,
a few steps lower the loss and write a loadable drafter, resume is bit-identical, bad input is
one line."""

import json
import shutil

import pytest
import torch

from specwise.cli import main
from specwise.config import EngineConfig
from specwise.engine.llm_engine import LLMEngine
from specwise.errors import ConfigError, InputError
from specwise.models.attention import AttentionMetadata, CachedGroup, PrefillChunk, step_metadata
from specwise.models.checkpoints.loader import build_model
from specwise.models.checkpoints.drafter import load_drafter
from specwise.models.heads.eagle import EagleHead
from specwise.models.heads.eagle3 import default_aux_layers
from specwise.sampling_params import SamplingParams
from specwise.train.acceptance import held_out_acceptance
from specwise.train.batch import make_batch
from specwise.train.config import TrainConfig
from specwise.train.corpus import read_corpus_texts
from specwise.train.data import Corpus, record_features
from specwise.train.draft import DraftObjective, spread_layers
from specwise.train.eagle import EagleObjective, active_vocabulary
from specwise.train.eagle3 import Eagle3Objective
from specwise.train.loop import CHECKPOINT_FILE, Schedule, train
from specwise.train.prompts import CATEGORIES, DATA_DIR, load_prompts, split_held_out
from specwise.train.run import WORK_DIR, build_objective, prepare, run
from tiny_models import tiny_checkpoint

PROMPTS = [{"prompt": f"Item {i}: the {word} costs {i * 7} coins.", "category": ["shop", "talk"][i % 2],
            "max_tokens": 20} for i, word in enumerate("apple pear fig plum kiwi lime date nut bean corn rice oat".split())]


@pytest.fixture(scope="module")
def target():
    return tiny_checkpoint()


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "prompts.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in PROMPTS))
    return path


@pytest.fixture(scope="module")
def cached_work(tmp_path_factory, data_file, target):
    """Responses and features generated once; each test copies them into its own --out."""
    out = tmp_path_factory.mktemp("cached")
    prepare(settings(out, data_file), target)
    return out / WORK_DIR


def settings(out, data_file, **overrides) -> TrainConfig:
    values = dict(kind="eagle", out=str(out), data=str(data_file), dtype="float32", max_tokens=20, epochs=2,
                  batch_tokens=160, held_out=0.25, warmup_steps=2, checkpoint_every=2, lr=3e-3, unroll=1,
                  feature_noise=0.0)
    return TrainConfig(**{**values, **overrides})


def out_dir(tmp_path, cached_work):
    shutil.copytree(cached_work, tmp_path / "out" / WORK_DIR)
    return tmp_path / "out"


def one_sequence_corpus(engine: LLMEngine, prompt: list[int], max_tokens: int = 24) -> tuple[Corpus, list[int]]:
    engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=max_tokens), request_id="seq")
    while engine.has_unfinished():
        for output in engine.step():
            pass
    sequence = output.prompt_token_ids + output.output_token_ids
    corpus = record_features(engine.model, torch.float32, [sequence], [len(prompt)], [True], [0], ["only"])
    return corpus, sequence


@pytest.fixture(scope="module")
def engine(target):
    return LLMEngine(EngineConfig(dtype="float32", num_kv_blocks=128, block_size=4, max_model_len=96), target)


@pytest.fixture(scope="module")
def trained_target(engine, target):
    """The target as build_objective gives it to an objective: an fp32 copy with plain nn.Linear layers."""
    return build_model(target, torch.float32, "cpu", engine.max_model_len, plain=True)


def test_unrolled_eagle_chain_matches_the_paged_head(engine, trained_target):
    """The training graph's step-j feature equals the engine-style paged head fed its own predictions."""
    corpus, sequence = one_sequence_corpus(engine, [256, 72, 105, 33, 32])
    torch.manual_seed(0)
    objective = EagleObjective(trained_target, {}, torch.arange(258), init_from_target=True)
    head = objective.module.eval()
    batch = make_batch(corpus, [0])
    start = 8                                              # chain t = 8: true pairs 0..8, then predicted ones
    first = 6                                              # steps >= 2 run chains 6.. only
    unrolled = [predicted[0, start - (first if step > 1 else 0)].detach() for step, _, predicted in
                objective.steps(batch, 3, lambda step, first, count: batch.shifted("target_next", first + step - 1,
                                                                                   count), first_chain=first)]
    cache = torch.zeros(1, 2, 2, 64, 16)                   # one layer's keys and values
    features, tokens = batch.features[0], batch.token_ids[0]
    embed = engine.model.embed_tokens.weight
    with torch.no_grad():
        rows = torch.arange(start + 1)
        with step_metadata(AttentionMetadata(rows, [PrefillChunk(0, start + 1)], [])):
            predicted = head(features[rows], embed[tokens[rows + 1]], rows, cache)[-1]
        assert torch.allclose(predicted, unrolled[0], atol=1e-5)
        for step in (2, 3):
            position = start + step - 1
            token = batch.target_next[0, position]
            visible = torch.zeros(1, 1, 64).masked_fill(torch.arange(64) > position, float("-inf"))
            metadata = AttentionMetadata(torch.tensor([position]), [], [   # the cache is one block of 64 slots
                CachedGroup(torch.tensor([0]), torch.tensor([[0]]), visible, 1, 64)])
            with step_metadata(metadata):
                predicted = head(predicted[None], embed[token][None], torch.tensor([position]), cache)[0]
            assert torch.allclose(predicted, unrolled[step - 1], atol=1e-5), step


def test_unrolled_eagle3_chain_matches_the_paged_head(engine, trained_target):
    """EAGLE-3's training graph, step by step, equals the paged head fed its own un-normed outputs."""
    prompt = [256, 72, 105, 33, 32]
    engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=24), request_id="seq3")
    while engine.has_unfinished():
        for output in engine.step():
            pass
    sequence = output.prompt_token_ids + output.output_token_ids
    layers = default_aux_layers(engine.model.config.num_hidden_layers)
    corpus = record_features(engine.model, torch.float32, [sequence], [len(prompt)], [True], [0], ["only"], layers)
    torch.manual_seed(0)
    objective = Eagle3Objective(trained_target, {}, torch.arange(258), layers)
    head = objective.module.eval()
    for param in head.parameters():                        # a random head: every tensor matters
        torch.nn.init.normal_(param, mean=1.0 if param.dim() == 1 else 0.0, std=0.1)
    batch = make_batch(corpus, [0])
    start, first = 8, 6
    unrolled = [normed[0, start - (first if step > 1 else 0)].detach() for step, _, normed in
                objective.steps(batch, 3, lambda step, first, count: batch.shifted("target_next", first + step - 1,
                                                                                   count), first_chain=first)]
    cache = torch.zeros(1, 2, 2, 64, 16)
    aux, tokens = batch.aux[0], batch.token_ids[0]
    embed = engine.model.embed_tokens.weight
    with torch.no_grad():
        rows = torch.arange(start + 1)
        with step_metadata(AttentionMetadata(rows, [PrefillChunk(0, start + 1)], [])):
            normed, fed = head.step(head.fuse(aux[rows]), embed[tokens[rows + 1]], rows, cache)
        assert torch.allclose(normed[-1], unrolled[0], atol=1e-5)
        fed = fed[-1:]
        for step in (2, 3):
            position = start + step - 1
            token = batch.target_next[0, position]
            visible = torch.zeros(1, 1, 64).masked_fill(torch.arange(64) > position, float("-inf"))
            metadata = AttentionMetadata(torch.tensor([position]), [], [
                CachedGroup(torch.tensor([0]), torch.tensor([[0]]), visible, 1, 64)])
            with step_metadata(metadata):
                normed, fed = head.step(fed, embed[token][None], torch.tensor([position]), cache)
            assert torch.allclose(normed[0], unrolled[step - 1], atol=1e-5), step


def test_draft_chains_of_the_target_itself_are_its_greedy_continuation(engine, trained_target):
    corpus, sequence = one_sequence_corpus(engine, [256, 72, 101, 108, 108, 111])
    objective = DraftObjective(trained_target, engine.tokenizer, torch.arange(258), num_layers=2)
    assert objective.kept_layers == [0, 1]
    drafts = objective.chain_drafts(make_batch(corpus, [0], with_features=False), 4, first_chain=3)
    target_next = corpus.target_next.tolist()
    for t in range(5, len(sequence) - 5):
        assert drafts[t - 3].tolist() == target_next[t + 1:t + 5], t
    stats = held_out_acceptance(objective, corpus, [0], k=4)
    assert stats["all"].acceptance_rate == 1.0


def test_spread_layers_keeps_the_first_and_last():
    assert spread_layers(30, 4) == [0, 10, 19, 29]
    assert spread_layers(30, 1) == [29]


def test_held_out_split_covers_every_category():
    requests = load_prompts("suite")
    held_out = split_held_out(requests, 0.1, seed=0)
    assert {r.category for r in requests} == set(CATEGORIES)
    assert {r.category for r, held in zip(requests, held_out) if held} == set(CATEGORIES)
    assert held_out == split_held_out(requests, 0.1, seed=0) != split_held_out(requests, 0.1, seed=1)


def test_the_built_in_prompts_are_not_the_evaluation_suite():
    from specwise.bench.inputs.suite import load_suite
    suite = {json.dumps(r.messages or r.prompt) for r in load_suite()}
    assert len(load_prompts("suite")) >= 300
    assert not suite & {json.dumps(r.messages or r.prompt) for r in load_prompts("suite")}
    assert sorted(path.stem for path in DATA_DIR.glob("*.jsonl")) == sorted(CATEGORIES)


@pytest.mark.parametrize("kind", ["eagle", "eagle3", "medusa", "draft"])
def test_a_few_steps_lower_the_loss(tmp_path, cached_work, data_file, target, kind):
    config = settings(out_dir(tmp_path, cached_work), data_file, kind=kind, epochs=3, draft_layers=1)
    prepared = prepare(config, target)
    objective = build_objective(config, prepared)
    corpus = prepared.corpus
    batch = make_batch(corpus, corpus.split(False), objective.needs_features)
    before = objective.loss(batch, torch.Generator())[0].item()
    schedule = Schedule(lr=config.lr, weight_decay=0, warmup_steps=2, clip=1.0, epochs=3, batch_tokens=160,
                        checkpoint_every=100, eval_k=2, eval_stride=1, seed=0)
    train(objective, corpus, schedule, tmp_path / "work", resume=False, identity={}, log=lambda _: None)
    after = objective.loss(batch, torch.Generator())[0].item()
    assert after < before * 0.9, (before, after)


@pytest.mark.parametrize("kind", ["eagle", "eagle3", "medusa"])
def test_the_output_is_a_loadable_drafter_with_its_card(tmp_path, cached_work, data_file, target, kind):
    out = run(settings(out_dir(tmp_path, cached_work), data_file, kind=kind), target, log=lambda _: None)
    drafter, head = load_drafter(out, target.config, target.tokenizer, torch.float32)
    assert drafter.kind == kind and drafter.training["steps"] > 0
    card = (out / "README.md").read_text()
    assert "| shop | 6 |" in card and "Held-out acceptance" in card and "| all |" in card
    acceptance = drafter.training["held_out_acceptance"]
    assert set(acceptance) == {"shop", "talk", "all"} and acceptance["all"]["drafts"] > 0


@pytest.mark.parametrize("kind,fmt,written", [("medusa", "vllm", "config.json"), ("draft", "sglang", "config.json")])
def test_export_writes_the_engine_format_beside_the_drafter(tmp_path, cached_work, data_file, target, kind, fmt,
                                                            written):
    lines = []
    out = run(settings(out_dir(tmp_path, cached_work), data_file, kind=kind, draft_layers=1, export=fmt), target,
              log=lines.append)
    exported = out / f"export-{fmt}"
    assert (exported / written).is_file() and (exported / "README.md").is_file()
    assert any(line.startswith(f"exported to {exported}") for line in lines)


def test_an_export_the_format_cannot_hold_stops_before_training(tmp_path, data_file, target):
    with pytest.raises(ConfigError, match="cannot export this eagle drafter for SGLang: .*no final norm"):
        run(settings(tmp_path / "out", data_file, export="sglang"), target, log=lambda _: None)
    assert not (tmp_path / "out" / WORK_DIR).exists()          # nothing generated, nothing trained


def test_the_draft_model_output_runs_as_a_draft_and_stays_exact(tmp_path, cached_work, data_file, target):
    out = run(settings(out_dir(tmp_path, cached_work), data_file, kind="draft", draft_layers=1), target,
              log=lambda _: None)
    config = EngineConfig(dtype="float32", num_kv_blocks=128, block_size=4, max_model_len=96)
    params = SamplingParams(temperature=0, max_tokens=16)
    plain = LLMEngine(config, target)
    drafted = LLMEngine(EngineConfig(**{**vars(config), "speculative": f"draft:{out}"}), target)
    for engine in (plain, drafted):
        engine.add_request("Item 3: the fig", params, request_id="r")
    outputs = []
    for engine in (plain, drafted):
        while engine.has_unfinished():
            for output in engine.step():
                final = output
        outputs.append(final.output_token_ids)
    assert outputs[0] == outputs[1]
    assert drafted.stats.drafts > 0


def test_resume_continues_bit_identically(tmp_path, cached_work, data_file, target, monkeypatch):
    straight = run(settings(out_dir(tmp_path / "a", cached_work), data_file, unroll=2, feature_noise=0.1),
                   target, log=lambda _: None)
    calls = {"n": 0}
    original = EagleObjective.loss

    def interrupted(self, batch, generator):
        calls["n"] += 1
        if calls["n"] == 4:
            raise KeyboardInterrupt
        return original(self, batch, generator)

    monkeypatch.setattr(EagleObjective, "loss", interrupted)
    config = settings(out_dir(tmp_path / "b", cached_work), data_file, unroll=2, feature_noise=0.1)
    with pytest.raises(KeyboardInterrupt):
        run(config, target, log=lambda _: None)
    checkpoint = torch.load(tmp_path / "b" / "out" / WORK_DIR / CHECKPOINT_FILE, weights_only=False)
    assert 0 < checkpoint["state"]["step"] < 4             # the last one written before the 4th step
    monkeypatch.setattr(EagleObjective, "loss", original)
    resumed = run(TrainConfig(**{**vars(config), "resume": True}), target, log=lambda _: None)
    assert (straight / "model.safetensors").read_bytes() == (resumed / "model.safetensors").read_bytes()


def test_resume_with_other_settings_or_no_checkpoint_is_one_line(tmp_path, cached_work, data_file, target):
    out = out_dir(tmp_path, cached_work)
    with pytest.raises(ConfigError, match="no checkpoint to resume from"):
        run(settings(out, data_file, resume=True), target, log=lambda _: None)
    run(settings(out, data_file, epochs=1), target, log=lambda _: None)
    with pytest.raises(ConfigError, match="trained with lr = 0.003, this run has 0.01"):
        run(settings(out, data_file, epochs=1, lr=0.01, resume=True), target, log=lambda _: None)
    other = tiny_checkpoint(hidden_size=128)
    with pytest.raises(ConfigError, match=r"trained with target model = .*hidden_size 64.*, this run has .*hidden_size 128"):
        run(settings(out, data_file, epochs=1, resume=True), other, log=lambda _: None)
    (out / WORK_DIR / CHECKPOINT_FILE).write_bytes(b"not a checkpoint")
    with pytest.raises(ConfigError, match="cannot read the checkpoint"):
        run(settings(out, data_file, epochs=1, resume=True), target, log=lambda _: None)


@pytest.mark.parametrize("text,problem", [("", "no requests in this workload file"),
                                          ("{not json\n", r"prompts.jsonl:1: not valid JSON"),
                                          ('{"category": "x"}\n', r"prompts.jsonl:1: give exactly one of")])
def test_an_empty_or_malformed_data_file_is_one_line(tmp_path, text, problem):
    path = tmp_path / "prompts.jsonl"
    path.write_text(text)
    with pytest.raises(InputError, match=problem) as error:
        load_prompts(str(path))
    assert "\n" not in str(error.value)


def test_the_command_reports_bad_flags_in_one_line(tmp_path, capsys):
    assert main(["train-drafter", "--kind", "tree", "--out", str(tmp_path)]) == 2
    assert main(["train-drafter", "--kind", "eagle", "--out", str(tmp_path), "--data",
                 str(tmp_path / "missing.jsonl")]) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert errors[0] == "specwise: error: --kind must be one of eagle, eagle3, medusa, draft, got 'tree'"
    assert errors[1].startswith("specwise: error:") and "missing.jsonl: no such workload file" in errors[1]


def test_an_eagle3_recording_serves_an_eagle_run_too(tmp_path, cached_work, data_file, target, monkeypatch):
    """eagle3 records the features with its residual streams; a later eagle run reads them instead of
    recording again, and gets the same features without the streams."""
    out = out_dir(tmp_path, cached_work)
    plain = prepare(settings(out, data_file), target).corpus
    next(out.glob(f"{WORK_DIR}/data-*/features.safetensors")).unlink()
    with_layers = prepare(settings(out, data_file, kind="eagle3"), target).corpus
    assert with_layers.aux.shape == (len(plain.token_ids), 3 * target.config.hidden_size)
    monkeypatch.setattr("specwise.train.data.record_features", lambda *_: pytest.fail("recorded again"))
    reread = prepare(settings(out, data_file), target).corpus
    assert reread.aux is None and torch.equal(reread.features, plain.features)


def test_corpus_rows_become_pieces_in_file_order_up_to_the_token_cap(tmp_path, target):
    tokenizer = target.tokenizer
    path = tmp_path / "corpus.jsonl"
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello there"}]
    path.write_text(json.dumps({"text": "abcdefghij"}) + "\n\n" + json.dumps({"messages": chat}) + "\n" +
                    json.dumps({"text": "never read"}) + "\n")
    text_ids = tokenizer.encode("abcdefghij")                                 # 11 tokens: pieces of 4, 4, 3
    chat_ids = tokenizer.apply_chat_template(chat, add_generation_prompt=False)
    cap = len(text_ids) + 5
    pieces = read_corpus_texts(path, tokenizer, cap, max_len=4)
    # the chat's 5 tokens make pieces of 4 and 1: a piece of one token holds no pair and is dropped
    assert [t for piece in pieces for t in piece] == text_ids + chat_ids[:4]
    assert all(2 <= len(piece) <= 4 for piece in pieces)


@pytest.mark.parametrize("row, problem", [("{not json", "not JSON"), ('{"text": 3}', 'needs "text"'),
                                          ('{"messages": [{"role": "user"}]}', 'needs "text"')])
def test_a_bad_corpus_row_is_one_line_naming_it(tmp_path, target, row, problem):
    path = tmp_path / "corpus.jsonl"
    path.write_text(json.dumps({"text": "fine"}) + "\n" + row + "\n")
    with pytest.raises(InputError, match=f"corpus.jsonl:2: .*{problem}") as error:
        read_corpus_texts(path, target.tokenizer, 1000, 64)
    assert "\n" not in str(error.value)


def test_a_corpus_is_trained_on_as_it_is_beside_the_answers(tmp_path, cached_work, data_file, target):
    """--corpus: the texts are added as sequences of their own (category corpus, never held out), the target's
    features and greedy tokens recorded over them; the answers to --data are the cached ones."""
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps({"text": f"Document {i}: plain text the target never wrote."}) + "\n"
                            for i in range(3)))
    out = out_dir(tmp_path, cached_work)
    plain = prepare(settings(out, data_file), target)
    mixed = prepare(settings(out, data_file, corpus=str(path)), target)
    assert mixed.data_key != plain.data_key
    corpus = mixed.corpus
    index = corpus.categories.index("corpus")
    texts = [s for s in range(corpus.num_seqs) if int(corpus.category[s]) == index]
    assert len(texts) == 3 and not any(bool(corpus.held_out[s]) for s in texts)
    assert corpus.token_ids[corpus.rows(texts[0])].tolist() == target.tokenizer.encode(
        "Document 0: plain text the target never wrote.")
    assert corpus.num_seqs == plain.corpus.num_seqs + 3 and corpus.split(True) == plain.corpus.split(True)
    state = run(settings(out, data_file, corpus=str(path), epochs=1), target, log=lambda _: None)
    card = (state / "README.md").read_text()
    assert "tokens of corpus.jsonl read as they are" in card
