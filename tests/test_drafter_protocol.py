"""The drafter protocol (diversed_hf.drafting.protocol): every drafter declares what it can do once, everything else
reads the declaration, and a new drafter is one class and one registration."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from tiny_models import make_pair, prompt

from diversed_hf import ExactVerifier, StaticEnsembleVerifier, enable_diversed
from diversed_hf.drafting import protocol
from diversed_hf.drafting.dflash import DFlashDraft
from diversed_hf.drafting.drafters import EarlyExitDraft, PointMassCandidateGenerator, PromptLookup
from diversed_hf.drafting.eagle import EagleDraft
from diversed_hf.drafting.kv_sharing import KvSharingDraft
from diversed_hf.drafting.mtp import MtpDraft
from diversed_hf.drafting.protocol import DrafterCapabilities, capabilities_of, register_drafter
from diversed_hf.drafting.translated import TranslatedDraft

PACKAGE = Path(__file__).resolve().parents[1] / "diversed_hf"
CAPABILITY_NAMES = {field for field in DrafterCapabilities.__dataclass_fields__} | {
    "candidate_generator_class",
    "tree_unsupported",
    "target_features",
}
DRAFTER_CLASSES = {"PromptLookup", "TranslatedDraft", "DFlashDraft", "EagleDraft", "MtpDraft", "KvSharingDraft"}


def test_every_shipped_drafter_declares_what_it_can_do():
    assert capabilities_of(EagleDraft).reads_target_features and capabilities_of(EagleDraft).no_trees is None
    lookup = capabilities_of(PromptLookup(3))
    assert lookup.proposes_target_ids and lookup.drafts_fixed_length and lookup.no_trees is not None
    assert capabilities_of(TranslatedDraft).proposes_target_ids and capabilities_of(TranslatedDraft).candidate_generator
    assert capabilities_of(DFlashDraft).drafts_blocks and capabilities_of(DFlashDraft).reads_target_features
    assert capabilities_of(KvSharingDraft).reads_target_cache
    assert "MTP" in capabilities_of(MtpDraft).no_trees
    plain = DrafterCapabilities()
    assert capabilities_of(EarlyExitDraft) == plain and capabilities_of(None) == plain
    assert capabilities_of(make_pair()[1]) == plain  # any causal LM is a draft model
    assert set(protocol.registered_drafters()) >= {EagleDraft, PromptLookup, TranslatedDraft, DFlashDraft, MtpDraft}


def _probes_and_dispatch(path: Path) -> list[str]:
    """``getattr`` / ``hasattr`` of a drafter capability, and ``isinstance`` against a drafter class, in one module."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
            continue
        if node.func.id in ("getattr", "hasattr") and len(node.args) >= 2:
            name = node.args[1]
            if isinstance(name, ast.Constant) and name.value in CAPABILITY_NAMES:
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.func.id}(..., {name.value!r})")
        if node.func.id == "isinstance" and len(node.args) == 2:
            classes = node.args[1].elts if isinstance(node.args[1], ast.Tuple) else [node.args[1]]
            names = {c.id for c in classes if isinstance(c, ast.Name)} | {
                c.attr for c in classes if isinstance(c, ast.Attribute)
            }
            if names & DRAFTER_CLASSES:
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} isinstance(..., {sorted(names)})")
    return found


def test_no_module_probes_a_drafter_or_dispatches_on_its_class():
    """What a drafter can do is read from its registration, nowhere from its attributes or its class; only the
    factory (drafting/resolve.py) and the drafters' own modules name drafter classes."""
    allowed = {"drafting/protocol.py", "drafting/resolve.py"}
    found = [
        probe
        for path in sorted(PACKAGE.rglob("*.py"))
        if str(path.relative_to(PACKAGE)) not in allowed
        for probe in _probes_and_dispatch(path)
    ]
    assert not found, "capability probes or drafter dispatch outside the protocol:\n" + "\n".join(found)


class RepeatLast(torch.nn.Module):
    """A new drafter, defined here: it proposes each row's last token again, ``num_tokens`` times."""

    has_hidden_states = False

    def __init__(self, num_tokens: int):
        super().__init__()
        self.num_tokens = num_tokens

    def propose(self, rows: list[torch.Tensor], limits: list[int]) -> list[torch.Tensor]:
        return [row[-1:].repeat(limit) for row, limit in zip(rows, limits)]


register_drafter(
    RepeatLast, proposes_target_ids=True, drafts_fixed_length=True, candidate_generator=PointMassCandidateGenerator
)


@pytest.mark.parametrize("verifier", [ExactVerifier(), StaticEnsembleVerifier(0.5)], ids=["exact", "static"])
def test_a_new_drafter_is_one_class_and_one_registration(verifier):
    """Registered, the drafter runs in `generate` with any verifier; lossless, the output is the target's own."""
    target, _ = make_pair()
    enable_diversed(target)
    ids = prompt()
    plain = target.generate(ids, do_sample=False, max_new_tokens=12)
    out = target.generate(
        ids,
        assistant_model=RepeatLast(3),
        verifier=verifier,
        do_sample=False,
        max_new_tokens=12,
        return_dict_in_generate=True,
    )
    if isinstance(verifier, ExactVerifier):
        assert torch.equal(out.sequences, plain)
    summary = out.speculation.summary()
    assert summary["num_rounds"] >= 1 and summary["num_drafted"] > 0


def test_a_fixed_length_drafter_refuses_a_draft_length_by_name():
    target, _ = make_pair()
    enable_diversed(target)
    with pytest.raises(
        ValueError, match=r"`num_assistant_tokens=5` does not apply to RepeatLast, which drafts a fixed 3"
    ):
        target.generate(prompt(), assistant_model=RepeatLast(3), verifier=ExactVerifier(), num_assistant_tokens=5)


def test_the_trainers_rollouts_drive_the_same_point_mass_drafter():
    """The rollouts ask the drafter for its proposal as the loop's generator does (``propose``): a new drafter trains
    a head with no code of its own in the trainer; one without ``propose`` is refused by name."""
    from diversed_hf import DiversedHead
    from diversed_hf.training.rollout import sample_from_mixture

    target, _ = make_pair()
    drafter = RepeatLast(2)
    head = DiversedHead.for_pair(target, drafter, w_0=0.5)
    ids = prompt(6, batch=2)
    rollout = sample_from_mixture(target, drafter, head, ids, max_new_tokens=3)
    # the first token's draft probability is a point mass at the row's last token
    first = rollout.completion_ids[:, 0]
    assert torch.equal(rollout.draft_token_probs[:, 0], (first == ids[:, -1]).float())

    class NoProposal(torch.nn.Module):
        has_hidden_states = False

    register_drafter(NoProposal, proposes_target_ids=True, candidate_generator=PointMassCandidateGenerator)
    with pytest.raises(ValueError, match="`draft` is a NoProposal, which proposes the target's ids"):
        sample_from_mixture(target, NoProposal(), head, ids, max_new_tokens=2)
