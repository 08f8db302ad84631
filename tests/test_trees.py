"""Token trees (diversed_hf.drafting.tree, diversed_hf.verifiers.tree, diversed_hf.generation.tree_round): greedy
parity with the target, the declared law over trees for every verifier with a tree form (batched), the knobs, the
statistics and the refusals."""

import json

import pytest
import torch
from scripts import load_script
from tiny_models import (
    DEVICE,
    VOCAB_SIZE,
    declared_first_token,
    empirical,
    left_padded_batch,
    make_pair,
    prompt,
    tv_bound,
)
from transformers import GenerationConfig

from diversed_hf import DiversedHead, enable_diversed
from diversed_hf.drafting.tree import TreeSpec
from diversed_hf.verifiers import (
    ExactVerifier,
    HeadVerifier,
    LenientVerifier,
    SpecCascadeVerifier,
    StaticEnsembleVerifier,
    TypicalAcceptanceVerifier,
    ops,
)

DYNAMIC = dict(num_assistant_tokens=3, assistant_tree_top_k=2, assistant_tree_size=6)
STATIC = dict(num_assistant_tokens=3, assistant_tree=[(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)])


@pytest.fixture(scope="module")
def pair():
    target, draft = make_pair("llama", noise=0.5)
    return enable_diversed(target), draft


@pytest.mark.parametrize("architecture", ["llama", "qwen3"])
@pytest.mark.parametrize("tree", [DYNAMIC, STATIC, dict(num_assistant_tokens=4, assistant_tree_top_k=3)])
def test_greedy_tree_output_is_the_targets_in_a_ragged_batch(architecture, tree):
    target, draft = make_pair(architecture, noise=0.3)
    enable_diversed(target)
    _, input_ids, attention_mask = left_padded_batch([3, 7, 5])
    expected = target.generate(input_ids, attention_mask=attention_mask, do_sample=False, max_new_tokens=24)
    output = target.generate(
        input_ids,
        attention_mask=attention_mask,
        assistant_model=draft,
        verifier=ExactVerifier(),
        do_sample=False,
        max_new_tokens=24,
        return_dict_in_generate=True,
        **tree,
    )
    assert torch.equal(output.sequences, expected)
    stats = output.speculation
    assert stats.tree_nodes is not None and bool((stats.nodes_per_round > 1).all())
    assert bool((stats.num_generated == 24).all())


@pytest.mark.parametrize("drafter", ["draft model", "EagleDraft"])
def test_a_round_with_one_token_left_in_every_row_drafts_nothing_and_stays_exact(monkeypatch, drafter):
    """The tree grows before its one read says whether any row may draft; when none may (each has one token left),
    the round is the target's token alone, and the output is still the target's."""
    from diversed_hf import EagleDraft
    from diversed_hf.drafting import tree_candidates

    target, draft = make_pair("llama", noise=0.3)
    enable_diversed(target)
    if drafter == "EagleDraft":
        draft = EagleDraft.for_target(target).eval()
    grown = []
    grow = tree_candidates._TreeDrafting._grow
    monkeypatch.setattr(
        tree_candidates._TreeDrafting, "_grow", lambda self, *a: grown.append(grow(self, *a)) or grown[-1]
    )
    input_ids = prompt(5, seed=2)
    for max_new_tokens in range(1, 9):
        expected = target.generate(input_ids, do_sample=False, max_new_tokens=max_new_tokens)
        output = target.generate(
            input_ids,
            assistant_model=draft,
            verifier=ExactVerifier(),
            do_sample=False,
            max_new_tokens=max_new_tokens,
            **DYNAMIC,
        )
        assert torch.equal(output, expected), max_new_tokens
    assert any(tree is None for tree in grown) and any(tree is not None for tree in grown)


def test_a_tree_accepts_more_per_round_than_its_chain_when_greedy(pair):
    """The draft's second guesses are tried: on the same prompts the tree's rounds emit at least as many tokens."""
    target, draft = pair
    input_ids = prompt(6, batch=8, seed=3)
    common = dict(assistant_model=draft, verifier=ExactVerifier(), do_sample=False, max_new_tokens=32)
    chain = target.generate(input_ids, num_assistant_tokens=3, return_dict_in_generate=True, **common).speculation
    tree = target.generate(input_ids, return_dict_in_generate=True, **DYNAMIC, **common).speculation
    assert float(tree.tokens_per_round.mean()) > float(chain.tokens_per_round.mean())
    assert chain.tree_nodes is None  # a chain reports no tree


