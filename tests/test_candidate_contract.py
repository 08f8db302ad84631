"""`DiversedCandidateGenerator` keeps transformers' `CandidateGenerator` contract: built from transformers' arguments,
`get_candidates(input_ids) -> (candidate_ids, candidate_logits)`, `update_candidate_strategy(input_ids, scores,
num_matches)`; transformers' own `_assisted_decoding` drives it, and the batched loop uses what it returns."""

import copy

import pytest
import torch
from tiny_models import ARCHITECTURES, VOCAB_SIZE, left_padded_batch, make_pair, prompt
from transformers import GenerationConfig
from transformers.generation.candidate_generator import CandidateGenerator

from diversed_hf import StaticEnsembleVerifier, compat, enable_diversed
from diversed_hf.drafting.candidates import DiversedCandidateGenerator, DraftCandidates, Realignment


class Counting(DiversedCandidateGenerator):
    """Counts the contract's calls and keeps what `get_candidates` returned."""

    calls: dict = {}
    returned: list = []

    def get_candidates(self, input_ids, **kwargs):
        Counting.calls["get_candidates"] = Counting.calls.get("get_candidates", 0) + 1
        candidates = super().get_candidates(input_ids, **kwargs)
        Counting.returned.append(candidates)
        return candidates

    def update_candidate_strategy(self, input_ids, scores, num_matches, **kwargs):
        Counting.calls["update_candidate_strategy"] = Counting.calls.get("update_candidate_strategy", 0) + 1
        return super().update_candidate_strategy(input_ids, scores, num_matches, **kwargs)


def _through_transformers(target, draft, input_ids, max_new_tokens=24, **kwargs):
    """`target.generate(..., assistant_model=draft)`: transformers' `_assisted_decoding`, drafting with ours."""
    Counting.calls, Counting.returned = {}, []
    with compat.assisted_decoding_candidates(target, Counting):
        return target.generate(input_ids, assistant_model=draft, max_new_tokens=max_new_tokens, **kwargs)


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_transformers_assisted_decoding_drives_the_generator_to_greedy_output(architecture):
    """Built with transformers' arguments (no prefill), driven by its loop (no finish): greedy output is the target's."""
    target, draft = make_pair(architecture, noise=0.3)
    draft = copy.deepcopy(draft)
    draft.generation_config.num_assistant_tokens = 4  # read from the assistant's config, as transformers does
    input_ids = prompt(9, seed=3)  # crosses Gemma3's sliding window of 6
    expected = target.generate(input_ids, do_sample=False, max_new_tokens=24)
    output = _through_transformers(target, draft, input_ids, do_sample=False)
    assert torch.equal(output, expected)
    rounds = Counting.calls["get_candidates"]
    assert rounds > 1 and Counting.calls["update_candidate_strategy"] == rounds
    assert all(isinstance(c, DraftCandidates) for c in Counting.returned)
    drafted = [c.candidate_logits for c in Counting.returned if c.candidate_logits is not None]  # None: no draft
    assert all(logits.shape[-1] == VOCAB_SIZE for logits in drafted) and max(x.shape[1] for x in drafted) == 4
    accepted = output.shape[1] - input_ids.shape[1] - rounds  # tokens beyond one per round came from accepted drafts
    assert accepted > 0, "the pair should agree sometimes, or the cache crop is not exercised"


@pytest.mark.parametrize("architecture", ["llama", "qwen3"])
def test_transformers_ensemble_reads_the_generators_candidate_logits(architecture):
    """transformers' `assistant_ensemble_weight` mixes softmax(candidate_logits) into its verification: the output
    equals transformers' own ensemble only if our logits are the draft's processed scores at each drafted position."""
    target, draft = make_pair(architecture, noise=0.3)
    draft = copy.deepcopy(draft)
    draft.generation_config.num_assistant_tokens = 4
    draft.generation_config.num_assistant_tokens_schedule = "constant"
    draft.generation_config.assistant_confidence_threshold = 0.0
    input_ids = prompt(7, seed=3)
    common = dict(do_sample=False, assistant_ensemble_weight=0.4)
    expected = target.generate(input_ids, assistant_model=draft, max_new_tokens=24, **common)
    plain = target.generate(input_ids, do_sample=False, max_new_tokens=24)
    assert not torch.equal(expected, plain), "pick a case where the ensemble changes the output"
    assert torch.equal(_through_transformers(target, draft, input_ids, **common), expected)


