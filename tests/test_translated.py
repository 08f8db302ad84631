"""A draft with another tokenizer (universal assisted decoding) in the batched loop: translated tokens are point-mass
proposals, so lossless SD keeps the target's law and a relaxed verifier emits its declared mixture
(diversed_hf.drafting.translated)."""

from __future__ import annotations

import re
import string

import pytest
import torch
from tiny_models import EOS_TOKEN_ID, VOCAB_SIZE, empirical, make_model, tv_bound
from tokenizers import Tokenizer, decoders, models
from transformers import PreTrainedTokenizerFast

from diversed_hf import DiversedHead, enable_diversed
from diversed_hf.drafting.translated import translate_continuation
from diversed_hf.verifiers import ExactVerifier, StaticEnsembleVerifier, ops

SPECIALS = ["<pad>", "</s>", "<s>"]  # ids 0, 1, 2 as the tiny models' pad / EOS / BOS
SYMBOLS = list(string.ascii_lowercase + string.ascii_uppercase + string.digits[:9])  # 61: with SPECIALS, 64 ids
MERGES = [("a", "b"), ("c", "d"), ("e", "f"), ("ab", "cd"), ("g", "h"), ("i", "j"), ("k", "l"), ("m", "n")]


def tokenizer(merges: list[tuple[str, str]], reverse: bool) -> PreTrainedTokenizerFast:
    """A BPE over single characters (the target's: no merges) or with a few merges and its ids in another order."""
    pieces = SYMBOLS[::-1] if reverse else SYMBOLS
    pieces = pieces + ["".join(pair) for pair in merges]
    vocab = {piece: i for i, piece in enumerate(SPECIALS + pieces)}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<pad>",
        eos_token="</s>",
        bos_token="<s>",
        clean_up_tokenization_spaces=False,
    )


@pytest.fixture(scope="module")
def pair():
    target_tokenizer, draft_tokenizer = tokenizer([], reverse=False), tokenizer(MERGES, reverse=True)
    target = enable_diversed(make_model("llama", num_layers=2, seed=0))
    draft = make_model("llama", hidden_size=32, num_layers=1, vocab_size=len(draft_tokenizer), seed=4)
    return target, draft, target_tokenizer, draft_tokenizer


def _generate(pair, input_ids, **kwargs):
    target, draft, target_tokenizer, draft_tokenizer = pair
    return target.generate(
        input_ids, assistant_model=draft, tokenizer=target_tokenizer, assistant_tokenizer=draft_tokenizer, **kwargs
    )


def _prompt(target_tokenizer, text: str = "abcdabefghij") -> torch.Tensor:
    return torch.tensor([target_tokenizer(text, add_special_tokens=False)["input_ids"]])


def test_translation_keeps_the_sequences_own_tokens():
    target_tokenizer = tokenizer([], reverse=False)
    tokens = target_tokenizer("abc", add_special_tokens=False)["input_ids"]
    assert translate_continuation(target_tokenizer, tokens, "de", 5) == target_tokenizer("de")["input_ids"]
    assert translate_continuation(target_tokenizer, tokens, "defgh", 2) == target_tokenizer("de")["input_ids"]
    merging = tokenizer(MERGES, reverse=False)  # "a" + "b" re-encodes as the merged "ab": the row drafts nothing
    assert translate_continuation(merging, merging("xa", add_special_tokens=False)["input_ids"], "b", 3) == []


def test_greedy_exact_verification_is_the_targets_greedy_output(pair):
    target, _, target_tokenizer, _ = pair
    input_ids = _prompt(target_tokenizer)
    expected = target.generate(input_ids, do_sample=False, max_new_tokens=16)
    out = _generate(
        pair,
        input_ids,
        verifier=ExactVerifier(),
        do_sample=False,
        max_new_tokens=16,
        num_assistant_tokens=3,
        return_dict_in_generate=True,
    )
    assert torch.equal(out.sequences, expected)
    assert int(out.speculation.num_drafted.sum()) > 0