def _verifier(method, target, draft):
    if method == "head":
        head = DiversedHead.for_pair(target, draft, architecture="mlp")
        generator = torch.Generator().manual_seed(3)
        with torch.no_grad():
            for parameter in head.parameters():
                parameter.copy_(0.1 * torch.randn(parameter.shape, generator=generator))
        return HeadVerifier(head.requires_grad_(False))
    return {
        "exact": ExactVerifier(),
        "static0.3": StaticEnsembleVerifier(0.3),
        "static0": StaticEnsembleVerifier(0.0),
        "cascade-opt": SpecCascadeVerifier("opt", 0.3),
    }[method]


@pytest.mark.parametrize("tree", [DYNAMIC, STATIC], ids=["dynamic", "static"])
@pytest.mark.parametrize("method", ["exact", "static0.3", "static0", "cascade-opt", "head"])
def test_the_first_token_over_a_tree_follows_pi_with_temperature_top_k_top_p(pair, method, tree):
    """Thousands of rows in one call, each with its own tree: the first emitted token follows the verifier's pi at
    the root (built from processed q and p), whichever child (or residual) it came from."""
    target, draft = pair
    verifier = _verifier(method, target, draft)
    sampling = dict(do_sample=True, temperature=0.7, top_k=20, top_p=0.9)
    input_ids = prompt(6, seed=5)
    declared, _ = declared_first_token(target, draft, verifier, input_ids, sampling)
    _check_first_token(target, draft, verifier, input_ids, declared, 6000, **tree, **sampling)


@pytest.mark.parametrize("tree", [DYNAMIC, STATIC], ids=["dynamic", "static"])
def test_speccascade_over_a_tree_decides_on_temperature_1_probabilities(pair, tree):
    """SpecCascade's deferral reads the untempered q and p (as in a chain): with a `chow` threshold between the
    draft's untempered and processed top probability at the root, the two readings declare different laws, and
    the tree's first token follows the untempered one."""
    target, draft = pair
    sampling = dict(do_sample=True, temperature=0.5)
    input_ids = prompt(6, seed=5)
    processors = target._get_logits_processor(GenerationConfig(**sampling))
    with torch.no_grad():
        logits = draft(input_ids).logits[:, -1]
    untempered_top = float(logits.softmax(-1).max())
    processed_top = float(processors(input_ids, logits).softmax(-1).max())
    verifier = SpecCascadeVerifier("chow", 1.0 - (untempered_top + processed_top) / 2)
    declared, _ = declared_first_token(target, draft, verifier, input_ids, sampling)
    on_processed, _ = verifier.verification_probs(*_processed_root(target, draft, input_ids, processors))
    assert float(ops.total_variation(declared, on_processed[0, 0])) > 0.2  # the test tells the two apart
    _check_first_token(target, draft, verifier, input_ids, declared, 3000, **tree, **sampling)


def _check_first_token(target, draft, verifier, input_ids, declared, num_rows: int, **options):
    """``num_rows`` copies of the prompt in one call: their first emitted token follows ``declared`` (a TV bound)."""
    output = target.generate(
        input_ids.repeat(num_rows, 1),
        assistant_model=draft,
        verifier=verifier,
        max_new_tokens=2,
        generator=torch.Generator(device=DEVICE).manual_seed(0),
        **options,
    )
    observed = empirical(output[:, input_ids.shape[1]], VOCAB_SIZE)
    tv = float(ops.total_variation(observed, declared.double()))
    assert tv < tv_bound(declared, num_rows), tv


def _processed_root(target, draft, input_ids, processors):  # q and p at the root after the processors, (1, 1, V)
    with torch.no_grad():
        probs = [
            processors(input_ids, model(input_ids).logits[:, -1]).softmax(-1)[:, None] for model in (draft, target)
        ]
    return probs