def test_heuristic_schedule_under_transformers_persists_on_the_assistant():
    """transformers writes the heuristic's value back only for its own generator class; ours does it itself."""
    target, draft = make_pair("llama", noise=0.05)
    ours, theirs = copy.deepcopy(draft), copy.deepcopy(draft)
    for model in (ours, theirs):
        model.generation_config.num_assistant_tokens = 2
        model.generation_config.num_assistant_tokens_schedule = "heuristic"
        model.generation_config.assistant_confidence_threshold = 0.0
    expected = target.generate(prompt(5), assistant_model=theirs, do_sample=False, max_new_tokens=20)
    assert torch.equal(_through_transformers(target, ours, prompt(5), max_new_tokens=20, do_sample=False), expected)
    assert ours.generation_config.num_assistant_tokens == theirs.generation_config.num_assistant_tokens != 2


def test_the_loop_verifies_the_logits_get_candidates_returns(monkeypatch):
    """The batched loop takes q_t from the returned candidate_logits: a generator that returns other logits changes
    what the verifier sees (it used to read a side attribute)."""
    from diversed_hf.generation import rounds

    seen = []

    class Recording(StaticEnsembleVerifier):
        def __call__(self, draft_ids, draft_probs, target_probs, **kwargs):
            seen.append(draft_probs)
            return super().__call__(draft_ids, draft_probs, target_probs, **kwargs)

    class Flattened(Counting):
        def get_candidates(self, input_ids, **kwargs):
            candidates = super().get_candidates(input_ids, **kwargs)
            flat = torch.zeros_like(candidates.candidate_logits)  # uniform q
            return DraftCandidates(
                candidates.candidate_ids,
                flat,
                draft_lengths=candidates.draft_lengths,
                attention_mask=candidates.attention_mask,
            )

    target, draft = make_pair("llama")
    enable_diversed(target)
    monkeypatch.setattr(rounds, "DiversedCandidateGenerator", Flattened)  # the chain strategy picks the class
    Counting.calls, Counting.returned = {}, []
    output = target.generate(
        prompt(6),
        assistant_model=draft,
        verifier=Recording(0.5),
        do_sample=False,
        max_new_tokens=12,
        num_assistant_tokens=3,
        return_dict_in_generate=True,
    )
    assert seen and all(torch.allclose(q, torch.full_like(q, 1 / VOCAB_SIZE)) for q in seen)
    rounds = int(output.speculation.num_rounds[0])
    assert Counting.calls == {"get_candidates": rounds, "update_candidate_strategy": rounds}  # the last round too


def test_generator_state_follows_update_candidate_strategy():
    """Budgets shrink by num_matches + 1, finished rows leave through `realignment`, and without one the draft cache
    is cropped to `input_ids` less the two tokens it lags (transformers' way)."""
    _, draft = make_pair("qwen3")
    _, input_ids, attention_mask = left_padded_batch([3, 7, 5])
    batch_size, length = input_ids.shape
    generator = DiversedCandidateGenerator(
        input_ids,
        draft,
        GenerationConfig(max_length=length + 10, do_sample=False),
        {"attention_mask": attention_mask},
        num_assistant_tokens=4,
        vocab_size=VOCAB_SIZE,
        output_hidden_states=True,
        output_untempered_probs=True,
    )
    assert isinstance(generator, CandidateGenerator) and generator.cache.get_seq_length() == 0
    candidate_ids, candidate_logits = candidates = generator.get_candidates(input_ids, attention_mask=attention_mask)
    assert candidate_ids.shape == (batch_size, length + 4) and torch.equal(candidate_ids[:, :length], input_ids)
    assert candidate_logits.shape == (batch_size, 4, VOCAB_SIZE)
    assert torch.equal(candidate_logits.argmax(-1), candidate_ids[:, length:])  # greedy drafts
    assert candidates.draft_lengths.tolist() == [4, 4, 4] and candidates.attention_mask.shape == (
        batch_size,
        length + 4,
    )
    assert candidates.untempered_draft_probs.shape == (batch_size, 4, VOCAB_SIZE)
    assert candidates.draft_hidden.shape == (batch_size, 4, draft.config.hidden_size)
    assert generator.cache.get_seq_length() == length + 4 - 1

    # Row 1 finishes; rows 0 and 2 continue with one accepted draft each: crop to L + 2 - 2 columns.
    realignment = Realignment(kept=torch.tensor([0, 2]), shifts=None, new_length=length + 2, leading=0)
    seq = candidate_ids[[0, 2], : length + 2]  # the accepted draft stands in for the recovered token
    mask = torch.cat([attention_mask[[0, 2]], torch.ones(2, 2, dtype=torch.long)], dim=1)
    generator.update_candidate_strategy(seq, None, torch.tensor([1, 4, 1]), realignment=realignment)
    assert generator.remaining.tolist() == [8, 8] and generator.draft_lengths.tolist() == [4, 4]
    assert generator.cache.get_seq_length() == length
    candidate_ids, candidate_logits = generator.get_candidates(seq, attention_mask=mask)
    assert candidate_ids.shape == (2, length + 2 + 4) and candidate_logits.shape == (2, 4, VOCAB_SIZE)

    # transformers' way: an int for every row, no realignment; the budget leaves 8 - 4 = 4 tokens, so 3 drafts.
    seq = candidate_ids[:, : length + 2 + 4]
    generator.update_candidate_strategy(seq, None, 3)
    assert generator.remaining.tolist() == [4, 4] and generator.draft_lengths.tolist() == [3, 3]
    assert generator.cache.get_seq_length() == seq.shape[1] - 2
    with pytest.raises(ValueError, match=r"`input_ids` has 1 rows after a round of 2.*realignment=Realignment\(kept"):
        generator.update_candidate_strategy(seq[:1], None, 0)