def test_batches_equal_single_runs(pair):
    target, _, target_tokenizer, _ = pair
    texts = ["abcdabefghij", "Hello", "xyzXYZ012abcd"]
    rows = [_prompt(target_tokenizer, text)[0] for text in texts]
    width = max(row.numel() for row in rows)
    input_ids = torch.zeros(len(rows), width, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    for i, row in enumerate(rows):
        input_ids[i, width - row.numel() :], attention_mask[i, width - row.numel() :] = row, 1
    kwargs = dict(verifier=ExactVerifier(), do_sample=False, max_new_tokens=10, num_assistant_tokens=3)
    batch = _generate(pair, input_ids, attention_mask=attention_mask, **kwargs)
    for i, row in enumerate(rows):
        assert torch.equal(batch[i, -10:], _generate(pair, row[None], **kwargs)[0, -10:])


@pytest.mark.parametrize("weight", [1.0, 0.4])
def test_first_token_follows_the_declared_law(pair, weight):
    """``q_1`` is a point mass at the first target token of the draft's greedy text."""
    target, draft, target_tokenizer, draft_tokenizer = pair
    input_ids = _prompt(target_tokenizer)
    verifier = ExactVerifier() if weight == 1.0 else StaticEnsembleVerifier(weight)
    num_rows = 4000
    tokens = _generate(
        pair,
        input_ids.repeat(num_rows, 1),
        verifier=verifier,
        do_sample=True,
        max_new_tokens=3,
        num_assistant_tokens=2,
        generator=torch.Generator().manual_seed(0),
    )[:, input_ids.shape[1]]
    with torch.no_grad():
        p1 = target(input_ids).logits[0, -1].softmax(-1).double()
        draft_ids = torch.tensor([draft_tokenizer(target_tokenizer.decode(input_ids[0]))["input_ids"]])
        first = int(draft(draft_ids).logits[0, -1].argmax())
    q1 = torch.zeros(VOCAB_SIZE, dtype=torch.float64)
    q1[target_tokenizer(draft_tokenizer.decode([first]), add_special_tokens=False)["input_ids"][0]] = 1.0
    declared = weight * p1 + (1 - weight) * q1
    assert float(ops.total_variation(empirical(tokens, VOCAB_SIZE), declared)) < tv_bound(declared, num_rows)


def test_a_relaxed_verifier_accepts_at_least_as_many_drafts(pair):
    target, _, target_tokenizer, _ = pair
    input_ids = _prompt(target_tokenizer).repeat(32, 1)
    accepted = []
    for verifier in (ExactVerifier(), StaticEnsembleVerifier(0.5)):
        out = _generate(
            pair,
            input_ids,
            verifier=verifier,
            do_sample=True,
            max_new_tokens=12,
            num_assistant_tokens=3,
            generator=torch.Generator().manual_seed(1),
            return_dict_in_generate=True,
        )
        accepted.append(int(out.speculation.num_accepted.sum()))
    assert accepted[1] >= accepted[0] > 0


def test_heads_on_hidden_states_are_refused_and_features_only_heads_run(pair):
    target, draft, target_tokenizer, _ = pair
    input_ids = _prompt(target_tokenizer)
    with pytest.raises(ValueError, match="another tokenizer proposes target tokens without any"):
        _generate(pair, input_ids, diversed_head=DiversedHead.for_pair(target, target), max_new_tokens=4)
    # the error names the call that builds the head this pair needs, and that head runs
    from diversed_hf.drafting import TranslatedDraft

    call = "DiversedHead.for_pair(target, TranslatedDraft(assistant_model, tokenizer, assistant_tokenizer))"
    with pytest.raises(ValueError, match=re.escape(call)):
        _generate(pair, input_ids, diversed_head=DiversedHead.for_pair(target, draft), max_new_tokens=4)
    own = DiversedHead.for_pair(target, TranslatedDraft(draft, pair[2], pair[3]))
    assert own.config.draft_hidden_size == 0
    assert _generate(pair, input_ids, diversed_head=own, max_new_tokens=4).shape[1] > input_ids.shape[1]
    head = DiversedHead.for_pair(target, target, features=["tv", "draft_top1"], use_hidden_states=False)
    out = _generate(pair, input_ids, diversed_head=head, max_new_tokens=6, eos_token_id=EOS_TOKEN_ID)
    assert out.shape[1] > input_ids.shape[1]