@pytest.mark.parametrize("drafter", ["draft model", "eagle"])
@pytest.mark.parametrize("tree", [DYNAMIC, STATIC], ids=["dynamic", "static"])
def test_two_tokens_over_a_tree_follow_the_target_losslessly(pair, tree, drafter):
    """ExactVerifier over a tree keeps the target's law at every position: the second token's marginal is
    sum_x1 p(x1) p(x2 | x1), whether it came from a deeper node, a residual or the next round (the caches after a
    compaction included, and an EagleDraft's features of the accepted path)."""
    target, draft = pair
    if drafter == "eagle":
        from test_eagle import eagle_pair

        target, draft = eagle_pair()
    input_ids = prompt(6, seed=5)
    num_rows = 6000
    output = target.generate(
        input_ids.repeat(num_rows, 1),
        assistant_model=draft,
        verifier=ExactVerifier(),
        do_sample=True,
        max_new_tokens=3,
        generator=torch.Generator(device=DEVICE).manual_seed(1),
        **tree,
    )
    with torch.no_grad():
        first = target(input_ids).logits[0, -1].softmax(-1).double()  # (V,)
        every_first = torch.cat([input_ids.repeat(VOCAB_SIZE, 1), torch.arange(VOCAB_SIZE)[:, None]], dim=1)
        second = target(every_first).logits[:, -1].softmax(-1).double()  # (V, V)
    declared = first @ second
    observed = empirical(output[:, input_ids.shape[1] + 1], VOCAB_SIZE)
    assert float(ops.total_variation(observed, declared)) < tv_bound(declared, num_rows)


def test_a_tree_with_one_child_per_node_is_the_chain(pair):
    """``assistant_tree_top_k=1`` alone asks for nothing new: the call drafts today's chain."""
    assert TreeSpec.resolve(None, None, 4, assistant_tree_top_k=1) is None
    shipped = GenerationConfig(assistant_tree_top_k=4, assistant_tree_size=12)  # a draft that ships a tree
    assert TreeSpec.resolve(None, shipped, 3, assistant_tree_top_k=1) is None  # the caller asks for the chain
    target, draft = pair
    common = dict(assistant_model=draft, verifier=ExactVerifier(), max_new_tokens=8, return_dict_in_generate=True)
    output = target.generate(prompt(5), assistant_tree_top_k=1, **common)
    assert output.speculation.tree_nodes is None


def test_tree_knobs_come_from_the_assistants_generation_config(pair):
    target, draft = pair
    draft.generation_config.assistant_tree_top_k = 2
    try:
        output = target.generate(
            prompt(5),
            assistant_model=draft,
            verifier=ExactVerifier(),
            do_sample=False,
            max_new_tokens=8,
            num_assistant_tokens=2,
            return_dict_in_generate=True,
        )
    finally:
        del draft.generation_config.assistant_tree_top_k
    assert output.speculation.tree_nodes is not None
    assert float(output.speculation.nodes_per_round[0]) <= 4  # the default size: depth x top_k


@pytest.mark.parametrize(
    "knobs, match",
    [
        (dict(assistant_tree_top_k=0), r"`assistant_tree_top_k` must be a positive integer.*got 0"),
        (dict(assistant_tree_top_k=-2), r"`assistant_tree_top_k` must be a positive integer.*got -2"),
        (dict(assistant_tree_top_k=2, assistant_tree_size=0), r"`assistant_tree_size` must be a positive integer"),
        (dict(assistant_tree_top_k=2, assistant_tree_size=2), r"`assistant_tree_size=2` is below the tree's depth"),
        (dict(assistant_tree_size=6), r"`assistant_tree_size=6` needs `assistant_tree_top_k`"),
        (dict(assistant_tree=[(0,), (0, 0, 0)]), r"the path \(0, 0, 0\) but not its parent \(0, 0\)"),
        (dict(assistant_tree=[(0,), (0,)]), r"lists the path \(0,\) twice"),
        (dict(assistant_tree=[(0,), (-1,)]), r"non-negative ranks"),
        (dict(assistant_tree=[(0,), (2,)]), r"not its elder sibling \(1,\)"),
        (dict(assistant_tree=[]), r"`assistant_tree` is empty"),
        (dict(assistant_tree="(0,)"), r"`assistant_tree` must be a list of paths"),
        (dict(assistant_tree=[(0,)], assistant_tree_top_k=2), r"either `assistant_tree`.*or `assistant_tree_top_k`"),
    ],
)
def test_bad_tree_knobs_are_refused_before_any_forward(pair, knobs, match, monkeypatch):
    target, draft = pair
    monkeypatch.setattr(draft, "forward", _no_forward)
    with pytest.raises((ValueError, TypeError), match=match):
        target.generate(
            prompt(4),
            assistant_model=draft,
            verifier=ExactVerifier(),
            max_new_tokens=6,
            num_assistant_tokens=3,
            **knobs,
        )