def test_get_candidates_twice_without_an_update_names_the_contract():
    """A second `get_candidates` before `update_candidate_strategy` used to fail with a reshape error in the model."""
    _, draft = make_pair("llama")
    input_ids = prompt(5)
    generator = DiversedCandidateGenerator(
        input_ids,
        draft,
        GenerationConfig(max_length=20, do_sample=False),
        {},
        num_assistant_tokens=3,
        vocab_size=VOCAB_SIZE,
    )
    candidate_ids, _ = generator.get_candidates(input_ids)
    with pytest.raises(RuntimeError, match="called again before `update_candidate_strategy`.*one `get_candidates"):
        generator.get_candidates(input_ids)
    generator.update_candidate_strategy(candidate_ids[:, : input_ids.shape[1] + 2], None, 1)
    assert generator.get_candidates(candidate_ids[:, : input_ids.shape[1] + 2])[0].shape[1] == input_ids.shape[1] + 5


def test_the_generator_needs_a_budget_and_a_prompt():
    _, draft = make_pair("llama")
    with pytest.raises(ValueError, match=r"pass `max_new_tokens=` or a `generation_config` whose `max_length` is set"):
        DiversedCandidateGenerator(prompt(4), draft)
    with pytest.raises(TypeError, match=r"`input_ids` must be the prompt as a \(batch, length\) tensor"):
        DiversedCandidateGenerator(draft, prompt(4))
    generator = DiversedCandidateGenerator(prompt(4), draft, max_new_tokens=6, schedule="optimal")
    generator.get_candidates(prompt(4))
    with pytest.raises(ValueError, match="the 'optimal' schedule needs the round's `position_acceptance`"):
        generator.update_candidate_strategy(prompt(5), None, 0)


@pytest.mark.parametrize("max_new_tokens", [1, 2, 10])
def test_transformers_sampling_loop_drives_the_generator_to_the_end(max_new_tokens):
    """When no row has a token left to draft, `get_candidates` returns `None` logits as transformers'
    `AssistedCandidateGenerator` does: its sampling loop then takes the target's token (empty logits made
    `_speculative_sampling` raise IndexError)."""
    target, draft = make_pair("llama", noise=0.3)
    draft = copy.deepcopy(draft)
    draft.generation_config.num_assistant_tokens = 3
    for seed in range(6):
        torch.manual_seed(seed)
        output = _through_transformers(
            target, draft, prompt(5, seed=seed), max_new_tokens=max_new_tokens, do_sample=True
        )
        assert output.shape == (1, 5 + max_new_tokens)
        if max_new_tokens == 1:  # the only round drafts nothing
            assert [c.candidate_logits for c in Counting.returned] == [None]
