"""A draft's tree travels with it (issue: the shipped tree that never loaded): the drafting knobs in a saved
draft's ``generation_config.json`` load back, from the shipped drafts, from ``EagleDraft.save_pretrained``, from
``train_eagle_draft.py`` and from files written before the fix, and ``generate`` with no knobs drafts that tree."""

import json
from importlib.resources import files

import pytest
from tiny_models import make_model, prompt
from transformers import GenerationConfig

from diversed_hf import EagleDraft, enable_diversed
from diversed_hf.verifiers import ExactVerifier

ASSETS = files("diversed_hf") / "testbed" / "assets" / "smollm2"
SHIPPED = sorted(path.name for path in ASSETS.iterdir() if (path / "config.json").is_file() and "eagle" in path.name)
TREE = {"num_assistant_tokens": 3, "assistant_tree_top_k": 2, "assistant_tree_size": 5}


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_draft_loads_the_drafting_knobs_its_file_holds(name):
    saved = json.loads((ASSETS / name / "generation_config.json").read_text())
    assert saved.get("_from_model_config") is not True  # transformers would drop the tree when loading it
    loaded = GenerationConfig.from_pretrained(ASSETS / name)
    knobs = ("num_assistant_tokens", "assistant_tree_top_k", "assistant_tree_size")
    assert {k: getattr(loaded, k, None) for k in knobs} == {k: saved.get(k) for k in knobs}


def test_the_default_real_draft_ships_a_tree():
    saved = json.loads((ASSETS / "eagle" / "generation_config.json").read_text())
    assert saved["assistant_tree_top_k"] > 1 and saved["assistant_tree_size"] > saved["num_assistant_tokens"]


def _nodes_per_round_without_knobs(target, draft) -> float:
    output = target.generate(
        prompt(6, batch=1, seed=4),
        assistant_model=draft,
        verifier=ExactVerifier(),
        do_sample=False,
        max_new_tokens=16,
        return_dict_in_generate=True,
    )
    assert output.speculation.tree_nodes is not None, "the draft's tree was not used"
    return float(output.speculation.nodes_per_round[0])


@pytest.fixture(scope="module")
def target():
    return enable_diversed(make_model("llama", seed=1))


def test_a_draft_saved_with_a_tree_generates_with_it_after_loading(target, tmp_path):
    draft = EagleDraft.for_target(target)
    for name, value in TREE.items():
        setattr(draft.generation_config, name, value)
    draft.save_pretrained(tmp_path / "draft")
    loaded = EagleDraft.from_pretrained(tmp_path / "draft", target=target)
    assert loaded.generation_config.assistant_tree_top_k == 2 and loaded.generation_config.assistant_tree_size == 5
    assert _nodes_per_round_without_knobs(target, loaded) > TREE["num_assistant_tokens"]
    # saved again from the loaded draft: still there
    loaded.save_pretrained(tmp_path / "again")
    assert GenerationConfig.from_pretrained(tmp_path / "again").assistant_tree_size == 5


def test_a_draft_saved_before_the_fix_still_loads_its_tree(target, tmp_path):
    """Files written with transformers' ``_from_model_config`` mark (every draft saved before) keep their tree."""
    draft = EagleDraft.for_target(target)
    draft.save_pretrained(tmp_path / "draft")
    file = tmp_path / "draft" / "generation_config.json"
    file.write_text(json.dumps({**json.loads(file.read_text()), "_from_model_config": True, **TREE}))
    assert getattr(GenerationConfig.from_pretrained(tmp_path / "draft"), "assistant_tree_top_k", None) is None
    loaded = EagleDraft.from_pretrained(tmp_path / "draft", target=target)
    assert loaded.generation_config.assistant_tree_top_k == 2
    assert _nodes_per_round_without_knobs(target, loaded) > TREE["num_assistant_tokens"]


def test_a_passed_chain_overrides_the_drafts_tree(target, tmp_path):
    draft = EagleDraft.for_target(target)
    for name, value in TREE.items():
        setattr(draft.generation_config, name, value)
    output = target.generate(
        prompt(6, batch=1, seed=4),
        assistant_model=draft,
        verifier=ExactVerifier(),
        do_sample=False,
        max_new_tokens=8,
        assistant_tree_top_k=1,
        return_dict_in_generate=True,
    )
    assert output.speculation.tree_nodes is None