def _no_forward(*args, **kwargs):
    raise AssertionError("a model ran before the arguments were checked")


@pytest.mark.parametrize(
    "options, match",
    [
        (dict(verifier=LenientVerifier(0.5)), "LenientVerifier has no token-tree form"),
        (dict(verifier=TypicalAcceptanceVerifier()), "TypicalAcceptanceVerifier has no token-tree form"),
        (dict(verifier=ExactVerifier(), block_verification=True), "BlockVerifier has no token-tree form"),
        (dict(verifier=ExactVerifier(), num_assistant_tokens_schedule="heuristic"), "'constant' schedule"),
        (dict(verifier=ExactVerifier(), assistant_confidence_threshold=0.4), "drop the threshold"),
        (dict(verifier=ExactVerifier(), num_return_sequences=2, do_sample=True), "`num_return_sequences=2`"),
    ],
)
def test_what_a_tree_cannot_run_is_refused_by_name(pair, options, match, monkeypatch):
    target, draft = pair
    monkeypatch.setattr(draft, "forward", _no_forward)
    with pytest.raises(ValueError, match=match):
        target.generate(prompt(4), assistant_model=draft, max_new_tokens=6, assistant_tree_top_k=2, **options)


def test_drafters_without_a_tree_form_are_refused_by_name(pair):
    target, _ = pair
    with pytest.raises(ValueError, match="the drafter is PromptLookup"):
        target.generate(
            prompt(8), prompt_lookup_num_tokens=3, verifier=ExactVerifier(), max_new_tokens=6, assistant_tree_top_k=2
        )


def test_a_tree_streams_each_rounds_accepted_path(pair):
    """A chat UI's streamer with a tree (the shipped drafts carry one): the prompt, then every round's accepted
    path, which together are the returned sequence."""
    from transformers.generation.streamers import BaseStreamer

    class Collect(BaseStreamer):
        def __init__(self):
            self.pieces, self.ended = [], False

        def put(self, value):
            self.pieces.append(value.reshape(-1))

        def end(self):
            self.ended = True

    target, draft = pair
    streamer = Collect()
    output = target.generate(
        prompt(4),
        assistant_model=draft,
        verifier=ExactVerifier(),
        do_sample=False,
        max_new_tokens=12,
        return_dict_in_generate=True,
        streamer=streamer,
        **DYNAMIC,
    )
    assert output.speculation.tree_nodes is not None  # drafted as a tree, not a chain fallen back to
    assert streamer.ended and len(streamer.pieces) == 1 + int(output.speculation.num_rounds[0])
    assert torch.equal(torch.cat(streamer.pieces), output.sequences[0])


def test_sliding_window_models_are_refused_for_trees():
    target, draft = make_pair("gemma3", noise=0.3)
    enable_diversed(target)
    with pytest.raises(ValueError, match="sliding-window layers"):
        target.generate(
            prompt(4), assistant_model=draft, verifier=ExactVerifier(), max_new_tokens=6, assistant_tree_top_k=2
        )


def test_a_sliding_window_without_layer_types_is_refused_for_trees():
    """Mistral (and Phi-3) configs set ``sliding_window`` without ``layer_types``: every layer is windowed, which a
    tree's one 4-D mask cannot express, so a tree is refused by name; the chain keeps the target's greedy text."""
    from transformers import MistralConfig, MistralForCausalLM

    config = MistralConfig(
        vocab_size=16, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, sliding_window=3, pad_token_id=0, eos_token_id=1, bos_token_id=2,
    )  # fmt: skip
    torch.manual_seed(0)
    target, draft = enable_diversed(MistralForCausalLM(config).eval()), MistralForCausalLM(config).eval()
    input_ids = torch.randint(3, 16, (1, 13))
    common = dict(assistant_model=draft, verifier=ExactVerifier(), do_sample=False, max_new_tokens=8)
    with pytest.raises(ValueError, match="sliding-window layers"):
        target.generate(input_ids, num_assistant_tokens=3, assistant_tree_top_k=2, **common)
    chain = target.generate(input_ids, num_assistant_tokens=3, **common)
    assert torch.equal(chain, target.generate(input_ids, do_sample=False, max_new_tokens=8))


def test_an_eagle_draft_drafts_trees_with_the_targets_greedy_output():
    from test_eagle import eagle_pair

    target, draft = eagle_pair()
    _, input_ids, attention_mask = left_padded_batch([3, 6, 4])
    expected = target.generate(input_ids, attention_mask=attention_mask, do_sample=False, max_new_tokens=16)
    for tree in (DYNAMIC, STATIC):
        output = target.generate(
            input_ids,
            attention_mask=attention_mask,
            assistant_model=draft,
            do_sample=False,
            max_new_tokens=16,
            return_dict_in_generate=True,
            **tree,
        )  # an EagleDraft verifies losslessly by default
        assert torch.equal(output.sequences, expected)
        assert output.speculation.tree_nodes is not None


def test_early_exit_drafts_trees_with_the_targets_greedy_output(pair):
    target, _ = pair
    _, input_ids, attention_mask = left_padded_batch([3, 6])
    expected = target.generate(input_ids, attention_mask=attention_mask, do_sample=False, max_new_tokens=16)
    output = target.generate(
        input_ids,
        attention_mask=attention_mask,
        assistant_early_exit=1,
        verifier=ExactVerifier(),
        do_sample=False,
        max_new_tokens=16,
        return_dict_in_generate=True,
        **DYNAMIC,
    )
    assert torch.equal(output.sequences, expected)
    assert output.speculation.tree_nodes is not None


def test_the_tree_results_page_runs_quick_and_says_which_goals_it_did_not_measure(tmp_path):
    tree_results = load_script("tree_results")

    assert (
        tree_results.main(["--quick", "--num_prompts", "1", "--max_new_tokens", "6", "--output_dir", str(tmp_path)])
        == 0
    )
    page = (tmp_path / "trees.md").read_text()
    assert "| greedy | tree 3x4 (12) |" in page and "| T=0.7 | chain N=5 |" in page
    assert "| greedy | transformers assisted N=5 |" in page
    greedy_rows = [line for line in page.splitlines() if line.startswith("| greedy |") and "target-only" not in line]
    assert greedy_rows and all(line.rstrip().endswith("| yes |") for line in greedy_rows), greedy_rows
    assert "not measured by this run" in page  # --quick runs the testbed only


def test_the_heads_over_trees_page_runs_quick_with_paired_quality(tmp_path):
    tree_heads = load_script("tree_heads")

    assert tree_heads.main(["--quick", "--num_prompts", "4", "--output_dir", str(tmp_path)]) == 0
    page = (tmp_path / "tree_heads.md").read_text()
    assert "| DIVERSED, tree |" in page and "| DIVERSED, chain |" in page and "Verdict: the head over the tree" in page
    result = json.loads((tmp_path / "results.json").read_text())["testbed arith"]
    assert {"low", "high", "delta"} <= set(result["rows"]["DIVERSED, tree"]["vs_chain"])


def test_the_gpu_script_says_there_is_no_cuda_and_exits_0(capsys):
    tree_gpu = load_script("tree_gpu")

    if torch.cuda.is_available():
        pytest.skip("a CUDA machine runs the script for real")
    assert tree_gpu.main(["--quick"]) == 0
    assert "No CUDA device" in capsys.readouterr().out


def test_a_tree_from_the_drafts_config_falls_back_to_a_chain_with_a_warning_where_it_cannot_run(pair, caplog):
    """A shipped draft's generation config may carry its best tree; a call that cannot draft one (here a lenient
    verifier) drafts a chain and says why. The same knobs passed to ``generate`` are an error instead (above)."""
    target, draft = pair
    draft.generation_config.assistant_tree_top_k = 2
    try:
        with caplog.at_level("WARNING", logger="diversed_hf.generation.mixin"):
            output = target.generate(
                prompt(5),
                assistant_model=draft,
                verifier=LenientVerifier(0.5),
                max_new_tokens=6,
                return_dict_in_generate=True,
            )
    finally:
        del draft.generation_config.assistant_tree_top_k
    assert output.speculation.tree_nodes is None
    assert "LenientVerifier has no token-tree form" in caplog.text and "drafts a chain of" in caplog.text


def test_output_scores_over_a_tree_are_the_targets_at_each_emitted_token(pair):
    """``output_scores`` / ``output_logits`` with a tree: the target's processed scores and raw logits at the slot
    each emitted token was decided at, as transformers lays them out (greedy: each token is its scores' argmax)."""
    target, draft = pair
    input_ids = prompt(5, batch=2, seed=4)
    output = target.generate(
        input_ids,
        assistant_model=draft,
        verifier=ExactVerifier(),
        do_sample=False,
        max_new_tokens=12,
        output_scores=True,
        output_logits=True,
        return_dict_in_generate=True,
        **DYNAMIC,
    )
    new = output.sequences[:, input_ids.shape[1] :]
    assert len(output.scores) == len(output.logits) == new.shape[1]
    for step, (scores, logits) in enumerate(zip(output.scores, output.logits)):
        assert torch.equal(scores.argmax(dim=-1), new[:, step])
        assert torch.equal(logits.argmax(dim=-1), new[:, step])
    expected = target.generate(
        input_ids, do_sample=False, max_new_tokens=12, output_logits=True, return_dict_in_generate=True
    )
    assert torch.allclose(torch.stack(output.logits), torch.stack(expected.logits), atol=1e-4)


def test_a_tree_from_a_config_shrinks_with_the_batch_and_one_asked_for_does_not():
    """A shipped draft's tree is its best shape at batch 1; a batch shares the target pass, so each row verifies
    size / batch nodes, and a batch too wide for more than the chain drafts the chain."""
    shipped = TreeSpec.resolve(None, GenerationConfig(assistant_tree_top_k=4, assistant_tree_size=12), 3)
    assert shipped.from_config and shipped.for_batch(1) is shipped
    assert shipped.for_batch(2).size == 6 and shipped.for_batch(8) is None
    asked = TreeSpec.resolve(None, None, 3, assistant_tree_top_k=4, assistant_tree_size=12)
    assert asked.for_batch(8) is asked


def test_the_shipped_tree_gives_way_to_the_chain_at_batch_8(pair):
    target, draft = pair
    draft.generation_config.assistant_tree_top_k = 2
    draft.generation_config.assistant_tree_size = 6
    try:
        common = dict(assistant_model=draft, verifier=ExactVerifier(), max_new_tokens=6, num_assistant_tokens=3)
        wide = target.generate(prompt(4, batch=8), return_dict_in_generate=True, **common).speculation
        alone = target.generate(prompt(4), return_dict_in_generate=True, **common).speculation
    finally:
        del draft.generation_config.assistant_tree_top_k, draft.generation_config.assistant_tree_size
    assert wide.tree_nodes is None and alone.tree_nodes is not None


@pytest.mark.parametrize(
    "knobs, match",
    [
        (
            dict(assistant_tree_top_k=VOCAB_SIZE + 1),
            rf"`assistant_tree_top_k={VOCAB_SIZE + 1}` is beyond the vocabulary",
        ),
        (dict(assistant_tree_top_k=True), r"`assistant_tree_top_k` must be a positive integer .* got True"),
        (dict(assistant_tree_top_k=2, assistant_tree_size=True), r"`assistant_tree_size` must be a positive integer"),
    ],
)
def test_bad_tree_knobs_are_refused_before_any_forward(pair, knobs, match, monkeypatch):
    target, draft = pair
    monkeypatch.setattr(draft, "forward", lambda *a, **k: pytest.fail("the draft ran"))
    with pytest.raises(ValueError, match=match):
        target.generate(prompt(4), assistant_model=draft, verifier=ExactVerifier(), max_new_tokens=4, **knobs)
